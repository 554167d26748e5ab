"""The live view: nodes with per-GPU health, queues, pending work and recent Events, or plain lines.

On a terminal, :class:`LiveView` redraws one screen a second with rich:
every node with one cell per GPU (free, a slice, busy; red when quarantined
or unhealthy), its active conditions and its remediation state, the queue tree
with fair share against allocation, the pending pod groups with the reason
the scheduler gives, and the newest Events. When stdout is not a terminal
(a pipe, CI, ``--no-tty``) :class:`PlainView` prints one line per interval
instead, which a log keeps readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from demo.observe import GpuView, NodeView, QueueView, Snapshot
from gpuwarden import contract

_STATE_STYLE = {
    contract.RemediationState.HEALTHY.value: "green",
    contract.RemediationState.QUARANTINED.value: "yellow",
    contract.RemediationState.DRAINING.value: "magenta",
    contract.RemediationState.REPAIRING.value: "cyan",
    contract.RemediationState.VALIDATING.value: "blue",
    contract.RemediationState.ESCALATED.value: "red",
    contract.RemediationState.FAILED.value: "bold red",
}


class View(Protocol):
    def show(self, snap: Snapshot) -> None: ...

    def close(self) -> None: ...


def _gpu_cell(gpu: GpuView) -> Text:
    if gpu.quarantined or not gpu.healthy:
        return Text("■", style="bold red")
    style = "blue" if gpu.used >= 0.999 else "cyan" if gpu.used > 0 else "green"
    char = "■" if gpu.used >= 0.999 else "◧" if gpu.used > 0 else "□"
    return Text(char, style=style)


def _node_table(nodes: Sequence[NodeView]) -> Table:
    table = Table(title="nodes", expand=True, show_edge=False, pad_edge=False)
    for col in ("node", "pool", "GPUs", "IB", "state", "conditions"):
        table.add_column(col, no_wrap=col != "conditions")
    for node in sorted(nodes, key=lambda n: n.name):
        cells = Text()
        for gpu in sorted(node.gpus, key=lambda g: g.index):
            cells.append_text(_gpu_cell(gpu))
        state = node.state + (" (cordoned)" if node.cordoned else "")
        table.add_row(
            node.name,
            node.pool,
            cells,
            f"{node.ib_up}/{node.ib_total}",
            Text(state, style=_STATE_STYLE.get(node.state, "white")),
            ", ".join(f"{t}/{r}" if r else t for t, r in node.conditions) or "-",
        )
    return table


def _depth(queue: QueueView, by_name: dict[str, QueueView]) -> int:
    depth, seen = 0, set()
    while queue.parent in by_name and queue.name not in seen:
        seen.add(queue.name)
        queue = by_name[queue.parent]
        depth += 1
    return depth


def ordered_queues(queues: Sequence[QueueView]) -> list[tuple[int, QueueView]]:
    """The tree in reading order: each department, then its projects; with each queue's depth."""
    by_name = {q.name: q for q in queues}
    children: dict[str, list[QueueView]] = {}
    for q in queues:
        children.setdefault(q.parent if q.parent in by_name else "", []).append(q)
    out: list[tuple[int, QueueView]] = []

    def walk(parent: str) -> None:
        for q in sorted(children.get(parent, []), key=lambda x: x.name):
            out.append((_depth(q, by_name), q))
            walk(q.name)

    walk("")
    return out


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


def _queue_table(queues: Sequence[QueueView]) -> Table:
    table = Table(title="queues (GPUs)", expand=True, show_edge=False, pad_edge=False)
    for col in ("queue", "quota", "limit", "fair share", "allocated", "requested", "lost GPU-s"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for depth, q in ordered_queues(queues):
        off = q.allocated - q.fair_share
        style = "green" if abs(off) <= 1 else "yellow" if off < 0 else "cyan"
        table.add_row(
            "  " * depth + q.name,
            _fmt(q.quota),
            _fmt(q.limit),
            _fmt(q.fair_share),
            Text(_fmt(q.allocated), style=style),
            _fmt(q.requested),
            f"{q.lost_gpu_seconds:.0f}",
        )
    return table


def render(snap: Snapshot, kubeconfig: str) -> Group:
    """One screen of the live view."""
    header = Text.assemble(
        ("gpuwarden demo", "bold"),
        f"  t={snap.elapsed_s:4.0f}s  pods running {snap.running_pods}, pending {snap.pending_pods}, "
        f"done {snap.succeeded_pods}   Ctrl-C stops\n",
        ("kubeconfig: ", "dim"),
        kubeconfig,
        ("   try: kubectl get nodes -L gpuwarden.io/state; kubectl get gpunodes; kubectl get queues", "dim"),
    )
    legend = Text("□ free  ◧ slice  ■ busy  ", style="dim")
    legend.append("■ quarantined/unhealthy", style="red")
    pending = Table(title="pending work", expand=True, show_edge=False, pad_edge=False)
    for col in ("pod group", "queue", "reason"):
        pending.add_column(col, no_wrap=col != "reason")
    for p in snap.pending[:8]:
        pending.add_row(p.group, p.queue, f"{p.reason}: {p.message}"[:160])
    if len(snap.pending) > 8:
        pending.add_row(f"... and {len(snap.pending) - 8} more", "", "")
    events = Table(title="recent events", expand=True, show_edge=False, pad_edge=False)
    for col in ("age", "object", "reason", "message"):
        events.add_column(col, no_wrap=col != "message")
    for ev in snap.events[:8]:
        events.add_row(
            f"{ev.age_s:.0f}s", ev.obj, Text(ev.reason, style="red" if ev.kind == "Warning" else ""), ev.message[:140]
        )
    return Group(
        Panel(header),
        _node_table(snap.nodes),
        legend,
        _queue_table(snap.queues),
        pending,
        events,
    )


class LiveView:
    """The redrawn terminal screen (rich), on stdout."""

    def __init__(self, kubeconfig: str) -> None:
        self._kubeconfig = kubeconfig
        self._console = Console()
        self._live = Live(console=self._console, auto_refresh=False, screen=False, transient=False)
        self._live.start()

    def show(self, snap: Snapshot) -> None:
        self._live.update(render(snap, self._kubeconfig), refresh=True)

    def close(self) -> None:
        self._live.stop()


def plain_line(snap: Snapshot) -> str:
    """One line for a log: nodes out and why, queues allocated/fair, pending, newest Event."""
    out = [n for n in snap.nodes if n.state != contract.RemediationState.HEALTHY.value or n.conditions]
    gpus = sum(len(n.gpus) for n in snap.nodes)
    healthy = sum(1 for n in snap.nodes for g in n.gpus if g.healthy and not g.quarantined)
    nodes = "; ".join(
        f"{n.name} {n.state}" + (f" [{','.join(t for t, _ in n.conditions)}]" if n.conditions else "") for n in out
    )
    queues = " ".join(f"{q.name} {_fmt(q.allocated)}/{_fmt(q.fair_share)}" for _, q in ordered_queues(snap.queues))
    newest = snap.events[0] if snap.events else None
    event = f" | event {newest.obj} {newest.reason}" if newest is not None else ""
    return (
        f"t={snap.elapsed_s:.0f}s gpus healthy {healthy}/{gpus} | pods running {snap.running_pods} "
        f"pending {snap.pending_pods} done {snap.succeeded_pods} | queues (allocated/fair) {queues} | "
        f"out: {nodes or 'none'}{event}"
    )


class PlainView:
    """Plain periodic lines, for output that is not a terminal."""

    def __init__(self, out: IO[str], every_s: float = 5.0) -> None:
        self._out = out
        self._every_s = every_s
        self._last: float | None = None

    def show(self, snap: Snapshot) -> None:
        if self._last is not None and snap.elapsed_s - self._last < self._every_s:
            return
        self._last = snap.elapsed_s
        print(plain_line(snap), file=self._out, flush=True)

    def close(self) -> None:
        return None
