"""The kept working state decides exactly what a fresh build decides.

:class:`~scheduler.engine.incremental.Engine` undoes each session and applies
the next snapshot as a difference; every session over a sequence of
snapshots must return what ``run_session`` returns on the same snapshot.
The sequences are what a scheduler sees: binds come back as running pods
(some jobs' objects are new, the rest the very same objects), evicted pods
terminate and go, jobs come and go, a node's health or cordon changes, the
room a session reserved comes back as the next snapshot's reservations.
"""

from __future__ import annotations

import gc
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action, ConditionType
from scheduler.engine.build import build_cluster
from scheduler.engine.incremental import Engine, job_delta
from scheduler.engine.model import Decisions, Gpu, Job, Node, NodeCondition, Queue, Snapshot, Task, TaskStatus
from scheduler.engine.session import run_session
from scheduler.engine.state import JobState
from tests.scheduler.engine.test_properties import TAINTS, snapshots, with_running_work


def _next(snapshot: Snapshot, decisions: Decisions, data: st.DataObject, step: int) -> Snapshot:
    """The cluster after ``decisions`` acted on ``snapshot``, and some of it changed."""
    binds = {(b.job, b.pod): b for b in decisions.binds}
    evicted = {(e.job, e.pod) for e in decisions.evictions}
    jobs: list[Job] = []
    for job in snapshot.jobs:
        touched = any((job.key, t.name) in binds or (job.key, t.name) in evicted for t in job.tasks)
        # sampled_from shrinks to its first element and draws uniformly, so
        # rare changes stay rare (integers(0, n) == 0 is drawn far more often).
        if data.draw(st.sampled_from([False] * 9 + [True]), label="drop job"):
            continue
        if not touched or data.draw(st.booleans(), label="watch has not shown it yet"):
            jobs.append(job)  # the very same object: unchanged
            continue
        tasks: list[Task] = []
        for task in job.tasks:
            bind = binds.get((job.key, task.name))
            if (job.key, task.name) in evicted:
                if data.draw(st.booleans(), label="terminating"):
                    tasks.append(replace(task, status=TaskStatus.RELEASING))
                continue
            if bind is not None:
                tasks.append(replace(task, status=TaskStatus.RUNNING, node=bind.node, gpu_indices=bind.gpu_indices))
            else:
                tasks.append(task)
        if tasks:
            short = job.below_min_member_since
            if job.min_member > 1 and data.draw(st.booleans(), label="gang dated short"):
                short = snapshot.now - data.draw(st.sampled_from([10.0, 10_000.0]), label="short for")
            jobs.append(
                replace(
                    job,
                    tasks=tuple(tasks),
                    min_member=min(job.min_member, len(tasks)),
                    below_min_member_since=short,
                )
            )
    if data.draw(st.booleans(), label="new job"):
        queue = data.draw(st.sampled_from([q.name for q in snapshot.queues]), label="queue")
        gpus = data.draw(st.integers(0, 2), label="gpus")
        jobs.append(
            Job(
                f"new{step}",
                queue,
                priority=100,
                created=100.0 + step,
                tasks=(Task(f"new{step}-0", gpus=gpus, cpu_milli=500),),
            )
        )
    nodes = list(snapshot.nodes)
    if data.draw(st.booleans(), label="a node changes"):
        i = data.draw(st.integers(0, len(nodes) - 1), label="node")
        node = nodes[i]
        change = data.draw(
            st.sampled_from(["cordon", "drain", "gpu", "xid", "heal", "taint", "zone", "resize"]), label="change"
        )
        if change == "resize":
            # What the pool offers intact (the quota shortfalls' measure) is kept with the state.
            node = replace(node, cpu_milli=node.cpu_milli // 2, memory_mib=node.memory_mib * 2)
        elif change == "taint":
            # What placement worked out from the old taints (kept between sessions) must not outlive them.
            taints = () if node.taints else (data.draw(st.sampled_from(TAINTS), label="taint"),)
            node = replace(node, taints=taints)
        elif change == "zone":
            node = replace(node, labels={**node.labels, "zone": "b" if node.labels.get("zone") == "a" else "a"})
        elif change == "cordon":
            node = replace(node, schedulable=not node.schedulable)
        elif change == "drain":
            node = replace(node, draining=not node.draining)
        elif change == "gpu" and node.gpus:
            g = data.draw(st.integers(0, len(node.gpus) - 1), label="gpu")
            gpus = list(node.gpus)
            gpus[g] = replace(gpus[g], healthy=not gpus[g].healthy)
            node = replace(node, gpus=tuple(gpus))
        elif change == "xid" and node.gpus:
            xid = NodeCondition(ConditionType.GPU_XID_ERROR.value, True, "Xid48", "", Action.RESET_GPU, (0,))
            node = replace(node, conditions=(xid,))
        else:
            node = replace(node, conditions=(), draining=False, schedulable=True)
        nodes[i] = node
    queues = snapshot.queues
    if data.draw(st.sampled_from([False] * 11 + [True]), label="queues change"):
        queues = tuple(
            Queue(q.name, parent=q.parent, priority=q.priority, gpu=q.gpu, cpu=q.cpu, memory=q.memory) for q in queues
        )
        queues = (*queues[:-1], replace(queues[-1], priority=queues[-1].priority + 1))
    return Snapshot(
        tuple(nodes),
        queues,
        tuple(jobs),
        now=snapshot.now + 10.0,
        config=snapshot.config,
        reservations=decisions.reservations,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots(), st.data())
def test_kept_state_decides_as_a_fresh_build(first: Snapshot, data: st.DataObject) -> None:
    engine = Engine()
    snapshot = with_running_work(first) if data.draw(st.booleans(), label="running work") else first
    for step in range(8):
        fresh = run_session(snapshot)
        kept = engine.run(snapshot)
        assert kept == fresh, f"step {step}: the kept state decided differently"
        _assert_lists_as_built(engine, snapshot)
        snapshot = _next(snapshot, fresh, data, step)
    assert engine.updates + engine.rebuilds == 8


def test_unchanged_snapshot_is_an_update_not_a_rebuild() -> None:
    first = with_running_work(
        Snapshot(
            nodes=(Node("n0", cpu_milli=8000, memory_mib=65536, gpus=(Gpu(0), Gpu(1))),),
            queues=(Queue("q"),),
            jobs=(Job("j", "q", tasks=(Task("j-0", gpus=1, cpu_milli=100),)),),
        )
    )
    engine = Engine()
    assert engine.run(first) == run_session(first)
    again = replace(first, now=first.now + 1)
    assert engine.run(again) == run_session(again)
    assert (engine.rebuilds, engine.updates) == (1, 1)


def test_a_job_that_leaves_the_kept_state_leaves_no_reference_cycle_behind() -> None:
    """Departures are freed as they go: cyclic garbage from every finished job made the collector pause the process."""
    nodes = (Node("n0", cpu_milli=8000, memory_mib=65536, gpus=(Gpu(0), Gpu(1))),)
    running = Task("ran-0", gpus=1, cpu_milli=100, status=TaskStatus.RUNNING, node="n0", gpu_indices=(0,))
    jobs = (
        Job("ran", "q", tasks=(running,)),
        Job("waits", "q", tasks=(Task("waits-0", gpus=4, cpu_milli=100),)),  # never fits: its task stays unplaced
        Job("stays", "q", tasks=(Task("stays-0", gpus=1, cpu_milli=100),)),
    )
    first = Snapshot(nodes, (Queue("q"),), jobs)
    engine = Engine()
    engine.run(first)
    after = replace(first, jobs=jobs[2:], now=1.0)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        engine.run(after)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("scheduler.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert engine.updates == 1
    assert left == []
    assert engine.run(replace(after, now=2.0)) == run_session(replace(after, now=2.0))


def test_a_changed_node_is_updated_in_place() -> None:
    nodes = tuple(Node(f"n{i}", cpu_milli=8000, memory_mib=65536, gpus=(Gpu(0), Gpu(1))) for i in range(3))
    running = Task("a-0", gpus=1, cpu_milli=100, status=TaskStatus.RUNNING, node="n1", gpu_indices=(1,))
    jobs = (Job("a", "q", tasks=(running,)), Job("b", "q", tasks=(Task("b-0", gpus=2, cpu_milli=100),)))
    first = Snapshot(nodes, (Queue("q"),), jobs)
    engine = Engine()
    assert engine.run(first) == run_session(first)
    sick = replace(nodes[0], gpus=(Gpu(0, healthy=False), Gpu(1)))
    second = replace(first, nodes=(sick, nodes[1], nodes[2]), now=1.0)
    decided = engine.run(second)
    assert decided == run_session(second)
    assert (engine.rebuilds, engine.updates) == (1, 1)
    assert [b.node for b in decided.binds] == ["n2"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots(), st.data())
def test_a_kept_state_dropped_whole_leaves_no_reference_cycle_behind(first: Snapshot, data: st.DataObject) -> None:
    """A rebuild frees the state it replaces at once: the scheduler process looks at old objects only hourly."""
    snapshot = with_running_work(first) if data.draw(st.booleans(), label="running work") else first
    engine = Engine()
    decided = engine.run(snapshot)
    # The room it reserved comes back, and a node joins: nodes came, the state is built afresh.
    joined = Node("joined", cpu_milli=8000, memory_mib=65536, gpus=(Gpu(0),))
    after = replace(
        snapshot, nodes=(*snapshot.nodes, joined), reservations=decided.reservations, now=snapshot.now + 1.0
    )
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        engine.run(after)
        dropped = data.draw(st.booleans(), label="dropped at once")
        if dropped:
            engine.drop()
        gc.collect()
        left = sorted({type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("scheduler.")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert engine.rebuilds == 2
    assert left == []


def test_a_nodes_holders_keep_the_builds_order_when_pods_share_a_name_across_namespaces() -> None:
    """Health eviction names the first faulted holder it meets: the order must survive an undo."""
    running = TaskStatus.RUNNING
    node = Node("n0", cpu_milli=8000, memory_mib=65536, gpus=(Gpu(0, healthy=False), Gpu(1, healthy=False), Gpu(2)))
    tasks = (
        Task("p", namespace="ns1", gpus=1, cpu_milli=100, status=running, node="n0", gpu_indices=(0,)),
        Task("p", namespace="ns2", gpus=1, cpu_milli=100, status=running, node="n0", gpu_indices=(1,)),
        Task("q", namespace="ns1", gpus=1, cpu_milli=100, status=running, node="n0", gpu_indices=(2,)),
    )
    first = Snapshot((node,), (Queue("q"),), (Job("j", "q", min_member=3, tasks=tasks),))
    engine = Engine()
    assert engine.run(first) == run_session(first)
    again = replace(first, now=1.0)
    assert engine.run(again) == run_session(again)
    assert engine.updates == 1


def _assert_lists_as_built(engine: Engine, snapshot: Snapshot) -> None:
    """The kept state's work lists hold what a build of ``snapshot`` puts there, in the build's order.

    Decisions alone would miss a list that is wrong only where an action
    rarely looks (a stale gang, a sick node): the lists are compared
    themselves.
    """
    kept = engine._kept  # the invariant is about the kept state itself
    if kept is None:
        return
    built = build_cluster(snapshot)
    state = kept.cluster

    def keys(jobs: list[JobState]) -> list[str]:
        return [job.key for job in jobs]

    assert keys(state.jobs) == keys(built.jobs)
    assert keys(state.pending_jobs) == keys(built.pending_jobs)
    assert keys(state.dated_gangs) == keys(built.dated_gangs)
    assert [n.name for n in state.sick] == [n.name for n in built.sick]
    for name, queue in built.queues.items():
        assert keys(state.queues[name].jobs) == keys(queue.jobs), f"queue {name}"
    assert state.reserving == []  # taken back with the session


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 40), st.data())
def test_the_job_delta_is_the_set_difference_or_admits_it_cannot_tell(size: int, data: st.DataObject) -> None:
    """Random edits of a job tuple (removals, replacements, insertions, moves): exact, or None, never wrong."""
    old = tuple(Job(name=f"j{i}", queue="q", tasks=()) for i in range(size))
    new = list(old)
    for _ in range(data.draw(st.integers(0, 8))):
        edit = data.draw(st.sampled_from(("remove", "replace", "insert", "append", "move")))
        at = data.draw(st.integers(0, max(0, len(new) - 1)))
        if edit == "remove" and new:
            del new[at]
        elif edit == "replace" and new:
            new[at] = replace(new[at])  # an equal job, another object: a change to the engine
        elif edit == "insert":
            new.insert(at, Job(name=f"x{len(new)}", queue="q", tasks=()))
        elif edit == "append":
            new.append(Job(name=f"y{len(new)}", queue="q", tasks=()))
        elif edit == "move" and new:
            new.insert(data.draw(st.integers(0, len(new) - 1)), new.pop(at))
    known = {id(job): job for job in old}
    delta = job_delta(old, tuple(new), known)
    new_ids = {id(job) for job in new}
    expected_gone = {id(job) for job in old if id(job) not in new_ids}
    expected_added = {id(job) for job in new if id(job) not in known}
    moved = [job for job in new if id(job) in known]
    if delta is None:
        # Only when a kept job moved out of its order (or too much changed).
        assert moved != [job for job in old if id(job) in new_ids] or len(expected_gone) + len(expected_added) > 64
        return
    gone, added = delta
    assert sorted(map(id, gone)) == sorted(expected_gone) and len(gone) == len(expected_gone)
    assert sorted(map(id, added)) == sorted(expected_added) and len(added) == len(expected_added)
