"""The summary printed when the demo ends: what failed, what remediation did, what it cost, how fast it ran.

Built from what the API showed during the run (:class:`~demo.observe.History`)
and the last read of it: the faults injected with when their condition,
quarantine and return showed; the escalations people took; the work evicted
from faulty nodes and placed again; GPU-hours each queue held against its
fair share, and the work lost to faults from each Queue's
``status.gpuSecondsLostToFaults``; the whole-GPU pods the kubelet's device
manager started on a quarantined GPU (the gap of device-plugin nodes) and
how fast the scheduler moved them off; and the worst lag of scheduler cycles
and agent polls against their periods, which says whether this machine
kept up in real time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from demo.faults import Injected, Repair
from demo.kubelet import Landing
from demo.observe import History, Snapshot, Span
from demo.view import ordered_queues
from scheduler.remediation.steps import EventReason


@dataclass(slots=True)
class CycleLag:
    """How late scheduler cycles started against the scheduler's period."""

    period_s: float
    cycles: int = 0
    longest_s: float = 0.0
    worst_s: float = 0.0
    _last_start: float | None = None

    def cycle(self, ended: float, seconds: float) -> None:
        start = ended - seconds
        if self._last_start is not None:
            self.worst_s = max(self.worst_s, start - self._last_start - self.period_s)
        self._last_start = start
        self.longest_s = max(self.longest_s, seconds)
        self.cycles += 1


@dataclass(frozen=True, slots=True)
class Performance:
    cycles: CycleLag
    agent_polls: int
    agent_worst_lag_s: float
    poll_interval_s: float
    agents: int


# The remediation Events a fault's story is told by: all but the dry run's and the bookkeeping's.
REMEDIATION_REASONS = frozenset(r.value for r in EventReason) - {
    EventReason.DRY_RUN.value,
    EventReason.DRY_RUN_DISCARDED.value,
    EventReason.RECORD_UNREADABLE.value,
}


def _after(spans: Sequence[Span], t: float) -> Span | None:
    """The first stretch still open at ``t`` or begun after it: the one this fault caused."""
    return next((s for s in spans if s.end_s is None or s.end_s >= t), None)


def _rel(t: float | None, base: float) -> str:
    return "-" if t is None else f"+{t - base:.1f}s"


def fault_lines(injected: Sequence[Injected], history: History, repairs: Sequence[Repair]) -> list[str]:
    lines = []
    for inj in injected:
        f = inj.fault
        what = f.inject + "".join(f" {k}={v}" for k, v in f.params().items())
        seen = sorted(
            (t, ctype, reason)
            for (node, ctype, reason), t in history.first_condition.items()
            if node == inj.node and t >= inj.at_s - 0.5
        )
        condition = f"{seen[0][1]}/{seen[0][2]} {_rel(seen[0][0], inj.at_s)}" if seen else "not seen between two reads"
        parts = [
            f"t={inj.at_s:5.1f}s {inj.node}: {what} ({f.note})" if f.note else f"t={inj.at_s:5.1f}s {inj.node}: {what}"
        ]
        parts.append(f"    condition {condition}")
        node_span = _after(history.node_quarantine.get(inj.node, []), inj.at_s)
        gpu_spans = {
            index: _after(spans, inj.at_s)
            for (node, index), spans in history.gpu_quarantine.items()
            if node == inj.node
        }
        for index, span in sorted(gpu_spans.items()):
            if span is not None:
                back = f"returned {_rel(span.end_s, inj.at_s)}" if span.end_s is not None else "still out"
                parts.append(f"    GPU {index} quarantined {_rel(span.start_s, inj.at_s)}, {back}")
        if node_span is not None:
            back = f"returned {_rel(node_span.end_s, inj.at_s)}" if node_span.end_s is not None else "still out"
            parts.append(f"    node quarantined (cordon + taint) {_rel(node_span.start_s, inj.at_s)}, {back}")
        for r in repairs:
            if r.node == inj.node and r.escalated_s >= inj.at_s - 0.5:
                parts.append(
                    f"    escalated {_rel(r.escalated_s, inj.at_s)}; people repaired it {_rel(r.repaired_s, inj.at_s)}"
                    f" and closed {r.ticket} {_rel(r.cleared_s, inj.at_s)}"
                )
        chain = [
            f"{reason} {_rel(t, inj.at_s)}"
            for t, node, reason, _ in history.node_events
            if node == inj.node and t >= inj.at_s - 1.0 and reason in REMEDIATION_REASONS
        ]
        parts.append("    remediation: " + (", ".join(chain) if chain else "nothing"))
        lines.extend(parts)
    return lines


def landing_line(landed: Sequence[Landing]) -> str:
    """How many pods the device manager put on a quarantined GPU, and how fast evictions moved them off.

    Only the pods that left by eviction are timed: one that finished its
    work first was not moved, and timing it would flatter the scheduler.
    """
    if not landed:
        return "device manager: no pod started on a quarantined GPU"
    stays = sorted(x.left_at - x.at for x in landed if x.left_at is not None and x.evicted)
    finished = sum(1 for x in landed if x.left_at is not None and not x.evicted)
    still = sum(1 for x in landed if x.left_at is None)
    moved = (
        f"{len(stays)} evicted off it in {_median(stays):.1f} s (median), {stays[-1]:.1f} s at worst"
        if stays
        else "none evicted off it yet"
    )
    return (
        f"device manager: {len(landed)} {'pod' if len(landed) == 1 else 'pods'} started on a quarantined GPU "
        "(the device plugin still offered it); "
        f"{moved}"
        + (f"; {finished} finished there first" if finished else "")
        + (f"; {still} still there" if still else "")
    )


def _median(values: Sequence[float]) -> float:
    """The median of sorted ``values`` (the mean of the middle two for an even count)."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def render_summary(
    *,
    duration_s: float,
    nodes: int,
    gpus_per_node: int,
    injected: Sequence[Injected],
    skipped: int,
    history: History,
    repairs: Sequence[Repair],
    evicted: Sequence[tuple[float, str, str]],
    final: Snapshot,
    performance: Performance,
    kubeconfig: str,
    landed: Sequence[Landing] = (),
) -> str:
    out = [f"== gpuwarden demo: summary after {duration_s:.0f} s, {nodes} nodes x {gpus_per_node} GPUs =="]
    out.append("faults (when injected; condition, quarantine and return after it):")
    out.extend(fault_lines(injected, history, repairs) or ["    none injected"])
    if skipped:
        out.append(f"    ({skipped} scheduled fault(s) name a node beyond --nodes and were left out)")
    faulty = {inj.node for inj in injected}
    evicted_here = [(t, node, job) for t, node, job in evicted if node in faulty]
    replaced = {
        job
        for t, node, job in evicted_here
        if any(j == job and n != node and seen >= t - 0.5 for (j, n), seen in history.placements.items())
    }
    jobs = {job for _, _, job in evicted_here}
    out.append(
        f"work: {len(evicted_here)} pods of {len(jobs)} jobs evicted from faulty nodes, {len(replaced)} of those jobs "
        f"placed again on other nodes; {len(evicted)} evictions in all"
    )
    out.append(landing_line(landed))
    out.append("remediation states recorded on the Nodes:")
    per_node: dict[str, list[str]] = {}
    for _, node, before, after in history.states:
        per_node.setdefault(node, [before]).append(after)
    out.extend(f"    {node}: {' -> '.join(states)}" for node, states in sorted(per_node.items()))
    if not per_node:
        out.append("    none")
    out.append("queues (GPU-hours allocated against fair share over the run; now; lost to faults):")
    for depth, q in ordered_queues(final.queues):
        alloc = history.allocated_gpu_s.get(q.name, 0.0) / 3600
        fair = history.fair_gpu_s.get(q.name, 0.0) / 3600
        out.append(
            f"    {'  ' * depth}{q.name:<12} {alloc:6.2f} GPU-h of fair {fair:6.2f} GPU-h; now {q.allocated:g} of "
            f"{q.fair_share:g} GPUs; lost {q.lost_gpu_seconds:.0f} GPU-s ({q.lost_gpu_seconds / 3600:.3f} GPU-h)"
        )
    c = performance.cycles
    out.append(
        f"performance: scheduler {c.cycles} cycles, longest {c.longest_s:.3f} s, worst lag {max(0.0, c.worst_s):.3f} s "
        f"beyond its {c.period_s:g} s period; {performance.agents} agents, {performance.agent_polls} polls, worst lag "
        f"{max(0.0, performance.agent_worst_lag_s):.3f} s beyond the {performance.poll_interval_s:g} s poll interval"
    )
    out.append(f"(the cluster is gone now; its kubeconfig was {kubeconfig})")
    return "\n".join(out)
