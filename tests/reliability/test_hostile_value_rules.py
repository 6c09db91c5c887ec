"""Hostile inputs the value rules and the attention entries refuse before the backend:
malformed offsets, lengths and page tables (on the miss path and on a memo hit, checked in
C++), a negative window other than off, and fp8 inputs and caches."""

from __future__ import annotations

import pytest
import torch

from tileops import manifest
from tileops.testing import harness

from ._hostile import OPS

# ---- value rules: malformed offsets, lengths and page tables --------------------------

VALUE_RULE_OPS = sorted(name for name, e in manifest.all_entries().items() if e.value_rules)


def value_rule_breakers(entry: manifest.OpEntry, shapes: dict, params: dict, inputs: dict) -> list:
    """(label, name of the rule's input, replacements) breaking each value rule of a valid
    call in the ways a caller gets it wrong."""
    out = []
    for rule in entry.value_rules:
        name = rule.tensors[0]
        t = inputs[name]
        scalars = rule.scalar_values(shapes, params)
        if rule.kind in ("offsets", "offsets_within"):
            bad = t.clone()
            if len(bad) >= 3:
                bad[1] = bad[2] + 1  # then bad[2] < bad[1]
            else:
                bad[-1] += 1
            out.append((f"decreasing {name}", name, {name: bad}))
            past = t.clone()
            past[-1] = scalars[0] + 1
            out.append((f"{name} past its rows", name, {name: past}))
        elif rule.kind == "spans_at_most" and int(t[-1]) > scalars[0]:
            bad = torch.full_like(t, scalars[0] + 1)
            bad[0], bad[-1] = 0, t[-1]
            out.append((f"{name} with a span over {scalars[0]}", name, {name: bad}))
        elif rule.kind == "at_least":
            bad = t.clone()
            bad[0] = scalars[0] - 1
            out.append((f"{name} below {scalars[0]}", name, {name: bad}))
        elif rule.kind == "within":
            for value in (scalars[1], scalars[0] - 1):
                bad = t.clone()
                bad[0] = value
                out.append((f"{name} entry {value} outside [{scalars[0]}, {scalars[1]})", name, {name: bad}))
        elif rule.kind == "pages":
            page_size, num_pages = scalars
            table, lengths = t, rule.tensors[1:]
            tokens = sum(
                (inputs[n][1:] - inputs[n][:-1]) if len(inputs[n]) == len(table) + 1 else inputs[n] for n in lengths
            )
            used = int(torch.nonzero(tokens > 0)[0, 0]) if bool((tokens > 0).any()) else None
            if used is not None:
                for page in (num_pages, -1):
                    bad = table.clone()
                    bad[used, 0] = page
                    out.append((f"{name} entry {page} outside the cache", name, {name: bad}))
            for n in lengths:
                if len(inputs[n]) == len(table):  # a length of its own, not offsets
                    bad = inputs[n].clone()
                    bad[0] = table.shape[1] * page_size + 1
                    out.append((f"{n} beyond its pages", name, {n: bad}))
        elif rule.kind == "writes_apart":
            page_size = scalars[0]
            cached, offsets = (inputs[n] for n in rule.tensors[1:])
            chunks = offsets[1:] - offsets[:-1]
            appending = torch.nonzero(chunks > 0).flatten().tolist()
            long = [b for b in appending if int(cached[b] + chunks[b]) > page_size]
            bad = t.clone()
            if len(appending) >= 2:  # two requests on one set of pages: one overwrites the other
                bad[appending[1]] = bad[appending[0]]
                out.append((f"two requests appending through one {name} row", name, {name: bad}))
            elif long:  # every page of a request one page: a later position lands on an earlier one's row
                bad[long[0]] = bad[long[0], 0]
                out.append((f"a {name} row whose pages are all one", name, {name: bad}))
    return out


@pytest.mark.parametrize("op_name", VALUE_RULE_OPS)
def test_malformed_offsets_lengths_and_page_tables_are_refused_before_the_backend(recorder, op_name):
    entry = manifest.entry(op_name)
    case = next(c for c in harness.cases(None, ops=[op_name], scale="tiny") if not c.strided)
    inputs = dict(zip(entry.input_names(), harness.make_inputs(case)))
    breakers = value_rule_breakers(entry, case.shapes, case.params, inputs)
    assert breakers, f"{op_name}: no value rule could be broken"
    for warm in (False, True):  # the miss path, then a memo hit (checked in C++)
        op = OPS[op_name](**harness.constructor_args(case))
        if warm:
            op(*[None if v is None else v.clone() for v in inputs.values()])
        builds = len(recorder.builds)
        for label, rule_input, replaced in breakers:
            args = [replaced.get(n, v) for n, v in inputs.items()]
            with pytest.raises(ValueError, match=f"{op_name}: value rule .*{rule_input}") as error:
                op(*args)
            assert "does not hold" in str(error.value), label
            assert len(recorder.builds) == builds, f"{label}: reached the builder"


@pytest.mark.parametrize(
    "op_name", sorted(n for n, e in manifest.all_entries().items() if "window_size_left" in e.param_names())
)
@pytest.mark.parametrize("window", [-2, -(2**40)])
def test_a_negative_window_other_than_off_is_refused_at_construction(op_name, window):
    case = harness.cases(None, ops=[op_name], scale="tiny", edge_cases=False)[0]
    args = {**harness.constructor_args(case), "window_size_left": window}
    with pytest.raises(ValueError, match=f"{op_name}.*window_size_left"):
        OPS[op_name](**args)


@pytest.mark.parametrize("op_name", sorted(n for n in OPS if n.startswith("GroupedQueryAttention")))
def test_fp8_attention_inputs_and_caches_are_refused_by_the_manifest(recorder, op_name):
    # fp8 is optional upstream and not served here: the dtypes say so, before any backend.
    entry = manifest.entry(op_name)
    case = next(c for c in harness.cases(None, ops=[op_name], scale="tiny") if not c.strided)
    inputs = harness.make_inputs(case)
    op = OPS[op_name](**harness.constructor_args(case))
    fp8 = torch.float8_e4m3fn
    for slot, decl in enumerate(entry.inputs):
        if decl.name not in ("q", "k_pages") or inputs[slot] is None:
            continue
        args = list(inputs)
        args[slot] = args[slot].to(fp8)
        expected = "expects dtype float16 | bfloat16" if slot == 0 else "must have the same dtype as input 'q'"
        with pytest.raises(ValueError, match=f"{op_name}: input '{decl.name}' {expected}.*float8_e4m3fn"):
            op(*args)
    assert recorder.builds == []
