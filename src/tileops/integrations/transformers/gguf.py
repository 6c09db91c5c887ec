"""GGUF checkpoints with their weights kept in GGML blocks.

transformers' own GGUF loader dequantizes every tensor on the CPU. ``load_gguf`` builds the
same model (transformers' config, architecture and tensor names), but each quantized
matrix stays in its blocks: a Linear becomes a ``GgufLinear`` and the token embedding a
``GgufEmbedding``, holding the file's bytes (``weight_blocks``, uint8 ``[rows, row bytes]``)
and their ``ggml_type``. Unquantized tensors (norms, biases) load as transformers loads
them. ``enable`` serves the two with ``GemmGgufFwdOp`` and ``EmbeddingGgufFwdOp``; without
it their forwards dequantize in torch (slowly, but with the same values).

What is refused is named: an architecture whose GGUF tensors transformers reshapes beyond
reordering rows (its loader's tensor processors for MoE experts and the like), a quantized
tensor that is not a Linear's weight or the token embedding.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tileops.quant import ggml_blocks

__all__ = ["GgufEmbedding", "GgufLinear", "load_gguf"]

_DENSE = {"F32", "F16", "BF16"}


class GgufLinear(nn.Module):
    """A Linear whose weight stays in GGML blocks: ``weight_blocks`` uint8
    ``[out_features, row bytes]`` of ``ggml_type``."""

    def __init__(
        self, weight_blocks: torch.Tensor, ggml_type: str, in_features: int, bias: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        t = ggml_blocks.ggml_type(ggml_type)
        if weight_blocks.dtype != torch.uint8 or weight_blocks.shape[-1] != ggml_blocks.row_bytes(t, in_features):
            raise ValueError(
                f"GgufLinear: expected uint8 rows of {ggml_blocks.row_bytes(t, in_features)} bytes "
                f"({in_features} {t.name} weights), got {weight_blocks.dtype} {tuple(weight_blocks.shape)}"
            )
        self.ggml_type, self.in_features, self.out_features = t.name, in_features, weight_blocks.shape[0]
        self.register_buffer("weight_blocks", weight_blocks)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def quantized(cls, linear: nn.Linear, ggml_type: str) -> GgufLinear:
        """``linear``'s weight quantized to ``ggml_type`` blocks (Q8_0, Q4_0, Q4_1:
        ``ggml_blocks.quantize``), its bias kept."""
        with torch.no_grad():
            blocks = ggml_blocks.quantize(linear.weight.detach(), ggml_type)
            bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(blocks, ggml_type, linear.in_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = ggml_blocks.dequantize(self.weight_blocks, self.ggml_type).to(x.dtype)
        return F.linear(x, w, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, ggml_type={self.ggml_type}"


class GgufEmbedding(nn.Module):
    """A token embedding whose table stays in GGML blocks; rows come out in ``dtype``."""

    def __init__(
        self, weight_blocks: torch.Tensor, ggml_type: str, dtype: torch.dtype, padding_idx: int | None = None
    ) -> None:
        super().__init__()
        t = ggml_blocks.ggml_type(ggml_type)
        self.ggml_type, self.dtype, self.padding_idx = t.name, dtype, padding_idx
        self.num_embeddings = weight_blocks.shape[0]
        self.embedding_dim = weight_blocks.shape[1] // t.type_size * t.block_size
        self.register_buffer("weight_blocks", weight_blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = ggml_blocks.dequantize(self.weight_blocks[ids.reshape(-1).long()], self.ggml_type).to(self.dtype)
        return rows.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, ggml_type={self.ggml_type}"


def load_gguf(
    folder: str | os.PathLike, gguf_file: str, *, dtype: torch.dtype = torch.bfloat16, **config_kwargs: Any
) -> nn.Module:
    """The causal LM of ``folder/gguf_file`` with its quantized matrices kept in their GGML
    blocks (``GgufLinear``, ``GgufEmbedding``), everything else in ``dtype``; eval mode."""
    try:
        import gguf  # noqa: PLC0415 - tileops[gguf]
    except ImportError as error:
        raise ImportError("load_gguf reads GGUF files with the gguf package: pip install 'tileops[gguf]'") from error
    import transformers  # noqa: PLC0415
    from transformers import modeling_gguf_pytorch_utils as hf_gguf  # noqa: PLC0415

    path = os.path.join(folder, gguf_file)
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=gguf_file, **config_kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    reader = gguf.GGUFReader(path)
    architecture = _field(reader, "general.architecture")
    processor_class = hf_gguf.TENSOR_PROCESSORS.get(architecture, hf_gguf.TensorProcessor)
    if processor_class not in (hf_gguf.TensorProcessor, hf_gguf.LlamaTensorProcessor):
        raise NotImplementedError(
            f"tileops keeps GGUF weights in their blocks for files whose tensors transformers only renames or whose "
            f"rows it reorders; {architecture!r} files are reshaped ({processor_class.__name__}): load them with "
            "transformers (dequantized), or dequantize=True"
        )
    processor = processor_class(config=config.to_dict())
    names = hf_gguf.get_gguf_hf_weights_map(model, processor)
    modules = dict(model.named_modules())
    blocks: dict[str, tuple[torch.Tensor, str]] = {}  # hf weight name -> (rows of blocks, type)
    dense: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        kind = ggml_blocks.ggml_type(int(tensor.tensor_type)).name
        rows = processor.process(weights=tensor.data, name=tensor.name, tensor_key_mapping=names).weights
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        data = torch.from_numpy(rows.copy())
        if kind in _DENSE:
            dense[hf_name] = data.view(-1) if data.dtype == torch.uint8 and kind == "F32" else data
        else:
            blocks[hf_name] = (data.view(torch.uint8).reshape(data.shape[0], -1), kind)
    _place_blocks(model, modules, blocks, dtype)
    _place_dense(model, dense, dtype)
    _materialise_the_rest(model)
    return model.eval()


def _field(reader: Any, key: str) -> Any:
    field = reader.fields[key]
    value = field.parts[field.data[0]]
    return bytes(value).decode() if value.dtype == "uint8" else value.tolist()


def _place_blocks(model: nn.Module, modules: dict[str, nn.Module], blocks: dict, dtype: torch.dtype) -> None:
    """Each quantized matrix into a GgufLinear or GgufEmbedding in its module's place; a
    head tied to the embedding shares its blocks."""
    embed = model.get_input_embeddings()
    embed_name = next(n for n, m in modules.items() if m is embed)
    for hf_name, (rows, kind) in blocks.items():
        owner_name = hf_name.removesuffix(".weight")
        owner = modules.get(owner_name)
        if owner is embed:
            new: nn.Module = GgufEmbedding(rows, kind, dtype, getattr(embed, "padding_idx", None))
        elif isinstance(owner, nn.Linear):
            new = GgufLinear(rows, kind, owner.in_features)
        else:
            raise NotImplementedError(
                f"{hf_name}: a {kind} tensor of a {type(owner).__name__}, not of a Linear or the "
                "token embedding: tileops does not keep it in blocks"
            )
        model.set_submodule(owner_name, new)
    head = model.get_output_embeddings()
    tied = getattr(model.config, "tie_word_embeddings", False) and f"{embed_name}.weight" in blocks
    if tied and isinstance(head, nn.Linear):
        rows, kind = blocks[f"{embed_name}.weight"]
        model.set_submodule(next(n for n, m in modules.items() if m is head), GgufLinear(rows, kind, head.in_features))


def _place_dense(model: nn.Module, dense: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    for hf_name, data in dense.items():
        owner_name, _, attr = hf_name.rpartition(".")
        owner = model.get_submodule(owner_name)
        old = getattr(owner, attr)
        value = data.to(dtype).reshape(old.shape)
        setattr(owner, attr, nn.Parameter(value, requires_grad=False) if isinstance(old, nn.Parameter) else value)


def _materialise_the_rest(model: nn.Module, source: str = "the GGUF file") -> None:
    """Buffers computed from the config (rotary frequencies) are made again on the CPU; any
    other tensor still on the meta device is a tensor the file did not hold."""
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding") and hasattr(module, "config"):
            model.set_submodule(name, type(module)(config=module.config))
    missing = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if missing:
        raise ValueError(f"{source} holds no tensor for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
