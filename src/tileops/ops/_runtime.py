"""What the C++ call path needs from torch, handed over once, and the inverse tables
that turn memo keys back into torch objects for introspection.

Keys name a device by (type word, index) and a dtype by one word. For tensors torch
exports through DLPack the words are DLPack's; the attribute reader below produces the
same words for the same tensor, so both readers agree on every key.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _C

# DLPack (code, bits, lanes) for the dtypes DLPack names; packed as in dlpack_view.h.
_DLPACK_DTYPES: dict[torch.dtype, tuple[int, int, int]] = {
    torch.bool: (6, 8, 1),
    torch.uint8: (1, 8, 1),
    torch.int8: (0, 8, 1),
    torch.int16: (0, 16, 1),
    torch.int32: (0, 32, 1),
    torch.int64: (0, 64, 1),
    torch.float16: (2, 16, 1),
    torch.bfloat16: (4, 16, 1),
    torch.float32: (2, 32, 1),
    torch.float64: (2, 64, 1),
    torch.complex64: (5, 64, 1),
    torch.complex128: (5, 128, 1),
}
_DLPACK_DEVICES = {"cpu": 1, "cuda": 2}
_CPU_INDEX = -1  # torch.device("cpu") has no index

_dtype_words: dict[torch.dtype, int] = {
    dtype: (code << 24) | (bits << 16) | lanes for dtype, (code, bits, lanes) in _DLPACK_DTYPES.items()
}
_device_words: dict[str, int] = dict(_DLPACK_DEVICES)


def _intern(table: dict, key, base: int) -> int:
    word = table.get(key)
    if word is None:
        word = table[key] = base + len(table)
    return word


def dtype_word(dtype: torch.dtype) -> int:
    return _intern(_dtype_words, dtype, 1 << 40)


def device_words(device: torch.device) -> tuple[int, int]:
    type_word = _intern(_device_words, device.type, 1000)
    if device.type == "cpu" or device.index is None:
        return type_word, _CPU_INDEX
    return type_word, device.index


def describe(tensor: torch.Tensor) -> tuple[int, int, int, tuple[int, ...], bool]:
    """The attribute reader: what the C++ path reads through DLPack when it can."""
    type_word, index = device_words(tensor.device)
    return type_word, index, dtype_word(tensor.dtype), tuple(tensor.shape), tensor.is_contiguous()


def decode_device(type_word: int, index: int) -> torch.device:
    for name, word in _device_words.items():
        if word == type_word:
            return torch.device(name) if index == _CPU_INDEX else torch.device(name, index)
    raise LookupError(f"unknown device word {type_word}")


def decode_dtype(word: int) -> torch.dtype:
    for dtype, known in _dtype_words.items():
        if known == word:
            return dtype
    raise LookupError(f"unknown dtype word {word}")


def host_values(tensor: torch.Tensor) -> tuple[Any, int, int, bool, tuple[int, ...], tuple[int, ...]]:
    """The value rules' slow reader: a host copy of a tensor the C++ path cannot read in
    place (another device); a data pointer of 0 for a tensor without values (meta)."""
    if tensor.is_meta:
        return None, 0, 0, False, tuple(tensor.shape), ()
    host = tensor.detach().to("cpu").contiguous()
    is_int = not host.dtype.is_floating_point and not host.dtype.is_complex and host.dtype != torch.bool
    return host, host.data_ptr(), host.dtype.itemsize * 8, is_int, tuple(host.shape), ()


USES_DLPACK_EXCHANGE: bool = _C.init_torch_facts(
    torch.Tensor,
    torch.nn.Parameter,
    getattr(torch.Tensor, "__dlpack_c_exchange_api__", None),
    describe,
    torch._C._is_torch_function_mode_enabled,
    torch._C._len_torch_dispatch_stack,
)
_C.set_host_values_reader(host_values)
