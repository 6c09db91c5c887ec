"""What every family's factories share: the shape of a factory and of the builder it makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Builder = Callable[..., Any]
Factory = Callable[[str], Builder]  # op name -> the op's build_kernel
