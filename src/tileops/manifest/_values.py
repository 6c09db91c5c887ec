"""Value rules (``signature.value_rules``): checks on the contents of index inputs.

Shape rules judge a call's signature once per memo key; offsets, lengths and page tables
change from call to call under one key, so their checks run on every call, in C++
(``csrc/engine/value_rules.cc``), before any kernel. A rule is one call of a fixed
vocabulary; its arguments are integer input names (whose values are read) and scalars
(integer constants, int params, ``x.shape[i]`` of any input, ``+ - * //``)::

    offsets(t, total)            t[0] == 0, t never decreases, t[-1] == total
    offsets_within(t, total)     the same, with t[-1] <= total (trailing rows unused)
    spans_at_most(t, limit)      t[i+1] - t[i] <= limit
    at_least(t, low)             every entry of t >= low
    within(t, low, high)         every entry of t in [low, high) (indices into a table)
    pages(table, page_size, num_pages, len[, len2])
                                 sequence b holds the sum over the lens of len[b] (a [B]
                                 tensor) or len[b+1] - len[b] (a [B+1] offsets tensor)
                                 tokens; they fit in table's row, and every page they use,
                                 table[b, :ceil(tokens / page_size)], is in [0, num_pages)
    writes_apart(table, page_size, num_pages, cached, offsets)
                                 request b writes offsets[b+1] - offsets[b] tokens at
                                 positions cached[b] on; no cache row is written twice, and
                                 none that a request reads at a cached position is written

A rule naming an absent optional input is skipped.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

# kind -> (C++ ValueKind, argument pattern: T a tensor, S a scalar, T? an optional tensor)
KINDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "offsets": (0, ("T", "S")),
    "offsets_within": (1, ("T", "S")),
    "spans_at_most": (2, ("T", "S")),
    "at_least": (3, ("T", "S")),
    "pages": (4, ("T", "S", "S", "T", "T?")),
    "within": (5, ("T", "S", "S")),
    "writes_apart": (6, ("T", "S", "S", "T", "T")),
}

# postfix opcodes of csrc/engine/value_rules.h (engine::Op)
_CONST, _DIM, _ADD, _SUB, _MUL, _FLOORDIV, _NEG = range(7)
_BINARY = {ast.Add: _ADD, ast.Sub: _SUB, ast.Mult: _MUL, ast.FloorDiv: _FLOORDIV}
_INT_DTYPES = {torch.int32, torch.int64}

Term = tuple[Any, ...]  # ("const", v) | ("param", name) | ("dim", input, axis) | ("op", code)


class ValueRuleError(Exception):
    """A value rule that does not parse."""


@dataclasses.dataclass(frozen=True)
class ValueRule:
    kind: str
    text: str
    tensors: tuple[str, ...]  # the inputs whose values are read, in argument order
    scalars: tuple[tuple[Term, ...], ...]  # postfix programs, in argument order

    def scalar_values(self, shapes: Mapping[str, Sequence[int] | None], params: Mapping[str, Any]) -> list[int]:
        """The scalars for these input shapes and params (what the C++ check computes)."""
        out = []
        for program in self.scalars:
            stack: list[int] = []
            for term in program:
                if term[0] == "const":
                    stack.append(term[1])
                elif term[0] == "param":
                    stack.append(_int_param(self, term[1], params))
                elif term[0] == "dim":
                    stack.append(int(shapes[term[1]][term[2]]))  # type: ignore[index]
                elif term[1] == _NEG:
                    stack[-1] = -stack[-1]
                else:
                    b, a = stack.pop(), stack.pop()
                    code = term[1]
                    stack.append(
                        a + b if code == _ADD else a - b if code == _SUB else a * b if code == _MUL else a // b
                    )
            out.append(stack[0])
        return out

    def compiled(self, params: Mapping[str, Any], slots: Mapping[str, int]) -> tuple:
        """(kind, text, tensor slots, programs as int words) for ``Dispatcher.set_value_rules``,
        with the op instance's params folded in."""
        programs = []
        for program in self.scalars:
            words: list[int] = []
            for term in program:
                if term[0] == "const":
                    words += [_CONST, term[1]]
                elif term[0] == "param":
                    words += [_CONST, _int_param(self, term[1], params)]
                elif term[0] == "dim":
                    words += [_DIM, slots[term[1]], term[2]]
                else:
                    words.append(term[1])
            programs.append(words)
        return KINDS[self.kind][0], self.text, [slots[t] for t in self.tensors], programs


def _int_param(rule: ValueRule, name: str, params: Mapping[str, Any]) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"value rule `{rule.text}` needs param {name!r} as an int, got {value!r}")
    if not -(2**63) <= value < 2**63:  # the checks compute in int64
        raise ValueError(f"param {name!r} must fit in int64 (value rule `{rule.text}`), got {value}")
    return value


def parse_value_rule(text: Any, inputs: Mapping[str, Any], params: set[str]) -> ValueRule:
    """``inputs``: input name -> its declared dtypes (None for same_as)."""
    if not isinstance(text, str):
        raise ValueRuleError(f"expected a string, got {text!r}")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueRuleError(f"does not parse: {exc.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.keywords:
        raise ValueRuleError(f"expected one of {sorted(KINDS)} called with positional arguments")
    kind = node.func.id
    if kind not in KINDS:
        raise ValueRuleError(f"unknown check {kind!r}; known: {sorted(KINDS)}")
    pattern = KINDS[kind][1]
    required = sum(1 for p in pattern if not p.endswith("?"))
    if not required <= len(node.args) <= len(pattern):
        raise ValueRuleError(f"{kind} takes {required} to {len(pattern)} arguments, got {len(node.args)}")
    tensors: list[str] = []
    scalars: list[tuple[Term, ...]] = []
    for arg, want in zip(node.args, pattern):
        if want.startswith("T"):
            if not isinstance(arg, ast.Name) or arg.id not in inputs:
                raise ValueRuleError(f"{kind}: {ast.unparse(arg)!r} is not an input")
            dtypes = inputs[arg.id]
            if dtypes is None or not set(dtypes) <= _INT_DTYPES:
                raise ValueRuleError(f"{kind}: input {arg.id!r} must be declared int32 or int64")
            tensors.append(arg.id)
        else:
            scalars.append(tuple(_scalar(arg, set(inputs), params)))
    return ValueRule(kind, text, tuple(tensors), tuple(scalars))


def _scalar(node: ast.expr, inputs: set[str], params: set[str]) -> list[Term]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [("const", node.value)]
    if isinstance(node, ast.Name):
        if node.id not in params:
            raise ValueRuleError(f"{node.id!r} is not a param (inputs appear as x.shape[i])")
        return [("param", node.id)]
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "shape"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id in inputs
    ):
        axis = node.slice
        if isinstance(axis, ast.UnaryOp) and isinstance(axis.op, ast.USub) and isinstance(axis.operand, ast.Constant):
            index = -axis.operand.value
        elif isinstance(axis, ast.Constant):
            index = axis.value
        else:
            raise ValueRuleError(f"{ast.unparse(node)!r}: the axis must be an int literal")
        if type(index) is not int:
            raise ValueRuleError(f"{ast.unparse(node)!r}: the axis must be an int literal")
        return [("dim", node.value.value.id, index)]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return [
            *_scalar(node.left, inputs, params),
            *_scalar(node.right, inputs, params),
            ("op", _BINARY[type(node.op)]),
        ]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return [*_scalar(node.operand, inputs, params), ("op", _NEG)]
    raise ValueRuleError(f"{ast.unparse(node)!r}: a scalar is an int, an int param, x.shape[i], or + - * // of those")
