"""benchmarks/scheduler_churn.py at a tiny size: both sides run, stay incremental and bind alike; the loop collects."""

from __future__ import annotations

import pytest

from benchmarks import scheduler_churn


def test_the_churn_benchmark_runs_both_sides_and_they_agree(capsys: pytest.CaptureFixture[str]) -> None:
    # More foreign pods than cycles: the last one ending would take its external queue away (a rebuild).
    args = ["--nodes", "8", "--foreign", "48", "--ours", "6", "--finished", "5", "--cycles", "12", "--runs", "2"]
    args += ["--gc-cycles", "12", "--young-limit", "200"]
    assert scheduler_churn.main(args) == 0
    out = capsys.readouterr().out
    assert "jobs diffed by sets (before): prepare and decide per cycle min" in out
    assert "job_delta (now): prepare and decide per cycle min" in out
    assert "binds: 42 per run" in out  # the warm-up's 30 too: every arrival bound, one per cycle
    assert "an arrival's turn, folding the ends in itself (before): min" in out
    assert "an arrival's turn, ends folded in first (now): min" in out
    assert "the status writer's call, a pass over every running group (before): min" in out
    assert "the status writer's call, told what changed (now): min" in out
    assert "status patches: 0 per run" in out  # bare pods: placed and ended, their groups have no news
    assert "collections automatic at 50000/10/10, first cycles frozen (before):" in out
    now = next(line for line in out.splitlines() if "collections by the loop between cycles" in line)
    assert "young limit 200, survivors frozen (now): " in now and "(none ran)" not in now
    assert "a full collection of the whole process, thawed: min" in out
