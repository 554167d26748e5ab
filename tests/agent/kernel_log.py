"""A kernel log read at a known moment: the captured fixture and a clock that never moves."""

from __future__ import annotations

from pathlib import Path

from agent.probes.kmsg import ClockAnchor, KernelLogClock

FIXTURE = Path(__file__).parent / "fixtures" / "kmsg-mixed-drivers.txt"
BOOT = 1_700_000_000.0
UPTIME = 100_000.0
# Read at an uptime of UPTIME s on a node booted at BOOT, with no drift: a
# record stamped t s after boot is dated BOOT + t.
ANCHOR = ClockAnchor(wall_s=BOOT + UPTIME, kernel_s=UPTIME)


def fixed_clock(wall: float = BOOT + UPTIME, reference: float = UPTIME) -> KernelLogClock:
    return KernelLogClock(wall=lambda: wall, reference=lambda: reference)
