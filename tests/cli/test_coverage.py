"""`tileops coverage TARGET --model CONFIG`: the ops a model's forward uses (through the
transformers integration), which the target registers, and what to write next."""

from __future__ import annotations

from pathlib import Path

import pytest

from tileops import manifest

from ._kit import as_json, block, output, rows, run_cli

LLAMA = Path(__file__).resolve().parents[2] / "examples" / "llama-155m" / "config.json"


@pytest.mark.subprocess
def test_coverage_lists_the_ops_a_llama_uses_and_the_missing_ones_most_used_first(kit_site):
    run = run_cli("coverage", "acme_cpu", "--model", str(LLAMA), "--json", site=kit_site)
    assert run.returncode == 1, output(run)  # ops are missing
    payload = as_json(run)
    layers = 8  # examples/llama-155m/config.json
    ops = payload["ops"]
    assert set(ops) <= set(manifest.all_entries())
    assert ops["GemmFwdOp"] >= 7 * layers + 1  # q k v o gate up down and the LM head (and stacks)
    assert ops["SiluAndMulFwdOp"] == layers and ops["RopeNeoxPositionIdsFwdOp"] == layers
    assert "RMSNormFwdOp" in ops
    assert any(op.startswith("GroupedQueryAttention") for op in ops)
    assert "AddFwdOp" not in ops  # Llama's projections have no bias
    assert payload["registered"] == ["RMSNormFwdOp"]
    assert payload["missing"][0] == "GemmFwdOp"  # the most used comes first
    assert set(payload["missing"]) == set(ops) - {"RMSNormFwdOp"}
    table = {r["op"]: r for r in rows(payload, "coverage")}
    assert table["RMSNormFwdOp"]["registered"] == "yes"
    assert table["GemmFwdOp"]["write order"] == 1
    assert any(r["module"] == "embed_tokens" for r in rows(payload, "on_torch"))


@pytest.mark.subprocess
def test_coverage_without_transformers_refuses_and_says_what_to_install(kit_site, tmp_path):
    blocked = block(tmp_path / "blocked", "transformers")
    run = run_cli("coverage", "acme_cpu", "--model", str(LLAMA), site=kit_site, path=(blocked,))
    assert run.returncode == 2, output(run)
    assert run.stderr.startswith("tileops coverage: error: coverage needs transformers, which is not installed here"), (
        output(run)
    )
    assert "pip install 'tileops[transformers]'" in run.stderr


def test_an_unknown_model_type_is_refused_with_the_closest_types(site, capsys):
    from _fake_backends import good

    from tileops import cli

    site.backend("acme", good("acme"))
    assert cli.main(["coverage", "acme", "--model", "lama"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "tileops coverage: error: --model: expected a config.json path, a "
        "folder holding one, or a transformers model type"
    )
    assert "got 'lama'" in err and "'llama'" in err
