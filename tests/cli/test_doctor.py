"""`tileops doctor`: installed backends, load failures with fixes, detectors, the default
target, builders under undeclared op names, the protocol check."""

from __future__ import annotations

import json

import pytest
from _fake_backends import good

from tileops import cli
from tileops.backend import PROTOCOL_VERSION

from ._kit import FUTURE, MISSPELT, output, rows, run_cli


@pytest.mark.subprocess
def test_doctor_reports_a_misspelt_op_name_and_a_protocol_mismatch(kit_site, tmp_path):
    kit_site.install("tileops-backend-typo", {"typo_cpu": "tileops_typo"}, {"tileops_typo": MISSPELT})
    kit_site.install("tileops-backend-future", {"future_cpu": "tileops_future"}, {"tileops_future": FUTURE})
    report = tmp_path / "doctor.json"
    run = run_cli("doctor", "--json", str(report), site=kit_site)
    assert run.returncode == 1, output(run)
    # the table, as printed
    assert "did you mean 'GemmFwdOp'?" in run.stdout
    assert "tileops_future was written for tileops backend protocol 99.0" in run.stdout
    payload = json.loads(report.read_text())
    (stray,) = rows(payload, "undeclared_ops")
    assert (stray["op name"], stray["target"], stray["did you mean"]) == (
        "GemmOp",
        "typo_cpu",
        "did you mean 'GemmFwdOp'?",
    )
    (failure,) = rows(payload, "load_failures")
    ours = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
    assert failure["entry point"] == "future_cpu"
    assert failure["cause"].startswith(
        "future_cpu (tileops_future): BackendError: tileops_future was written for tileops "
        f"backend protocol 99.0, but this tileops speaks protocol {ours}"
    )
    installed = {r["entry point"]: r for r in rows(payload, "backends")}
    assert installed["acme_cpu"]["distribution"] == "tileops-backend-acme"
    assert installed["acme_cpu"]["version"] == "0.1"
    assert installed["acme_cpu"]["module"] == "tileops_acme"
    assert installed["acme_cpu"]["targets"] == ["acme_cpu"]
    assert installed["acme_cpu"]["protocol"] == "1.0"
    assert installed["future_cpu"]["status"] == "FAILED to load"
    detectors = {r["target"]: r for r in rows(payload, "detectors")}
    assert detectors["acme_cpu"]["cpu"] == "yes" and detectors["acme_cpu"]["meta"] == "no"
    assert detectors["typo_cpu"]["cpu"] == "no"
    assert "future_cpu" not in detectors  # rolled back
    assert rows(payload, "default_target")[0]["default"] == "none"
    protocol = {r["entry point"]: r["check"] for r in rows(payload, "protocol")}
    assert protocol["acme_cpu"] == "ok"
    assert protocol["typo_cpu"].startswith("accepted (no TILEOPS_PROTOCOL_VERSION")
    assert protocol["future_cpu"].startswith("FAILED")


def test_doctor_exits_0_when_nothing_is_wrong(site, capsys):
    site.backend("acme", good("acme"))
    assert cli.main(["doctor", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["problems"] == 0
    assert rows(payload, "load_failures") == []
    assert rows(payload, "undeclared_ops") == []


def test_doctor_names_a_target_that_claims_no_device_present_and_how_to_run_it(site, capsys):
    site.backend("acme", good("acme"))  # an opt-in backend: legal, so no problem
    assert cli.main(["doctor", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["tables"]["detectors"]["notes"]
    assert (
        "acme: claims none of the devices present; its ops run only where a program names "
        "it (target='acme' or set_default_target), and `tileops check acme --device D` "
        "checks it on D"
    ) in notes


def test_doctor_counts_a_raising_detector_as_a_problem(site, capsys):
    site.backend(
        "acme",
        good("acme").replace(
            "lambda device: False", "lambda device: (_ for _ in ()).throw(RuntimeError('no runtime'))"
        ),
    )
    assert cli.main(["doctor", "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    (row,) = rows(payload, "detectors")
    assert row["cpu"] == "raised RuntimeError: no runtime"


def test_new_backend_writes_the_protocol_declaration(tmp_path):
    folder = cli.new_backend("acme", device_type="meta", dest=tmp_path)
    init = (folder / "src/tileops_acme/__init__.py").read_text()
    assert f"TILEOPS_PROTOCOL_VERSION = {tuple(PROTOCOL_VERSION)!r}" in init
