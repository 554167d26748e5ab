"""The soak benchmark runs end to end at a tiny size (``--quick``: 10 nodes, 4 s jobs).

What is checked is that the real scheduler process bound the arriving work
(single GPUs and slices; a gang may not come in so short a run), that every
figure a reader relies on is printed (the interval lines, both windows, the
targets, the engine's share, the stand-in kubelet's lag, CPU per quiet
cycle; for the contender mode each phase and the per-minute ratios), and
that nothing of the run is left behind: no control plane or scheduler
process, no run folder. The figures themselves depend on the machine and
are not judged here.
"""

from __future__ import annotations

import re
import shutil
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


def _soak(mode: str, *extra: str) -> tuple[list[str], str]:
    """Run the benchmark's quick mode; its output lines, and what it left behind."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--quick", "--mode", mode, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    left = _left_behind(proc.pid)
    assert left == [], left
    return out.splitlines(), out


@pytest.mark.k8s
@pytest.mark.timeout(240)
def test_quick_steady_soak_prints_its_figures_and_cleans_up() -> None:
    lines, out = _soak("steady")
    intervals = [m for m in map(INTERVAL.match, lines) if m]
    assert len(intervals) >= 3, out
    assert sum(int(m["cycles"]) for m in intervals) > 0, out
    assert sum(int(m["binds"]) for m in intervals) > 0, out
    starts = ["first window", "last window", "target cycle mean", "target bind p99", "engine share", "  per cycle:"]
    starts += ["stand-in kubelet lag", "quiet window", "target CPU per quiet cycle", "scheduler: cycles"]
    for start in starts:
        assert any(line.startswith(start) for line in lines), f"no line starting {start!r}:\n{out}"
    summary = "\n".join(line for line in lines if line.startswith(("first window", "last window")))
    for kind in ("single", "slice"):
        assert f"{kind} p50" in summary, summary


@pytest.mark.k8s
@pytest.mark.timeout(240)
def test_quick_contender_soak_compares_both_schedulers_and_cleans_up() -> None:
    lines, out = _soak("contender")
    for phase in ("phase 1 gpuwarden", "phase 2 kube-scheduler"):
        bound = [int(m[1]) for line in lines if (m := re.match(rf"^{phase}: n=(\d+) bind p50 ", line))]
        assert len(bound) == 1, out
        assert bound[0] > 0, out
    ratios = [line for line in lines if re.match(r"^minute 1: gpuwarden p50 .+ ratio p50 [\d.]+x p99 [\d.]+x", line)]
    assert len(ratios) == 1, out
    assert any(line.startswith("target gpuwarden's bind p50 and p99 within 1.5x") for line in lines), out
    assert any(line.startswith("stand-in kubelet lag") for line in lines), out


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_quick_contender_soak_runs_a_baseline_checkout_in_phases_of_its_own(tmp_path: Path) -> None:
    """``--baseline``: the other checkout's scheduler takes its own phases, and both revisions get their ratios."""
    baseline = tmp_path / "baseline"
    shutil.copytree(REPO / "gpuwarden", baseline / "gpuwarden")
    shutil.copytree(REPO / "scheduler", baseline / "scheduler")
    shutil.copytree(REPO / "agent", baseline / "agent")
    shutil.copytree(REPO / "manifests", baseline / "manifests")
    lines, out = _soak("contender", f"--baseline={baseline}")
    phases = [m[1] for line in lines if (m := re.match(r"^phase \d+ ([\w-]+): n=\d+ bind p50 ", line))]
    assert phases == ["gpuwarden", "kube-scheduler", "baseline", "kube-scheduler"], out
    assert f"[1 gpuwarden] code from {REPO}" in lines and f"[3 baseline] code from {baseline}" in lines, out
    for side in ("gpuwarden", "baseline"):
        assert any(re.match(rf"^minute 1: {side} p50 .+ ratio p50 [\d.]+x p99 [\d.]+x", line) for line in lines), out
    assert any(line.startswith("ratio to kube-scheduler, p50, min / median over minutes: baseline ") for line in lines)
