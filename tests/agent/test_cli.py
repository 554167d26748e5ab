"""``gpuwarden agent``: the --once report (what ``make run`` prints)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import ConfigError
from agent.publish.settings import DaemonSettings
from gpuwarden.cli import main

VENV_BIN = Path(sys.executable).parent


def test_sim_once_prints_a_readable_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--backend", "sim", "--once", "--node-name", "gpu-node-7"]) == 0
    out = capsys.readouterr().out
    assert "node gpu-node-7" in out
    assert "GpuMemoryDegraded    True   RowRemapPending" in out
    assert "InfinibandDegraded   True   IbPortDown" in out
    assert "GpuXidError          False  NoFatalXid" in out
    assert "Xid13" in out and "RESTART_APP" in out
    assert "mlx5_5/1  DOWN Polling  400 Gb/s" in out
    assert "Recommended node action: REPLACE" in out


def test_sim_once_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--backend", "sim", "--scenario", "healthy", "--once", "--output", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["action"] == "NONE" and body["report"]["faults"] == []
    assert len(body["report"]["gpus"]) == 8 and len(body["sample"]["ib_ports"]) == 8


def test_bad_config_is_a_clear_startup_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("nvlink:\n  error_rate_per_minute: 5\n")
    assert main(["agent", "--backend", "sim", "--once", "--config", str(cfg)]) == 2
    assert "nvlink.error_rate_per_minute: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("poll_interval_s: 1.0e9\n", "poll_interval_s: must be a finite number greater than 0 and at most 3600"),
        ("poll_interval_s: 1.0e300\n", "poll_interval_s: must be a finite number greater than 0 and at most 3600"),
    ],
)
def test_a_config_value_beyond_its_flags_bound_stops_the_agent_before_it_polls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    """The file takes no value the flag refuses (--poll-interval caps at 3600)."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(text)
    assert main(["agent", "--backend", "sim", "--once", "--config", str(cfg)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no report: nothing started
    assert f"gpuwarden agent: config file {cfg}: {says}" in captured.err


@pytest.mark.parametrize("value", ["1.0e9", "0", "nan"])
def test_the_poll_interval_flag_refuses_what_the_file_refuses(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--backend", "sim", "--once", "--poll-interval", value])
    assert info.value.code == 2
    assert (
        "argument --poll-interval: must be a finite number greater than 0 and at most 3600" in capsys.readouterr().err
    )


def test_a_config_file_that_never_ends_or_explodes_is_a_short_startup_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent", "--backend", "sim", "--once", "--config", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert "config file /dev/zero is larger than" in err and len(err) < 400
    bomb = tmp_path / "bomb.yaml"
    doc = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        doc += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]\n"
    bomb.write_text(doc)
    assert main(["agent", "--backend", "sim", "--once", "--config", str(bomb)]) == 2
    err = capsys.readouterr().err
    assert f"config file {bomb} is refused" in err and len(err) < 600


def test_connected_settings_hold_their_bounds_however_they_are_built() -> None:
    """DaemonSettings built in code (the demo, tests) are checked as the flags check them."""
    with pytest.raises(
        ConfigError, match="heartbeat_period_s: must be a finite number greater than 0 and at most 3600"
    ):
        DaemonSettings(node_name="n", heartbeat_period_s=1e300)
    with pytest.raises(ConfigError, match="backoff_cap_s: must be a finite number"):
        DaemonSettings(node_name="n", backoff_cap_s=float("nan"))
    assert DaemonSettings(node_name="n", metrics_port=None).metrics_port is None


def test_unknown_scenario_is_a_clear_startup_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--backend", "sim", "--once", "--scenario", "nope"]) == 2
    assert "no scenario named 'nope'" in capsys.readouterr().err


def test_console_script_as_make_run_calls_it() -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "gpuwarden"), "agent", "--backend", "sim", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Conditions:" in proc.stdout and "RowRemapPending" in proc.stdout


def test_nvml_backend_without_nvml_or_kmsg_access_still_reports(tmp_path: Path) -> None:
    """No NVIDIA driver here, and as an unprivileged user /dev/kmsg is closed:
    both are logged and the report still comes out."""
    cmd = [
        str(VENV_BIN / "gpuwarden"),
        "--log-format",
        "json",
        "agent",
        "--backend",
        "nvml",
        "--once",
        "--sysfs-root",
        str(tmp_path),
    ]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/", check=False)
    assert proc.returncode == 0, proc.stderr
    logs = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert any(e["event"] == "kmsg_unavailable" and e["path"] == "/dev/kmsg" for e in logs)
    assert "gpuwarden agent report" in proc.stdout
    from tests.agent.conftest import REAL_NVML

    if not REAL_NVML:
        assert any(e["event"] == "gpu_backend_unavailable" for e in logs)
        assert "! gpu: NVML could not initialise" in proc.stdout
        assert "GpuMissing           Unknown" in proc.stdout


def test_once_report_says_conditions_are_unknown_while_their_source_is_down() -> None:
    """With NVML unavailable nothing is known of the GPUs: "GpuMissing False
    AllGpusPresent" would claim they were all there."""
    from agent.cli import format_report, report_json
    from agent.config import config_from_dict
    from agent.rules.engine import HealthRules
    from tests.agent.samples_factory import node

    nvml = "NVML could not initialise: Driver Not Loaded"
    sample = node(
        gpus=0,
        ports=0,
        gpu_source_error=nvml,
        ib_source_error="Permission denied",
        errors=(f"gpu: {nvml}", "infiniband: Permission denied"),
    )
    report = HealthRules(config_from_dict(None), "n").evaluate(sample)
    out = format_report(report)
    assert "GpuMissing           Unknown  not judged: its source failed (see errors above)" in out
    assert "GpuMemoryDegraded    Unknown" in out and "InfinibandDegraded   Unknown" in out
    assert "AllGpusPresent" not in out and "InfinibandHealthy" not in out
    # The kernel log still reports XIDs, and storage was read.
    assert "GpuXidError          False  NoFatalXid" in out and "StorageDegraded      False" in out
    assert "GpuMissing" in json.loads(report_json(report))["report"]["unjudged"]
