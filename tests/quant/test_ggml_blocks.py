"""tileops.quant.ggml_blocks: the GGML block formats of GGUF files.

The reference is gguf-py (``gguf.quants``, llama.cpp's own Python port of its block
formats, numpy): dequantization must equal it bit for bit on every type, on blocks from
``random_blocks`` and on raw random bytes; the 32-weight quantizers must write the bytes it
writes; a real llama.cpp-written GGUF file (when present) must dequantize the same.
"""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tileops.quant import ggml_blocks
from tileops.quant.ggml_blocks import GGML_TYPES, dequantize, ggml_type, quantize, random_blocks, row_bytes

gguf = pytest.importorskip("gguf")
gguf_quants = pytest.importorskip("gguf.quants")

MODEL = Path(__file__).resolve().parents[2] / ".models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

ALL = list(GGML_TYPES)
QUANTIZABLE = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]
BLOCK_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
# Byte offsets of each block's float16 fields (ggml-common.h).
HALF_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def _gguf_type(name: str):
    return gguf.GGMLQuantizationType[name]


def _reference(blocks: torch.Tensor, name: str) -> np.ndarray:
    """gguf-py's dequantization of ``blocks``, float32 (inf and nan scales allowed)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(gguf_quants.dequantize(blocks.numpy(), _gguf_type(name)), dtype=np.float32)


def _bits(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.numpy() if isinstance(x, torch.Tensor) else x).view(np.int32)


def _k(name: str, blocks: int) -> int:
    return GGML_TYPES[name].block_size * blocks


def _finite_bits(shape: tuple[int, ...], name: str, generator: torch.Generator) -> torch.Tensor:
    """Random bit patterns of float type ``name`` (F32, F16 or BF16) with every exponent but
    the all-ones one (inf, nan): normals over the whole range, subnormals, zeros, both
    signs; as bytes ``[*shape, size]``."""
    dtype, exponent, top = {
        "F32": (torch.float32, 0x7F800000, 0x40000000),
        "F16": (torch.float16, 0x7C00, 0x4000),
        "BF16": (torch.bfloat16, 0x7F80, 0x4000),
    }[name]
    wide = name == "F32"
    bits = torch.randint(-(1 << 31) if wide else 0, (1 << 31) - 1 if wide else 1 << 16, shape, generator=generator,
                         dtype=torch.int64)  # fmt: skip
    bits = torch.where((bits & exponent) == exponent, bits & ~top, bits)
    narrow = bits.to(torch.int32) if wide else bits.to(torch.int32).to(torch.int16)
    return narrow.view(dtype).unsqueeze(-1).view(torch.uint8)


def _raw_blocks(name: str, rows: int, nblocks: int, generator: torch.Generator, finite: bool) -> torch.Tensor:
    """Random bytes for ``rows`` rows of ``nblocks`` blocks; with ``finite``, every
    float field holds a finite value."""
    t = GGML_TYPES[name]
    raw = torch.randint(0, 256, (rows, nblocks, t.type_size), generator=generator, dtype=torch.uint8)
    if finite and name in HALF_FIELDS:
        for offset in HALF_FIELDS[name]:
            raw[..., offset : offset + 2] = _finite_bits((rows, nblocks), "F16", generator)
    elif finite:
        raw = _finite_bits((rows, nblocks), name, generator)
    return raw.reshape(rows, nblocks * t.type_size)


# ---- the type table ---------------------------------------------------------------------


def test_the_type_table_agrees_with_gguf_py_on_numbers_and_sizes():
    assert ALL == ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
    for name, t in GGML_TYPES.items():
        assert t.name == name
        assert t.gguf_id == int(_gguf_type(name))
        assert (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[_gguf_type(name)]
    assert {n: t.gguf_id for n, t in GGML_TYPES.items()} == {
        "F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
    }  # fmt: skip


def test_the_type_table_and_its_entries_are_read_only():
    with pytest.raises(TypeError):
        GGML_TYPES["Q2_K"] = GGML_TYPES["Q4_K"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        GGML_TYPES["Q4_0"].block_size = 64  # type: ignore[misc]


def test_a_type_is_found_by_name_in_any_case_by_gguf_number_or_as_itself():
    q4k = GGML_TYPES["Q4_K"]
    assert ggml_type("Q4_K") is q4k
    assert ggml_type("q4_k") is q4k
    assert ggml_type(12) is q4k
    assert ggml_type(gguf.GGMLQuantizationType.Q4_K) is q4k
    assert ggml_type(q4k) is q4k
    assert ggml_type(30).name == "BF16"
    # every function takes the type the same ways, by position or as ggml_type=
    assert row_bytes(ggml_type=12, k=256) == row_bytes("q4_k", 256) == row_bytes(q4k, 256) == 144


@pytest.mark.parametrize("bad", ["Q2_K", "IQ4_NL", "q4", 10, 39, -1, ggml_blocks.GgmlType("Q4_0", 2, 32, 19)])
def test_an_unsupported_type_is_refused_naming_every_supported_one(bad):
    with pytest.raises(ValueError, match="unsupported GGML type") as info:
        ggml_type(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name, t in GGML_TYPES.items():
        assert f"{name} ({t.gguf_id})" in message


@pytest.mark.parametrize("bad", [True, 2.0, None, b"Q4_0"])
def test_something_that_is_no_type_name_or_number_is_refused_as_a_type_error(bad):
    with pytest.raises(TypeError, match="a GGML type is a name, a GGUF type number or a GgmlType.*supported: F32"):
        ggml_type(bad)


def test_row_bytes_counts_whole_blocks():
    assert row_bytes("Q4_0", 4096) == 4096 // 32 * 18
    assert row_bytes("Q4_K", 4096) == 16 * 144
    assert row_bytes("Q6_K", 256) == 210
    assert row_bytes("F16", 7) == 14
    assert row_bytes(GGML_TYPES["Q8_0"], 0) == 0


def test_row_bytes_refuses_a_row_that_is_not_whole_blocks_naming_k_and_the_block():
    message = r"Q4_K row holds whole blocks of 256 weights; k=4000 is not a multiple of 256$"
    with pytest.raises(ValueError, match=message):
        row_bytes("Q4_K", 4000)
    with pytest.raises(ValueError, match=r"k must be an int >= 0, got -32"):
        row_bytes("Q4_0", -32)
    with pytest.raises(ValueError, match=r"k must be an int >= 0, got 32.0"):
        row_bytes("Q4_0", 32.0)


# ---- dequantize against gguf-py ---------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_dequantize_equals_gguf_py_bit_for_bit_on_random_blocks(name):
    g = torch.Generator().manual_seed(1234)
    for rows, nblocks, scale in (((3,), 1, 0.02), ((2, 5), 4, 0.02), ((7,), 3, 1.5), ((4,), 2, 1e-4)):
        k = _k(name, nblocks) if GGML_TYPES[name].block_size > 1 else 64 * nblocks
        blocks = random_blocks(name, rows, k, g, scale=scale)
        got = dequantize(blocks, name)
        assert got.dtype == torch.float32 and got.shape == (*rows, k)
        ref = _reference(blocks.reshape(-1, blocks.shape[-1]), name).reshape(*rows, k)
        np.testing.assert_array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("name", ALL)
def test_dequantize_equals_gguf_py_bit_for_bit_on_raw_bytes_with_finite_scales(name):
    # Every field at random: 6-bit scales and mins, high bits, int8 scales, and float16
    # scales over their whole finite range (subnormals, zeros, 65504, both signs).
    g = torch.Generator().manual_seed(99)
    blocks = _raw_blocks(name, 16, 8, g, finite=True)
    np.testing.assert_array_equal(_bits(dequantize(blocks, name)), _bits(_reference(blocks, name)))


@pytest.mark.parametrize("name", ALL)
def test_dequantize_propagates_inf_and_nan_scales_as_gguf_py_does(name):
    g = torch.Generator().manual_seed(7)
    blocks = _raw_blocks(name, 64, 4, g, finite=False)
    got, ref = dequantize(blocks, name).numpy(), _reference(blocks, name)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    same = ~np.isnan(ref)
    np.testing.assert_array_equal(got[same].view(np.int32), ref[same].view(np.int32))


def test_dequantize_reads_strided_rows_and_returns_a_new_tensor():
    g = torch.Generator().manual_seed(3)
    blocks = random_blocks("Q4_1", (6,), 64, g)
    strided = blocks[::2]
    assert not strided.is_contiguous()
    torch.testing.assert_close(dequantize(strided, "Q4_1"), dequantize(blocks, "Q4_1")[::2], rtol=0, atol=0)
    f32 = quantize(torch.ones(2, 4), "F32")
    out = dequantize(f32, "F32")
    out += 1
    assert dequantize(f32, "F32").eq(1).all()


def test_dequantize_of_no_rows_or_no_blocks_is_empty():
    assert dequantize(torch.empty(0, 144, dtype=torch.uint8), "Q4_K").shape == (0, 256)
    assert dequantize(torch.empty(3, 0, dtype=torch.uint8), "Q8_0").shape == (3, 0)


def test_the_formats_place_their_weights_as_ggml_common_h_says():
    # Hand-built blocks: scales 1 (or a 6-bit scale split across bytes), and quant
    # values that say where each weight comes from.
    q4_0 = torch.zeros(18, dtype=torch.uint8)
    q4_0[0:2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    q4_0[2] = 0x9 | (0xF << 4)  # weight 0 = 9 - 8, weight 16 = 15 - 8
    w = dequantize(q4_0, "Q4_0")
    assert w[0] == 1 and w[16] == 7 and w[1] == -8

    q4_k = torch.zeros(144, dtype=torch.uint8)
    q4_k[0:2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)  # d
    q4_k[2:4] = torch.tensor([0.5], dtype=torch.float16).view(torch.uint8)  # dmin
    # sub-block 5: scale 0b110011 = 51 (low nibble in byte 9, top bits in byte 1),
    #              min 0b100010 = 34 (high nibble in byte 9, top bits in byte 5)
    q4_k[4 + 9] = 0x3 | (0x2 << 4)
    q4_k[4 + 1] = 0b11 << 6
    q4_k[4 + 5] = 0b10 << 6
    q4_k[16 + 64 + 0] = 0x2 << 4  # sub-block 5 = high nibbles of bytes 64..95
    w = dequantize(q4_k, "Q4_K")
    assert w[160].item() == 51 * 2 - 0.5 * 34 and w[161].item() == -0.5 * 34
    # bytes 1 and 5 keep their own low 6 bits (scale 1, min 5): 0 here
    assert w[32:64].eq(0).all()

    q6_k = torch.zeros(210, dtype=torch.uint8)
    q6_k[208:210] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)  # d, at the end
    q6_k[192 + 13] = 3  # scale of weights 208..223
    q6_k[64 + 16] = 0x5 << 4  # weight 208 = 128 + 64 + 16: high nibble of the second half's ql[16]
    q6_k[128 + 32 + 16] = 0b10 << 4  # and bits 4-5 of its qh[16]
    w = dequantize(q6_k, "Q6_K")
    assert w[208].item() == 3 * ((0x5 | (0b10 << 4)) - 32)


# ---- quantize ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_quantize_writes_the_bytes_gguf_py_writes_and_they_dequantize_alike(name):
    g = torch.Generator().manual_seed(5)
    weights = [
        torch.randn(8, 256, generator=g) * 0.02,
        torch.randn(3, 2, 64, generator=g) * 10,
        torch.zeros(2, 32),  # d = 0
        torch.tensor([[127.0, 2.5, -3.5, 0.49999997, -0.5, 1.5] + [0.0] * 26]),  # roundf's halves
        torch.tensor([[-1.0, 1.0] + [0.25] * 30, [1.0, -1.0] + [0.25] * 30]),  # ties in magnitude
        torch.full((1, 32), 3.0),  # one value: max == min
    ]
    for w in weights:
        got = quantize(w, name)
        ref = np.asarray(gguf_quants.quantize(w.numpy(), _gguf_type(name)))
        np.testing.assert_array_equal(got.numpy(), ref.view(np.uint8).reshape(got.shape))
        back = dequantize(got, name).numpy()
        np.testing.assert_array_equal(back, gguf_quants.dequantize(ref, _gguf_type(name)).reshape(back.shape))


def test_quantize_follows_the_reference_rules_on_hand_made_blocks():
    # Q8_0 rounds halves away from zero, as C's roundf.
    q = quantize(torch.tensor([[127.0, 2.5, -3.5, 0.5] + [0.0] * 28]), "Q8_0")
    assert q[0, 2:6].view(torch.int8).tolist() == [127, 3, -4, 1]
    # Q4_0: the first weight of largest magnitude maps to -8 (d = max / -8), with its sign.
    q = quantize(torch.tensor([[-1.0, 1.0] + [0.0] * 30]), "Q4_0")
    assert q[0, 0:2].view(torch.float16).item() == 0.125
    assert [q[0, 2].item() & 0xF, q[0, 3].item() & 0xF] == [0, 15]  # -1 -> 0, +1 -> 16 capped at 15
    # Q4_1: d = (max - min) / 15, m = min.
    q = quantize(torch.arange(32.0).reshape(1, 32) - 1, "Q4_1")
    assert q[0, 0:4].view(torch.float16).tolist() == [torch.tensor(31 / 15).half().item(), -1.0]


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_a_round_trip_stays_within_the_formats_error_bound(name):
    # Half a step, plus what rounding the scales to float16 moves (a relative 2^-11 of
    # the scale times the largest code, and of Q4_1's min). Q4_0's codes run -8..7 with
    # -8 for the weight of largest magnitude: a weight of the other sign beyond 7.5 steps
    # is clipped to 7 steps.
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(64, 512, generator=g) * 0.02).reshape(64, 16, 32)
    back = dequantize(quantize(w.reshape(64, 512), name), name).reshape(64, 16, 32)
    err = (back - w).abs()
    if name == "Q8_0":
        step, codes, offset = w.abs().amax(-1, keepdim=True) / 127, 127, 0
    elif name == "Q4_0":
        step, codes, offset = w.abs().amax(-1, keepdim=True) / 8, 8, 0
    else:
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        step, codes, offset = (hi - lo) / 15, 15, lo.abs() * 2**-11
    half = step / 2 if name != "Q4_0" else torch.maximum(step / 2, w.abs() - 7 * step)
    bound = half + codes * step * 2**-11 + offset
    assert (err <= bound * (1 + 1e-4)).all()
    assert (err > step / 4).any()  # the bound is not vacuous


def test_quantize_takes_any_float_dtype_as_float32_first():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, 64, generator=g, dtype=torch.float64)
    assert torch.equal(quantize(w, "Q4_0"), quantize(w.float(), "Q4_0"))
    assert torch.equal(quantize(w.bfloat16(), "Q8_0"), quantize(w.bfloat16().float(), "Q8_0"))


# ---- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "name", "error", "message"),
    [
        (torch.zeros(2, 36, dtype=torch.int8), "Q4_0", ValueError, r"Q4_0 blocks must be a uint8 tensor.*torch.int8"),
        (torch.zeros(2, 36), "Q4_0", ValueError, r"must be a uint8 tensor of raw bytes, got torch.float32"),
        (torch.zeros(2, 35, dtype=torch.uint8), "Q4_0", ValueError,
         r"a Q4_0 row is whole blocks of 18 bytes \(32 weights each\); the last dimension, 35 bytes, "
         r"is not a multiple of 18"),
        (torch.zeros(4, 210, dtype=torch.uint8), "Q4_K", ValueError, r"210 bytes, is not a multiple of 144"),
        (torch.tensor(3, dtype=torch.uint8), "Q8_0", ValueError, r"got a 0-dim tensor"),
        (np.zeros((2, 18), dtype=np.uint8), "Q4_0", TypeError, r"blocks must be a torch.Tensor, got ndarray"),
        (torch.zeros(2, 18, dtype=torch.uint8), "Q2_K", ValueError, r"unsupported GGML type 'Q2_K'; supported: F32"),
    ],
)  # fmt: skip
def test_dequantize_refuses_bad_input_saying_what_is_wrong(blocks, name, error, message):
    with pytest.raises(error, match=message):
        dequantize(blocks, name)


@pytest.mark.parametrize(
    ("weights", "name", "error", "message"),
    [
        (torch.zeros(2, 256), "Q4_K", ValueError,
         r"quantize: Q4_K is not supported .*supports F32, F16, BF16, Q8_0, Q4_0, Q4_1; use random_blocks"),
        (torch.zeros(2, 48), "Q4_0", ValueError,
         r"Q4_0 row holds whole blocks of 32 weights; k=48 \(the last dimension\) is not a multiple of 32"),
        (torch.zeros(2, 32, dtype=torch.int32), "Q8_0", ValueError, r"floating-point tensor, got torch.int32"),
        (torch.tensor([float("nan")] + [0.0] * 31), "Q4_1", ValueError, r"Q4_1 needs finite weights"),
        (torch.tensor([float("inf")] + [0.0] * 31), "Q8_0", ValueError, r"Q8_0 needs finite weights"),
        (torch.tensor(1.0), "Q8_0", ValueError, r"got a 0-dim tensor"),
        ([0.0] * 32, "Q8_0", TypeError, r"weights must be a torch.Tensor, got list"),
    ],
)  # fmt: skip
def test_quantize_refuses_bad_input_saying_what_is_wrong(weights, name, error, message):
    with pytest.raises(error, match=message):
        quantize(weights, name)


# ---- random blocks ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_random_blocks_are_valid_repeatable_and_about_the_requested_magnitude(name):
    t = GGML_TYPES[name]
    k = _k(name, 4) if t.block_size > 1 else 1024
    for scale in (0.02, 1.0):
        blocks = random_blocks(name, (32,), k, torch.Generator().manual_seed(0), scale=scale)
        assert blocks.dtype == torch.uint8 and blocks.shape == (32, row_bytes(name, k))
        assert torch.equal(blocks, random_blocks(name, (32,), k, torch.Generator().manual_seed(0), scale=scale))
        w = dequantize(blocks, name)
        assert torch.isfinite(w).all()
        assert 0.7 * scale < w.std().item() < 1.4 * scale
        assert abs(w.mean().item()) < 0.1 * scale
    other = random_blocks(name, (32,), k, torch.Generator().manual_seed(1))
    assert not torch.equal(other, random_blocks(name, (32,), k, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_random_k_quant_blocks_exercise_every_field_over_its_whole_range(name):
    blocks = random_blocks(name, (64,), 1024, torch.Generator().manual_seed(4)).reshape(-1, GGML_TYPES[name].type_size)
    for offset in HALF_FIELDS[name]:
        halves = blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()
        assert torch.isfinite(halves).all() and (halves > 0).all()
    if name == "Q6_K":
        scales = blocks[:, 192:208].contiguous().view(torch.int8)
        assert scales.min() < -120 and scales.max() > 120
    else:
        scales, mins = ggml_blocks._k4_scales_mins(blocks[:, 4:16])
        for field in (scales, mins):
            assert set(field.unique().tolist()) == set(range(64))


def test_random_blocks_follow_the_generator_device_and_shape_rows():
    g = torch.Generator().manual_seed(0)
    blocks = random_blocks("Q6_K", (2, 3), 512, g)
    assert blocks.shape == (2, 3, 420) and blocks.device == torch.device("cpu")
    assert random_blocks("Q4_0", (0,), 64, g).shape == (0, 36)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("Q4_K", (2,), 100), ValueError, r"Q4_K row holds whole blocks of 256 weights; k=100"),
        (("Q4_K", [2], 256), TypeError, r"shape_rows must be a tuple of ints, got list"),
        (("Q4_K", (-1,), 256), ValueError, r"shape_rows entries must be an int >= 0, got -1"),
        (("Q4_K", (2,), 256, None), TypeError, r"generator must be a torch.Generator, got NoneType"),
        (("Q4_K", (2,), 256, "gen", 0.0), ValueError, r"scale must be a finite number > 0, got 0.0"),
        (("Q4_K", (2,), 256, "gen", float("inf")), ValueError, r"scale must be a finite number > 0, got inf"),
        (("Q6_K", (2,), 256, "gen", 1e9), ValueError, r"scale=1000000000.0 is too large for Q6_K's float16"),
        (("Q2_K", (2,), 256), ValueError, r"unsupported GGML type 'Q2_K'"),
    ],
)  # fmt: skip
def test_random_blocks_refuse_bad_arguments_saying_what_is_wrong(args, error, message):
    name, rows, k, *rest = args
    generator = rest[0] if rest else "gen"
    generator = torch.Generator() if generator == "gen" else generator
    with pytest.raises(error, match=message):
        random_blocks(name, rows, k, generator, *rest[1:])


# ---- the module as a whole --------------------------------------------------------------


def test_the_docstring_examples_run():
    result = doctest.testmod(ggml_blocks, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 4 and result.failed == 0


def test_importing_tileops_leaves_the_quant_package_unimported():
    code = (
        "import sys, tileops\n"
        "assert 'tileops.quant' not in sys.modules, 'import tileops imported tileops.quant'\n"
        "import tileops.quant.ggml_blocks\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr


# ---- a real GGUF file -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_tensors():
    if not MODEL.exists():
        pytest.skip(f"{MODEL} is not here (make model unpacks it)")
    reader = gguf.GGUFReader(MODEL)
    return {t.name: t for t in reader.tensors}


@pytest.mark.parametrize(
    "tensor", ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.3.ffn_down.weight", "token_embd.weight",
               "blk.0.attn_norm.weight"],
)  # fmt: skip
def test_a_real_gguf_files_tensors_dequantize_as_gguf_py_dequantizes_them(model_tensors, tensor):
    t = model_tensors[tensor]
    data = np.asarray(t.data)[:4096]  # token_embd (Q8_0, 49152 rows): its first rows suffice
    name = t.tensor_type.name
    assert name in {"Q4_1", "Q8_0", "F32"}
    blocks = torch.from_numpy(np.array(data, copy=True).view(np.uint8))  # the reader's arrays are read-only
    got = dequantize(blocks, name)
    ref = np.asarray(gguf_quants.dequantize(data, t.tensor_type), dtype=np.float32)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "blk.5.ffn_gate.weight", "token_embd.weight"])
def test_requantizing_a_real_files_weights_gives_back_the_bytes_llama_cpp_wrote(model_tensors, tensor):
    t = model_tensors[tensor]
    data = np.array(np.asarray(t.data)[:2048], copy=True)
    blocks = torch.from_numpy(data)
    name = t.tensor_type.name
    assert torch.equal(quantize(dequantize(blocks, name), name), blocks)
