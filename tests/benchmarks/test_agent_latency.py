"""The fleet mode of the latency benchmark runs end to end on a tiny fleet (``--agents 3``).

What is checked is that agents in several worker processes start, publish,
take every injected XID to its condition and back, and that the result line a
reader (or a script) relies on is printed; the figures depend on the machine
and are not judged here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "agent_latency.py"
RESULT = re.compile(
    r"^result mode=fleet agents=(?P<agents>\d+) processes=(?P<processes>\d+) samples=(?P<samples>\d+) "
    r"missed=(?P<missed>\d+) p50_ms=(?P<p50>[\d.]+) p99_ms=(?P<p99>[\d.]+) max_ms=(?P<max>[\d.]+)$"
)


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_a_tiny_fleet_reports_every_injected_xid() -> None:
    argv = [sys.executable, str(SCRIPT), "--agents", "3", "--processes", "2", "--samples", "5"]
    argv += ["--steady-seconds", "3", "--poll-interval", "1", "--concurrent", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    results = [m.groupdict() for m in map(RESULT.match, lines) if m]
    assert len(results) == 1, done.stdout
    r = results[0]
    assert (r["agents"], r["processes"], r["samples"], r["missed"]) == ("3", "2", "5", "0")
    assert 0 < float(r["p50"]) <= float(r["p99"]) <= float(r["max"])
    assert any(line.startswith("steady state, 3 agents:") for line in lines), done.stdout
    assert sum(1 for line in lines if re.match(r"^  worker \d: \d agents, CPU", line)) == 2, done.stdout
