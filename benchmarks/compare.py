"""Run one benchmark script on two commits, interleaved, and print every figure side by side.

A restructuring must not cost speed, and on a small, noisy machine two runs
made minutes apart differ more than the change does. This script checks the
older commit out into a temporary git worktree, then alternates runs of the
same benchmark on the old tree and on the working tree (old, new, new, old,
...), so drift in the machine's load lands on both sides alike. Every printed
line that carries a figure with a unit (``0.35 s``, ``14.9 ms``, ``49.5 MiB``)
becomes one row, keyed by the line's text with its numbers taken out; the
table gives the min and the median of each side per figure.

Run: ``python benchmarks/compare.py --ref OLD_COMMIT [--runs 3] benchmarks/scheduler_cycle.py [ARGS...]``.
The script path and its arguments are the same on both sides, so a benchmark
that changed its flags in between cannot be compared this way.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A number directly followed by a unit; the unit stays in the row's key.
FIGURE = re.compile(r"(?<![\w.])([-+]?\d+(?:,\d{3})*(?:\.\d+)?)\s*(ms|s|MiB|x)\b")


def figures(output: str) -> dict[str, list[float]]:
    """Each line's figures, keyed by the line with the numbers replaced by ``#``."""
    found: dict[str, list[float]] = {}
    for line in output.splitlines():
        values = [float(m.group(1).replace(",", "")) for m in FIGURE.finditer(line)]
        if not values:
            continue
        key = re.sub(r"\s+", " ", re.sub(r"\d+(?:,\d{3})*(?:\.\d+)?", "#", line)).strip()
        while key in found:  # the same shape of line twice: keep both
            key += " '"
        found[key] = values
    return found


def run(tree: Path, script: str, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(tree / script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed in {tree} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", required=True, help="the older commit to compare against")
    parser.add_argument("--runs", type=int, default=3, help="runs per side")
    parser.add_argument("script", help="benchmark script, relative to the repository root")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), opts.ref], check=True)
        try:
            sides = {"old": old, "new": ROOT}
            samples: dict[str, dict[str, list[list[float]]]] = {"old": defaultdict(list), "new": defaultdict(list)}
            order: list[str] = []
            for i in range(opts.runs):
                for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    print(f"run {i + 1}/{opts.runs} {side}", file=sys.stderr, flush=True)
                    for key, values in figures(run(sides[side], opts.script, opts.args)).items():
                        if key not in order:
                            order.append(key)
                        samples[side][key].append(values)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)

    print(
        f"{opts.script} {' '.join(opts.args)}: {opts.ref} (old) against the working tree (new), {opts.runs} runs each"
    )
    print("figure | old min / median | new min / median")
    for key in order:
        cells = []
        for side in ("old", "new"):
            runs = samples[side].get(key, [])
            if not runs:
                cells.append("absent")
                continue
            columns = list(zip(*runs, strict=False))
            cells.append("; ".join(f"{min(c):g} / {statistics.median(c):g}" for c in columns))
        print(f"{key} | {cells[0]} | {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
