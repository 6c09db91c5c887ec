"""The two small type languages of a manifest: dtype rules and param type strings."""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

_SAME_AS = re.compile(r"^same_as\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")


class TypeSyntaxError(ValueError):
    """A dtype rule or param type string that does not parse."""


def parse_dtype(text: object) -> torch.dtype:
    if not isinstance(text, str) or text.strip() not in DTYPES:
        raise TypeSyntaxError(f"unknown dtype {text!r}; known: {sorted(DTYPES)}")
    return DTYPES[text.strip()]


def parse_dtype_rule(text: object) -> tuple[tuple[torch.dtype, ...] | None, str | None]:
    """``"float16 | bfloat16"`` -> ((float16, bfloat16), None); ``"same_as(x)"`` -> (None, "x")."""
    if not isinstance(text, str):
        raise TypeSyntaxError(f"expected a dtype rule string, got {text!r}")
    match = _SAME_AS.match(text.strip())
    if match:
        return None, match.group(1)
    dtypes: list[torch.dtype] = []
    for part in text.split("|"):
        dtype = parse_dtype(part)
        if dtype in dtypes:
            raise TypeSyntaxError(f"dtype {part.strip()!r} listed twice in {text!r}")
        dtypes.append(dtype)
    return tuple(dtypes), None


def dtype_rule_text(dtypes: tuple[torch.dtype, ...]) -> str:
    return " | ".join(DTYPE_NAMES[d] for d in dtypes)


# --- param types ----------------------------------------------------------------------

_SCALARS = ("int", "float", "bool", "str", "None")
_ELEMENTS = ("int", "float", "bool", "str")
_LIST = re.compile(r"^list\[\s*(\w+)\s*\]$")
_TUPLE = re.compile(r"^tuple\[\s*(\w+)\s*,\s*\.\.\.\s*\]$")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_float(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral))


def _exact_scalar(kind: str, value: object) -> tuple[bool, object]:
    """Accept ``value`` as ``kind`` without widening; bool is never an int here."""
    if kind == "None":
        return value is None, None
    if kind == "bool":
        return isinstance(value, bool), value
    if kind == "int":
        return (True, int(value)) if _is_int(value) else (False, None)  # type: ignore[call-overload]
    if kind == "float":
        return (True, float(value)) if _is_float(value) else (False, None)  # type: ignore[arg-type]
    return isinstance(value, str), value  # "str"


def _scalar(kind: str, value: object) -> tuple[bool, object]:
    ok, out = _exact_scalar(kind, value)
    if not ok and kind == "float" and _is_int(value):
        return True, float(value)  # type: ignore[arg-type]
    return ok, out


@dataclass(frozen=True)
class ParamType:
    """A union of alternatives such as ``int | list[int] | tuple[int, ...] | None``."""

    text: str  # canonical spelling, used in messages
    alternatives: tuple[tuple[str, str | None], ...]  # ("scalar", kind) or ("list"/"tuple", elem)

    @property
    def allows_none(self) -> bool:
        return ("scalar", "None") in self.alternatives

    def convert(self, value: object) -> tuple[bool, object]:
        """(accepted, normalised value). Exact matches win over int -> float widening, so
        ``int | float`` keeps an int an int; sequences come back as tuples."""
        for widen in (False, True):
            for form, kind in self.alternatives:
                assert kind is not None
                if form == "scalar":
                    ok, out = (_scalar if widen else _exact_scalar)(kind, value)
                    if ok:
                        return True, out
                elif isinstance(value, list if form == "list" else tuple):
                    items = []
                    for item in value:
                        ok, out = (_scalar if widen else _exact_scalar)(kind, item)
                        if not ok:
                            break
                        items.append(out)
                    else:
                        return True, tuple(items)
        return False, None


def parse_param_type(text: object) -> ParamType:
    if not isinstance(text, str) or not text.strip():
        raise TypeSyntaxError(f"expected a type string, got {text!r}")
    alternatives: list[tuple[str, str | None]] = []
    spelled: list[str] = []
    for raw in text.split("|"):
        part = raw.strip()
        if part in _SCALARS:
            alt: tuple[str, str | None] = ("scalar", part)
            spelled.append(part)
        elif (m := _LIST.match(part)) and m.group(1) in _ELEMENTS:
            alt = ("list", m.group(1))
            spelled.append(f"list[{m.group(1)}]")
        elif (m := _TUPLE.match(part)) and m.group(1) in _ELEMENTS:
            alt = ("tuple", m.group(1))
            spelled.append(f"tuple[{m.group(1)}, ...]")
        else:
            raise TypeSyntaxError(
                f"unknown type {part!r} in {text!r}; known: int, float, bool, str, None, "
                "list[T], tuple[T, ...] (T one of int, float, bool, str), joined with |"
            )
        if alt in alternatives:
            raise TypeSyntaxError(f"type {part!r} listed twice in {text!r}")
        alternatives.append(alt)
    return ParamType(" | ".join(spelled), tuple(alternatives))
