"""The package carries a copy of the repository's one DLPack declaration (it builds from its
own folder); the copy must stay byte-identical to the canonical header."""

from pathlib import Path

import pytest

COPY = Path(__file__).resolve().parents[1] / "csrc" / "dlpack_abi.h"
CANONICAL = Path(__file__).resolve().parents[3] / "csrc" / "bindings" / "dlpack_abi.h"


def test_the_dlpack_header_is_a_byte_identical_copy_of_the_repositorys():
    if not CANONICAL.is_file():
        pytest.skip(f"the canonical header is not reachable from here (no {CANONICAL}): not in the tileops repository")
    assert COPY.read_bytes() == CANONICAL.read_bytes(), (
        f"{COPY} differs from {CANONICAL}; edit the canonical file and copy it: "
        "cp csrc/bindings/dlpack_abi.h backends/native_cpu/csrc/dlpack_abi.h"
    )
