"""The fill benchmark runs end to end (``--quick``): every contender fills the cluster and is reported.

The figures themselves depend on the machine and are not judged here; what is
checked is that each contender bound every pod, no node got more pods than
GPUs, and the summary lines a reader (or a script) relies on are all there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "scheduler_fill.py"
CONTENDERS = {"gpuwarden", "kube-scheduler", "kube-scheduler-tuned", "bare-1", "bare-8", "bare-32"}
RESULT = re.compile(
    r"^result workload=(?P<workload>\S+) contender=(?P<contender>\S+) runs=(?P<runs>\d+) "
    r"min=(?P<min>[\d.]+) median=(?P<median>[\d.]+) overfilled_nodes=(?P<over>\d+)$"
)
RATIO = re.compile(r"^ratio workload=(?P<workload>\S+) (?P<name>\S+)=(?P<value>[\d.]+)$")


@pytest.mark.k8s
@pytest.mark.timeout(600)
def test_quick_fill_reports_every_contender() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=580, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    results = [m.groupdict() for m in map(RESULT.match, lines) if m]
    seen = {(r["workload"], r["contender"]) for r in results}
    for name in CONTENDERS:
        assert ("backlog", name) in seen, done.stdout
    for name in CONTENDERS - {"bare-1", "bare-8", "bare-32"}:
        assert ("created", name) in seen, done.stdout
    assert ("created", "pod-creation") in seen
    for r in results:
        assert int(r["runs"]) >= 1
        assert 0 < float(r["min"]) <= float(r["median"])
        assert r["over"] == "0", f"{r['contender']} put more pods on a node than it has GPUs"
    ratios = {(m["workload"], m["name"]) for m in map(RATIO.match, lines) if m}
    assert ("created", "gpuwarden/kube-scheduler-tuned") in ratios
    assert ("backlog", "gpuwarden/kube-scheduler-tuned") in ratios
    assert ("backlog", "gpuwarden/bare-ceiling") in ratios
