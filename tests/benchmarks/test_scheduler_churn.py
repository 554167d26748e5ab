"""benchmarks/scheduler_churn.py at a tiny size: both sides run, stay incremental and bind alike."""

from __future__ import annotations

import pytest

from benchmarks import scheduler_churn


def test_the_churn_benchmark_runs_both_sides_and_they_agree(capsys: pytest.CaptureFixture[str]) -> None:
    # More foreign pods than cycles: the last one ending would take its external queue away (a rebuild).
    args = ["--nodes", "8", "--foreign", "48", "--ours", "6", "--finished", "5", "--cycles", "12", "--runs", "2"]
    assert scheduler_churn.main(args) == 0
    out = capsys.readouterr().out
    assert "jobs diffed by sets (before): prepare and decide per cycle min" in out
    assert "job_delta (now): prepare and decide per cycle min" in out
    assert "binds: 42 per run" in out  # the warm-up's 30 too: every arrival bound, one per cycle
    assert "an arrival's turn, folding the ends in itself (before): min" in out
    assert "an arrival's turn, ends folded in first (now): min" in out
