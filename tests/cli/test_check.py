"""`tileops check TARGET`: the numeric harness over every op a target registers."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from _fake_backends import good

from tileops import cli

from ._kit import MIXED, OTHER, output, rows, run_cli


@pytest.mark.subprocess
def test_check_catches_a_broken_kernel_and_passes_a_correct_one(kit_site, tmp_path):
    junit, report = tmp_path / "check.xml", tmp_path / "check.json"
    run = run_cli("check", "acme_cpu", "--scale", "tiny", "--junit", str(junit), "--json", str(report), site=kit_site)
    assert run.returncode == 1, output(run)
    lines = {tuple(line.split()[:3]) for line in run.stdout.splitlines()}
    assert ("RMSNormFwdOp", "float16", "pass") in lines
    assert ("RMSNormFwdOp", "bfloat16", "pass") in lines
    assert ("SoftmaxFwdOp", "float16", "FAIL") in lines
    assert "max abs error" in run.stdout  # the first failure, quoted
    assert "check: " in run.stderr  # progress goes to stderr
    payload = json.loads(report.read_text())
    assert payload["device"] == "cpu" and payload["failed"] > 0
    table = rows(payload, "check")
    rms = [r for r in table if r["op"] == "RMSNormFwdOp"]
    assert {r["dtype"] for r in rms} >= {"float16", "bfloat16"}
    assert all(r["result"] == "pass" and r["worst abs error"] < 0.05 for r in rms)
    softmax = [r for r in table if r["op"] == "SoftmaxFwdOp"]
    assert softmax and all(r["result"] == "FAIL" and r["worst abs error"] > 0.01 for r in softmax)
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failed) == payload["failed"]
    assert {c.get("classname") for c in failed} == {"acme_cpu.SoftmaxFwdOp"}


def test_check_exits_0_when_every_case_passes(site, capsys):
    site.install("tileops-backend-acme", {"acme_cpu": "tileops_acme"}, {"tileops_acme": MIXED})
    assert cli.main(["check", "acme_cpu", "--ops", "RMSNormFwdOp", "--scale", "tiny", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["failed"] == 0 and payload["cases"] > 0
    assert {r["op"] for r in rows(payload, "check")} == {"RMSNormFwdOp"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["nope"],
            "TARGET: no installed backend registers target 'nope'; registered "
            "targets: ['acme_cpu', 'opt_cpu', 'other_cpu']",
        ),
        (
            ["acme_cpu", "--ops", "RMSNormFwd"],
            "--ops: 'RMSNormFwd' is not an op any manifest declares (did you mean 'RMSNormFwdOp'?)",
        ),
        (
            ["acme_cpu", "--ops", "GemmFwdOp"],
            "--ops: target 'acme_cpu' registers no builder for GemmFwdOp; it registers: RMSNormFwdOp, SoftmaxFwdOp",
        ),
        (["acme_cpu", "--device", "gpu:x"], "--device: expected a torch device such as 'cpu' or 'cuda:0', got 'gpu:x'"),
        (["acme_cpu", "--device", "ipu:0"], "--device: expected a device present on this machine (cpu, "),
        (["opt_cpu"], "target 'opt_cpu' claims none of the devices present here (cpu, "),
    ],
)
def test_bad_input_is_refused_with_exit_2_naming_what_was_expected(site, capsys, args, expected):
    site.install("tileops-backend-acme", {"acme_cpu": "tileops_acme"}, {"tileops_acme": MIXED})
    site.install("tileops-backend-other", {"other_cpu": "tileops_other"}, {"tileops_other": OTHER})
    site.backend("opt_cpu", good("opt_cpu"))
    assert cli.main(["check", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"tileops check: error: {expected}"), captured.err
    assert captured.out == ""


def test_a_builder_that_raises_fails_its_cases_with_the_error_quoted(site, capsys):
    site.backend(
        "acme",
        """
register_detector("acme", lambda device: device.type == "cpu")

def build_rms_norm(x, weight, *, normalized_shape, eps):
    raise NotImplementedError(f"acme has no RMSNorm for {x.dtype} yet")

register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm)
""",
    )
    assert cli.main(["check", "acme", "--scale", "tiny", "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    table = rows(payload, "check")
    assert table and all(r["result"] == "FAIL" and r["worst abs error"] is None for r in table)
    assert all("NotImplementedError: acme has no RMSNorm for torch." in r["first failure"] for r in table)


# An opt-in backend: its detector claims nothing, so only an explicit target= reaches it.
OPT_IN = good("opt_cpu")
NOT_CLAIMED = (
    "not claimed: opt_cpu's detect() answered False for cpu; it runs there because the "
    "command line names it explicitly, as target='opt_cpu' does in a program"
)


def test_check_runs_a_target_on_a_device_its_detector_does_not_claim_and_says_so(site, capsys, tmp_path):
    site.backend("opt_cpu", OPT_IN)
    report = tmp_path / "check.json"
    assert cli.main(["check", "opt_cpu", "--device", "cpu", "--scale", "tiny", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert NOT_CLAIMED in out  # the table's line
    payload = json.loads(report.read_text())
    assert payload["device"] == "cpu" and payload["failed"] == 0 and payload["cases"] > 0
    assert payload["claimed"] is False and payload["detector"] is False
    assert any(NOT_CLAIMED in note for note in payload["tables"]["check"]["notes"])
    assert {r["result"] for r in rows(payload, "check")} == {"pass"}


def test_check_of_a_claimed_device_says_nothing_about_claims(site, capsys):
    site.install("tileops-backend-acme", {"acme_cpu": "tileops_acme"}, {"tileops_acme": MIXED})
    assert cli.main(["check", "acme_cpu", "--ops", "RMSNormFwdOp", "--device", "cpu", "--scale", "tiny", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["claimed"] is True
    assert not any("not claimed" in note for note in payload["tables"]["check"]["notes"])


@pytest.mark.parametrize(
    ("kernel", "failure"),
    [
        (
            "lambda x, w: (torch.nn.functional.rms_norm(x.float(), tuple(normalized_shape), "
            "w.float(), eps) + 0.05).to(x.dtype)",
            "max abs error",
        ),
        (
            "lambda x, w: (_ for _ in ()).throw(NotImplementedError('opt_cpu has no RMSNorm here'))",
            "NotImplementedError: opt_cpu has no RMSNorm here",
        ),
    ],
    ids=["wrong", "raising"],
)
def test_an_unclaimed_target_whose_kernels_fail_still_fails_check_with_exit_1(site, capsys, kernel, failure):
    site.backend(
        "opt_cpu",
        OPT_IN.replace(
            "return lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)", f"return {kernel}"
        ),
    )
    assert cli.main(["check", "opt_cpu", "--device", "cpu", "--scale", "tiny", "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    table = rows(payload, "check")
    assert table and all(r["result"] == "FAIL" and failure in r["first failure"] for r in table)
    assert payload["claimed"] is False
    assert any(NOT_CLAIMED in note for note in payload["tables"]["check"]["notes"])
