"""``generate``'s greedy search with its decode steps run token after token from C++.

A replayed decode step (``decode/replay.py``) still has Python around it each token:
transformers' generate loop (inputs, logits processing, argmax, stopping criteria) and
the integration's forward, on caches that the step's weights flushed: a share of each
step that no trimming of it removed (``benchmarks/hf_profile.py`` measures it).

So an enabled plain causal LM whose decode step replays (``planning/enable.py``) gets a
``generate`` of its own: transformers' ``generate`` with ``greedy_search`` below as its
decoding method (transformers' ``custom_generate=`` hook). Everything before that method
stays transformers': the generation config, the logits processors and stopping criteria
it makes, the inputs, masks and cache. ``greedy_search`` serves the greedy searches whose
every step it does exactly as transformers would:

- greedy decoding (``do_sample`` off, one beam), no logits processor, stopping by
  ``max_length`` and end-of-sequence ids only, no streamer; with
  ``return_dict_in_generate``, each step's logits and scores (``output_logits``,
  ``output_scores``: with no processor they are the same float32 tensors, as in
  transformers' loop) and the cache, but no attentions or hidden states;
- it prefills and runs the first decode steps through the model as transformers does
  (``_prefill``, ``prepare_inputs_for_generation``), one of which captures the step with
  the LM head as a graph of op launches (``decode/replay.py``; the first decode step of a new
  shape builds its kernels, so the next one captures), then hands the remaining steps to
  the op layer's ``tileops.capture.decode_greedy``: each sequence's next token is the
  first largest logit (``torch.argmax``'s pick), a finished sequence gets the pad token,
  an end-of-sequence token finishes its sequence.

The tokens are transformers' greedy tokens: the same kernels on the same values as the
step it replays, and the same pick. Anything else goes to transformers' own decoding
method for the mode, with the same arguments, or, where transformers would not call a
method of the model (a mode moved to the Hub), to transformers' ``generate`` without the
hook. ``type(model).generate(model, ...)`` is transformers' loop over replayed steps.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import (
    GENERATION_MODES_MAPPING,
    GenerateDecoderOnlyOutput,
    GenerationMode,
)

from tileops.capture import decode_greedy

from ..cache import TileopsCache
from ..compat import cache_field

__all__ = ["generate_like", "greedy_search"]

# model_kwargs that generate prepares for a plain causal LM's text prompt (transformers <
# 5.24 names the cache past_key_values)
_KNOWN_KWARGS = {
    "attention_mask",
    "position_ids",
    "cache",
    "past_key_values",
    "use_cache",
    "logits_to_keep",
    "cache_position",
}
# generate's arguments after which the loop is not ours to run
# (transformers hands a custom_generate callable none of these: its decoding method reads them)
_NOT_OURS = ("custom_generate", "streamer", "assistant_model", "synced_gpus", "tokenizer", "assistant_tokenizer")
_CACHE_FIELD = cache_field(GenerateDecoderOnlyOutput)


class _Elsewhere(Exception):
    """greedy_search cannot serve the call and transformers has no method of the model for
    its mode: generate runs again without the hook."""


def generate_like(cls_generate: Any) -> Any:
    """The model's ``generate`` with ``greedy_search`` as its decoding method where a call
    leaves the decoding loop to transformers; transformers' ``generate`` otherwise."""

    @functools.wraps(cls_generate)
    def generate(self: nn.Module, *args: Any, **kwargs: Any):
        if len(args) > 1 or any(kwargs.get(k) is not None for k in _NOT_OURS):
            return cls_generate(self, *args, **kwargs)
        try:
            return cls_generate(self, *args, custom_generate=greedy_search, **kwargs)
        except _Elsewhere:
            return cls_generate(self, *args, **kwargs)

    return generate


def greedy_search(
    model: nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    **model_kwargs: Any,
):
    """A decoding method for transformers' ``generate`` (its ``_sample``'s arguments)."""
    why = _not_served(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
    if why is not None:
        mode = generation_config.get_generation_mode()
        method = getattr(type(model), GENERATION_MODES_MAPPING.get(mode, "/"), None)
        if method is None:
            raise _Elsewhere(why)
        return method(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )
    return _greedy(model, input_ids, stopping_criteria, generation_config, model_kwargs)


def _not_served(
    model: nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    model_kwargs: dict,
) -> str | None:
    """Why greedy_search hands the call to transformers, or None where it serves it."""
    if generation_config.get_generation_mode() != GenerationMode.GREEDY_SEARCH:
        return "not a greedy search"
    if len(logits_processor):
        return "logits processors"
    if any(type(c) not in (MaxLengthCriteria, EosTokenCriteria) for c in stopping_criteria):
        return "stopping criteria other than max_length and end-of-sequence ids"
    if not any(type(c) is MaxLengthCriteria for c in stopping_criteria):
        return "no max_length"
    if (
        getattr(generation_config, "is_assistant", False)
        or getattr(generation_config, "prefill_chunk_size", None) is not None
    ):
        return "an assistant's search or chunked prefill"
    if generation_config.return_dict_in_generate and (
        generation_config.output_attentions or generation_config.output_hidden_states
    ):
        return "attentions or hidden states per step"
    if any(k not in _KNOWN_KWARGS for k in model_kwargs) or model_kwargs.get("use_cache") is False:
        return "model inputs other than a text prompt's, or no cache"
    if input_ids.device.type != "cpu" or input_ids.ndim != 2:
        return "not a CPU batch of token ids"
    if not _loop_helpers_known(type(model)):
        return "a transformers whose generate helpers _greedy does not know"
    if any(type(c) is EosTokenCriteria for c in stopping_criteria) and generation_config._pad_token_tensor is None:
        return "end-of-sequence ids without a pad token"
    boundary = _cache_recomputed_at(model)
    if boundary is not None and max(c.max_length for c in stopping_criteria if type(c) is MaxLengthCriteria) > boundary:
        return (
            f"a generation past original_max_position_embeddings={boundary}, where "
            f"{type(model).__name__}.prepare_inputs_for_generation recomputes the cache"
        )
    embed = model.get_input_embeddings()
    plain = type(embed) is nn.Embedding or model._tileops.fused.step_embeds
    if not plain or embed._forward_hooks or embed._forward_pre_hooks:
        return "an input embedding other than a plain nn.Embedding or a served GgufEmbedding"
    if model._tileops.head.out_features > embed.num_embeddings:
        return "more logits than embedding rows"
    fused = model._tileops.fused
    if input_ids.shape[0] in fused.replay.refused:
        return f"decode steps not replayed at batch {input_ids.shape[0]}: {fused.replay.refused[input_ids.shape[0]]}"
    return None


def _cache_recomputed_at(model: nn.Module) -> int | None:
    """The sequence length past which the model's own prepare_inputs_for_generation drops
    its cache to recompute the prompt (Phi-3's, switching LongRoPE's factors there), or
    None: a loop in C++ would go on with the cache."""
    from transformers.generation.utils import GenerationMixin  # noqa: PLC0415

    boundary = getattr(model.config, "original_max_position_embeddings", None)
    overridden = type(model).prepare_inputs_for_generation is not GenerationMixin.prepare_inputs_for_generation
    return int(boundary) if overridden and boundary is not None else None


@functools.cache
def _loop_helpers_known(cls: type) -> bool:
    """Whether ``cls`` has the helpers of transformers' ``_sample`` that ``_greedy`` calls,
    with the arguments it passes (transformers 5.24's)."""

    def takes(name: str, *params: str) -> bool:
        fn = getattr(cls, name, None)
        if fn is None:
            return False
        signature = inspect.signature(fn).parameters
        passes_on = any(p.kind is p.VAR_KEYWORD for p in signature.values())  # an override handing them on (Phi-3's)
        return all(p in signature or passes_on for p in params)

    return (
        takes("_prefill", "input_ids", "generation_config", "model_kwargs", "is_first_iteration")
        and takes("prepare_inputs_for_generation", "next_sequence_length")
        and takes("_update_model_kwargs_for_generation", "outputs", "model_kwargs", "is_encoder_decoder")
    )


def _greedy(
    model: nn.Module, input_ids: torch.Tensor, stopping_criteria: Any, generation_config: Any, model_kwargs: dict
) -> Any:
    """transformers' greedy search (``_sample`` with do_sample off), its decode steps after
    the first replayed from C++."""
    max_length = next(c.max_length for c in stopping_criteria if type(c) is MaxLengthCriteria)
    eos = sorted({int(i) for c in stopping_criteria if type(c) is EosTokenCriteria for i in c.eos_token_id.flatten()})
    pad = int(generation_config._pad_token_tensor) if eos else -1
    keep = generation_config.return_dict_in_generate and (
        generation_config.output_logits or generation_config.output_scores
    )
    kept: list[torch.Tensor] = []  # each step's float32 logits [B, V], where they are asked for
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.long)
    st = model._tileops
    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)
    reserved = False
    while True:
        model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)
        logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
        del outputs
        if keep:
            kept.append(logits)
        last = logits.argmax(dim=-1)
        if eos:
            last = last * unfinished + pad * (1 - unfinished)
        input_ids = torch.cat([input_ids, last[:, None]], dim=-1)
        unfinished = unfinished & ~stopping_criteria(input_ids, None)
        if unfinished.max() == 0:
            return _result(input_ids, kept, generation_config, model_kwargs)
        cache = next((v for v in model_kwargs.values() if isinstance(v, TileopsCache)), None)
        left = max_length - input_ids.shape[1]  # decode steps still to run
        if reserved and cache is not None:
            ran = _replay_rest(model, st, cache, last, unfinished, left, eos, pad, kept if keep else None)
            if ran is not None:
                return _result(torch.cat([input_ids, ran], dim=-1), kept, generation_config, model_kwargs)
        if not reserved and cache is not None and cache.paged is not None:
            # the pages of every step to come, in the block table the next step's graph captures
            cache.reserve_ahead(left)
            reserved = True
        inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1, **model_kwargs)
        outputs = model(**inputs, return_dict=True)


def _result(input_ids: torch.Tensor, kept: list[torch.Tensor], generation_config: Any, model_kwargs: dict) -> Any:
    """What transformers' greedy search returns: the sequences, or with
    ``return_dict_in_generate`` its output object (per-step logits and scores, the cache)."""
    if not generation_config.return_dict_in_generate:
        return input_ids
    steps = tuple(kept)
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    return GenerateDecoderOnlyOutput(
        sequences=input_ids,
        scores=steps if generation_config.output_scores else None,
        logits=steps if generation_config.output_logits else None,
        attentions=None,
        hidden_states=None,
        **{_CACHE_FIELD: cache},
    )


def _replay_rest(
    model: nn.Module,
    st: Any,
    cache: TileopsCache,
    last: torch.Tensor,
    unfinished: torch.Tensor,
    steps: int,
    eos: list[int],
    pad: int,
    kept: list[torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """The tokens of the remaining ``steps`` decode steps (fewer where every sequence
    finished), replayed from C++ on the graph that the step just run captured or replayed;
    None where that step did not run through such a graph, or the steps would pass the
    positions RoPE serves (the model's forward then runs them, and says so). ``kept``:
    each step's logits as float32 [B, V] are appended to it."""
    rec = st.fused.replay.recording_with(cache, st.head)
    if rec is None or steps < 1:
        return None
    step = cache.step
    rows, positions = rec.inputs  # rows: the step's embeddings, or its ids where it embeds them
    embed = model.get_input_embeddings()
    ids = rows if rows.ndim == 1 else None
    max_position = st.fused.layers[0].self_attn._tileops.positions.max_position
    if int(positions.max()) + steps >= max_position:
        return None
    tokens = torch.empty(last.shape[0], steps, dtype=torch.long)
    logits = None if kept is None else torch.empty(steps, *rec.output.shape, dtype=torch.float32)
    ran = decode_greedy(
        rec.graph,
        steps,
        logits=rec.output,
        table=embed.weight if ids is None else embed.weight_blocks,
        rows=None if ids is not None else rows,
        ids=ids,
        positions=positions,
        lengths=step.cache_seqlens,
        last=last.contiguous(),
        tokens=tokens,
        unfinished=unfinished,
        eos=eos,
        pad=pad,
        kept_logits=logits,
    )
    if kept is not None:
        kept.extend(logits[:ran].unbind(0))
    cache.replayed(ran)
    st.fused.replay.replays += ran
    st.fused.replay.searched += ran
    return tokens[:, :ran]
