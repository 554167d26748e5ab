"""The soak benchmark runs end to end at a tiny size (``--quick``: 10 nodes, 15 s of arrivals, 4 s jobs).

What is checked is that the real scheduler process bound the arriving work
(single GPUs, slices and gangs), that every figure a reader relies on is
printed (the interval lines, both windows, the targets, the engine's share,
the stand-in kubelet's lag, CPU per quiet cycle), and that nothing of the
run is left behind: no control plane or scheduler process, no run folder.
The figures themselves depend on the machine and are not judged here.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuwarden.localcluster import RUN_DIR_PREFIX

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "scheduler_soak.py"
INTERVAL = re.compile(
    r"^at \d+ s: pending [\d,]+ \([\d,]+ jobs, oldest .+\) running [\d,]+ finished [\d,]+ evicted [\d,]+ \| "
    r"cycles (?P<cycles>\d+) mean .+ \| bind n=(?P<binds>\d+) p50 .+ \| kubelet lag run p99 .+ \| arrival lag p99 .+$"
)


def _left_behind(pid: int) -> list[str]:
    """Run folders of the benchmark's process, and processes whose command line names one."""
    marker = f"{RUN_DIR_PREFIX}{pid}-"
    found = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{marker}*")]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"pid {proc.name}: {command[:200]}")
    return found


@pytest.mark.k8s
@pytest.mark.timeout(240)
def test_quick_steady_soak_prints_its_figures_and_cleans_up() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--quick", "--mode", "steady"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=220)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    lines = out.splitlines()
    intervals = [m for m in map(INTERVAL.match, lines) if m]
    assert len(intervals) >= 3, out
    assert sum(int(m["cycles"]) for m in intervals) > 0, out
    assert sum(int(m["binds"]) for m in intervals) > 0, out
    starts = ["first window", "last window", "target cycle mean", "target bind p99", "engine share", "  per cycle:"]
    starts += ["stand-in kubelet lag", "quiet window", "target CPU per quiet cycle", "scheduler: cycles"]
    for start in starts:
        assert any(line.startswith(start) for line in lines), f"no line starting {start!r}:\n{out}"
    summary = "\n".join(line for line in lines if line.startswith(("first window", "last window")))
    for kind in ("single", "slice"):  # a gang may not come within so short a run
        assert f"{kind} p50" in summary, summary
    assert _left_behind(proc.pid) == [], out
