"""Greedy generate with its decode steps replayed from C++
(tileops.integrations.transformers.decode.generate): an enabled plain causal LM's ``generate``
gives the tokens of transformers' own loop over the same replayed steps
(``type(model).generate``), left padding and end-of-sequence ids included; it leaves its
cache as that loop does; with ``return_dict_in_generate`` it returns that loop's output
object (each step's logits and scores, the cache); and what it does not serve (sampling,
logits processors, streamers, attentions or hidden states per step, positions past the
RoPE tables) runs transformers' loop.
"""

from __future__ import annotations

import pytest
import torch

from ._models import SANITIZED, _cache_kw, _model, _prompt, hf, transformers

PLAIN = ["llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2"]  # the causal LMs whose decode step replays whole
# (the sanitizer job runs Llama's: the search's own code is the same for all, and the
# per-architecture tests' sanitized subset reaches the others' kernels)
SEARCHED = PLAIN[:1] if SANITIZED else PLAIN
NEW = 12


@pytest.fixture
def in_cpp(monkeypatch):
    """The decode steps each generate call replayed from C++ (a list, one entry per call
    that ran them)."""
    runs: list[int] = []
    replay_rest = hf.decode.generate._replay_rest

    def counted(*args, **kwargs):
        out = replay_rest(*args, **kwargs)
        if out is not None:
            runs.append(out.shape[1])
        return out

    monkeypatch.setattr(hf.decode.generate, "_replay_rest", counted)
    return runs


def _both(model, ids, **kw):
    """(the enabled model's generate, transformers' loop on the same model)."""
    with torch.no_grad():
        return model.generate(ids, **kw), type(model).generate(model, ids, **kw)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("arch", SEARCHED)
def test_greedy_generate_replays_its_steps_in_cpp_and_gives_transformers_loops_tokens(arch, padded, in_cpp, target):
    model = _model(arch)
    report = hf.enable(model, target=target)
    assert report.count("greedy search loop") == 1 and "generate" in model.__dict__
    ids, mask = _prompt(padded)
    fast, slow = _both(
        model, ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    assert torch.equal(fast, slow) and fast.shape == (2, ids.shape[1] + NEW)
    # the prefill and the first two decode steps run the model: the first builds its kernels, the second captures
    assert in_cpp == [NEW - 3]
    hf.disable(model)
    assert "generate" not in model.__dict__


def test_end_of_sequence_ids_pad_finished_sequences_and_stop_the_search_as_transformers_does(in_cpp, target):
    model = _model("llama")
    hf.enable(model, target=target)
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    free, _ = _both(model, ids, eos_token_id=None, **kw)
    new = free[:, ids.shape[1] :]
    first_seen = lambda b, t: int((new[b] == t).nonzero()[0])  # noqa: E731
    cases = [
        [int(new[0, 5])],  # sequence 0 ends within the steps replayed from C++, sequence 1 may run on
        [int(new[0, 1])],  # an end at the first decode step, which runs the model
        [int(new[0, 4]), int(new[1, 6])],  # both end: the search stops early
    ]
    for eos in cases:
        in_cpp.clear()
        fast, slow = _both(model, ids, eos_token_id=eos, **kw)
        assert torch.equal(fast, slow), eos
        ends = [
            min(first_seen(b, t) for t in eos if (new[b] == t).any()) if any((new[b] == t).any() for t in eos) else None
            for b in range(2)
        ]
        for b, end in enumerate(ends):
            if end is not None:
                assert (fast[b, ids.shape[1] + end + 1 :] == 0).all()  # pads after the end
        if all(end is not None for end in ends):
            assert fast.shape[1] == ids.shape[1] + max(ends) + 1
    assert in_cpp  # the last case ran its later steps in C++


def test_what_greedy_search_does_not_serve_runs_transformers_loop_with_the_same_results(in_cpp, target):
    model = _model("qwen3")
    hf.enable(model, target=target)
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=6, pad_token_id=0)
    with torch.no_grad():
        for extra in (
            dict(do_sample=True, top_k=20),
            dict(do_sample=False, repetition_penalty=1.3),
            dict(do_sample=False, return_dict_in_generate=True, output_hidden_states=True),
        ):
            torch.manual_seed(3)
            fast = model.generate(ids, **kw, **extra)
            torch.manual_seed(3)
            slow = type(model).generate(model, ids, **kw, **extra)
            if isinstance(fast, torch.Tensor):
                assert torch.equal(fast, slow), extra
            else:
                assert torch.equal(fast.sequences, slow.sequences) and len(fast.hidden_states) == 6
        tokens = []

        class Collect(transformers.generation.streamers.BaseStreamer):
            def put(self, value):
                tokens.append(value)

            def end(self):
                tokens.append(None)

        streamed = model.generate(
            ids[:1], attention_mask=mask[:1], max_new_tokens=6, do_sample=False, pad_token_id=0, streamer=Collect()
        )
    assert in_cpp == []
    assert len(tokens) == 1 + 6 + 1 and tokens[-1] is None  # the prompt, each token, the end
    assert torch.equal(torch.cat([t.reshape(1, -1) for t in tokens[:-1]], dim=1), streamed)


ASKED = {
    "logits-and-scores": dict(output_logits=True, output_scores=True),
    "logits": dict(output_logits=True),
    "scores": dict(output_scores=True),
    "cache-only": {},
}
if SANITIZED:  # the first covers the others' code
    ASKED = dict(list(ASKED.items())[:1])


@pytest.mark.parametrize("asked", list(ASKED.values()), ids=list(ASKED))
def test_return_dict_in_generate_gives_transformers_loops_output_object_from_the_search_in_cpp(asked, in_cpp, target):
    model = _model("llama")
    hf.enable(model, target=target)
    ids, mask = _prompt(True)
    eos = None
    for attempt in range(2):  # then with an end id that one sequence meets in the C++ steps
        fast, slow = _both(
            model,
            ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=eos,
            return_dict_in_generate=True,
            **asked,
        )
        assert type(fast) is type(slow) and torch.equal(fast.sequences, slow.sequences)
        for name in ("logits", "scores"):
            got, want = getattr(fast, name), getattr(slow, name)
            if not asked.get(f"output_{name}"):
                assert got is None and want is None
                continue
            assert len(got) == len(want) == fast.sequences.shape[1] - ids.shape[1]
            for step, (g, w) in enumerate(zip(got, want)):
                assert g.dtype == torch.float32 and torch.equal(g, w), (name, step)
        assert fast.attentions is None and fast.hidden_states is None
        assert isinstance(fast.past_key_values, hf.TileopsCache) and fast.past_key_values is not slow.past_key_values
        assert fast.past_key_values.get_seq_length() == slow.past_key_values.get_seq_length()
        assert in_cpp == [NEW - 3] if attempt == 0 else in_cpp
        eos = [int(fast.sequences[0, ids.shape[1] + 5])]
        in_cpp.clear()


def test_kept_logits_are_refused_unless_float32_steps_by_batch_by_vocab():
    from tileops.capture import Graph, decode_greedy

    b, v = 2, 5
    args = dict(
        logits=torch.zeros(b, v),
        table=torch.zeros(v, 3),
        rows=torch.zeros(b, 3),
        positions=torch.zeros(b, dtype=torch.long),
        lengths=torch.zeros(b, dtype=torch.int32),
        last=torch.zeros(b, dtype=torch.long),
        tokens=torch.zeros(b, 1, dtype=torch.long),
        unfinished=torch.ones(b, dtype=torch.long),
        eos=[],
        pad=0,
    )
    for bad in (torch.zeros(1, b, v, dtype=torch.bfloat16), torch.zeros(1, b + 1, v), torch.zeros(b, v)):
        with pytest.raises(ValueError, match=r"decode_greedy: kept_logits must be float32 \[\*, 2, 5\]"):
            decode_greedy(Graph(), 1, **args, kept_logits=bad)


def test_the_cache_after_a_search_in_cpp_holds_what_transformers_loop_leaves_and_generation_resumes_from_it(
    in_cpp, target
):
    model = _model("llama")
    hf.enable(model, target=target)
    ids, mask = _prompt(True)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    outs, caches = [], []
    with torch.no_grad():
        for generate in (model.generate, lambda *a, **k: type(model).generate(model, *a, **k)):
            cache = hf.TileopsCache(config=model.config)
            first = generate(ids, attention_mask=mask, max_new_tokens=NEW, **{_cache_kw(model): cache}, **kw)
            more = torch.cat([mask, torch.ones(2, NEW, dtype=mask.dtype)], dim=1)
            second = generate(first, attention_mask=more, max_new_tokens=5, **{_cache_kw(model): cache}, **kw)
            outs.append(second)
            caches.append(cache)
    assert torch.equal(outs[0], outs[1]) and outs[0].shape[1] == ids.shape[1] + NEW + 5
    fast, slow = caches
    assert fast.get_seq_length() == slow.get_seq_length() == outs[0].shape[1] - 1
    assert fast.lengths(2) == slow.lengths(2)
    # the first generate's first decode step built its kernels; the second's captured at once
    assert in_cpp == [NEW - 3, 5 - 2]


def test_positions_past_the_rope_tables_stop_the_search_with_the_models_own_error(in_cpp, target):
    model = _model("llama", max_position_embeddings=20)
    hf.enable(model, target=target)
    ids, mask = _prompt(False)  # 12 positions; 10 more reach position 21
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    errors = []
    with torch.no_grad():
        for generate in (model.generate, lambda *a, **k: type(model).generate(model, *a, **k)):
            with pytest.raises(ValueError, match="position 20 is past max_position_embeddings=20") as e:
                generate(ids, **kw)
            errors.append(str(e.value))
    assert errors[0] == errors[1] and in_cpp == []


def test_a_model_whose_decode_step_does_not_replay_whole_keeps_transformers_generate(target):
    model = _model("gemma3")  # its logits are capped after the head: no causal LM decode step
    report = hf.enable(model, target=target)
    assert report.count("greedy search loop") == 0 and "generate" not in model.__dict__
