"""A transaction over the working state: apply, roll back, commit.

Every action plans on a :class:`Statement`: it places and evicts pods for
real in the working state (so later steps of the same plan see the room they
made), and if the plan fails it rolls back to a mark, leaving the state as it
was. Rolling back replays an undo log in reverse through the exact inverse
primitives; nothing is copied, so a failed plan costs what it did, not the
size of the cluster.

Only committed work becomes a decision: :meth:`Statement.commit` hands the
tasks it touched to the cluster, which the session turns into binds and
evictions at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction
from scheduler.engine.state import Cluster, EvictionRecord, NodeState, TaskState

_ALLOCATE = 0
_EVICT = 1
_UNRESERVE = 2


@dataclass(slots=True)
class _Entry:
    kind: int
    task: TaskState
    node: NodeState | None = None
    positions: tuple[int, ...] = ()
    slices: tuple[int, ...] = ()
    eviction: EvictionRecord | None = None


@dataclass(slots=True, eq=False)
class Statement:
    cluster: Cluster
    log: list[_Entry] = field(default_factory=list)

    def allocate(self, task: TaskState, node: NodeState, positions: tuple[int, ...], slices: tuple[int, ...]) -> None:
        self.cluster.take(task, node, positions, slices)
        self.log.append(_Entry(_ALLOCATE, task))
        self.cluster.applied += 1

    def evict(self, task: TaskState, action: EvictionAction, reason: str, beneficiary: str | None) -> None:
        node = task.node
        assert node is not None
        entry = _Entry(_EVICT, task, node, task.gpu_pos, task.slices, task.eviction)
        self.cluster.release(task)
        task.eviction = EvictionRecord(action, reason, beneficiary)
        self.log.append(entry)
        self.cluster.applied += 1

    def unreserve(self, placeholder: TaskState) -> None:
        """Free a job's reserved room for the job itself to be placed into.

        Not an eviction and no decision: a placeholder is no pod. A rollback
        seats it again, so a job that still does not fit keeps its room.
        """
        node = placeholder.node
        assert node is not None and placeholder.placeholder
        entry = _Entry(_UNRESERVE, placeholder, node, placeholder.gpu_pos, placeholder.slices)
        self.cluster.release(placeholder)
        self.log.append(entry)
        self.cluster.applied += 1

    def mark(self) -> int:
        return len(self.log)

    def rollback(self, mark: int = 0) -> None:
        """Undo everything after ``mark``, newest first."""
        log = self.log
        cluster = self.cluster
        while len(log) > mark:
            entry = log.pop()
            cluster.applied -= 1
            if entry.kind == _ALLOCATE:
                cluster.release(entry.task, undo=True)
            else:
                assert entry.node is not None
                cluster.take(entry.task, entry.node, entry.positions, entry.slices)
                if entry.kind == _EVICT:
                    entry.task.eviction = entry.eviction

    def undo_committed(self) -> None:
        """Undo every statement the cluster's journal holds, newest first.

        The inverse of a whole session's work, so that the state can serve
        the next one (:mod:`scheduler.engine.incremental`).
        """
        journal = self.cluster.journal
        assert journal is not None and not self.log
        self.log = journal
        self.rollback()
        self.cluster.journal = []

    def commit(self) -> None:
        if not self.log:
            return
        touched = self.cluster.touched
        for entry in self.log:
            if entry.kind == _UNRESERVE:
                continue
            touched.append(entry.task)
            if entry.kind == _EVICT and entry.node is not None:
                entry.node.evicted_here = True
        self.cluster.commit_version += 1
        if self.cluster.journal is not None:
            self.cluster.journal.extend(self.log)
        self.log = []
