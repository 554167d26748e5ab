"""Stale-gang dating (scheduler.cluster.short_gangs) with the engine, over random completion orders.

A batch Job, simulated as its controller runs it: it keeps ``min(parallelism,
completions - succeeded)`` pods, replaces a pod that failed or was evicted,
and creates none once enough succeeded. Between scheduling cycles its running
pods succeed or fail in a random order, and time passes, sometimes far past
the stale-gang grace. Every cycle dates short gangs as the scheduling cycle
does and runs the engine's session over the result; binds and evictions are
applied as the executors would.

What must hold: a gang that lost no member is never evicted (every running
member is one its controller keeps), however its members' completions
interleave; an eviction happens only to a gang that counts fewer running and
succeeded members than its minMember after a member failed; and the Job
always completes once its pods stop failing (the last pods place even when
fewer than minMember are left to run).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.short_gangs import ShortGangs
from scheduler.engine.model import Decisions, Job, SchedulerConfig, Snapshot, Task, TaskStatus
from scheduler.engine.session import run_session
from tests.scheduler.builders import node, queue

GRACE_S = 60.0


@dataclass
class BatchJob:
    """A Job and its pods, as the Job controller and the kubelets would leave them."""

    parallelism: int
    completions: int
    succeeded: int = 0
    failed: int = 0
    made: int = 0
    # name -> (node, GPU index) while running, None while pending.
    pods: dict[str, tuple[str, int] | None] = field(default_factory=dict)
    # Bumped whenever a pod changes, so an unchanged job is handed over as the same object.
    version: int = 0

    @property
    def min_member(self) -> int:
        return min(self.parallelism, self.completions)  # as the grouping sizes a Job

    def reconcile(self) -> None:
        """Create pods up to what the controller keeps active."""
        wanted = min(self.parallelism, self.completions - self.succeeded)
        while len(self.pods) < wanted:
            self.pods[f"p-{self.made}"] = None
            self.made += 1
            self.version += 1

    def running(self) -> list[str]:
        return sorted(name for name, at in self.pods.items() if at is not None)

    def finish(self, name: str, *, succeeded: bool) -> None:
        del self.pods[name]
        if succeeded:
            self.succeeded += 1
        else:
            self.failed += 1
        self.version += 1

    def to_job(self) -> Job:
        tasks = []
        for name, at in sorted(self.pods.items()):
            if at is None:
                tasks.append(Task(name=name, uid=name, cpu_milli=1000, memory_mib=1024, gpus=1))
            else:
                tasks.append(
                    Task(
                        name=name,
                        uid=name,
                        status=TaskStatus.RUNNING,
                        cpu_milli=1000,
                        memory_mib=1024,
                        gpus=1,
                        node=at[0],
                        gpu_indices=(at[1],),
                    )
                )
        return Job(
            name="batch",
            queue="q",
            uid="batch",
            min_member=self.min_member,
            tasks=tuple(tasks),
            succeeded=self.succeeded,
            failed=self.failed,
        )


@dataclass
class Cycles:
    """Runs cycles over the simulated Job, checking every eviction against what the Job lost."""

    batch: BatchJob
    gpus: int
    now: float = 1_000_000.0
    tracker: ShortGangs = field(default_factory=ShortGangs)
    lost_a_member: bool = False
    _job: tuple[int, Job] | None = None

    def job(self) -> Job:
        if self._job is None or self._job[0] != self.batch.version:
            self._job = (self.batch.version, self.batch.to_job())
        return self._job[1]

    def run(self) -> Decisions:
        self.batch.reconcile()
        nodes = tuple(node(f"n{i}", 4) for i in range((self.gpus + 3) // 4))
        snapshot = Snapshot(
            nodes=nodes,
            queues=(queue("q", self.gpus),),
            jobs=(self.job(),),
            now=self.now,
            config=SchedulerConfig(stale_gang_grace_s=GRACE_S),
        )
        job = self.job()
        running = sum(1 for t in job.tasks if t.status is TaskStatus.RUNNING)
        decisions = run_session(self.tracker.date(snapshot, self.now))
        if decisions.evictions:
            assert self.lost_a_member, f"evicted a gang that lost nothing: {decisions.evictions}"
            assert running + job.succeeded < job.min_member, "evicted a gang that counts its minMember"
        for eviction in decisions.evictions:
            del self.batch.pods[eviction.pod]  # gone; the controller makes a new one
            self.batch.version += 1
        for bind in decisions.binds:
            if bind.pod in self.batch.pods:
                self.batch.pods[bind.pod] = (bind.node, bind.gpu_indices[0])
                self.batch.version += 1
        return decisions


# One step between cycles: a running pod (by its position among them) ends,
# successfully or not, or time passes.
STEP = st.one_of(
    st.tuples(st.just("succeed"), st.integers(0, 7)),
    st.tuples(st.just("fail"), st.integers(0, 7)),
    st.tuples(st.just("wait"), st.sampled_from([0.0, 5.0, 59.0, 61.0, 600.0])),
)


def _play(parallelism: int, extra: int, spare: int, steps: list[tuple[str, float]], *, failures: bool) -> None:
    batch = BatchJob(parallelism=parallelism, completions=parallelism + extra)
    cycles = Cycles(batch, gpus=parallelism + spare)
    cycles.run()
    for kind, value in steps:
        if kind == "wait":
            cycles.now += value
        else:
            running = batch.running()
            if running:
                ok = kind == "succeed" or not failures
                batch.finish(running[int(value) % len(running)], succeeded=ok)
                cycles.lost_a_member |= not ok
        decisions = cycles.run()
        if not failures:
            assert decisions.evictions == ()
    # The pods stop failing: every running pod succeeds, cycle after cycle, until the Job is done.
    for _ in range(4 * batch.completions):
        if batch.succeeded >= batch.completions:
            break
        for name in batch.running():
            batch.finish(name, succeeded=True)
        cycles.now += GRACE_S * 2
        cycles.run()
    assert batch.succeeded == batch.completions, f"stuck: {batch}"


@settings(max_examples=150, deadline=None)
@given(
    parallelism=st.integers(1, 6),
    extra=st.integers(0, 6),
    spare=st.integers(0, 3),
    steps=st.lists(STEP, max_size=25),
)
def test_random_completion_orders_never_evict_a_member_the_controller_keeps(
    parallelism: int, extra: int, spare: int, steps: list[tuple[str, float]]
) -> None:
    _play(parallelism, extra, spare, steps, failures=False)


@settings(max_examples=150, deadline=None)
@given(
    parallelism=st.integers(1, 6),
    extra=st.integers(0, 6),
    spare=st.integers(0, 3),
    steps=st.lists(STEP, max_size=25),
)
def test_only_a_gang_that_lost_members_below_its_minimum_is_evicted(
    parallelism: int, extra: int, spare: int, steps: list[tuple[str, float]]
) -> None:
    _play(parallelism, extra, spare, steps, failures=True)


def _gang(*running: str, pending: int = 0, succeeded: int = 0, failed: int = 0, min_member: int = 4) -> Job:
    tasks = [
        Task(name=n, uid=n, status=TaskStatus.RUNNING, gpus=1, node="n0", gpu_indices=(i,))
        for i, n in enumerate(running)
    ]
    tasks += [Task(name=f"w-{i}", uid=f"w-{i}", gpus=1) for i in range(pending)]
    return Job(name="g", queue="q", min_member=min_member, tasks=tuple(tasks), succeeded=succeeded, failed=failed)


def _dated(tracker: ShortGangs, job: Job, now: float) -> float | None:
    (out,) = tracker.date(Snapshot(jobs=(job,)), now).jobs
    return out.below_min_member_since


def test_a_gang_that_lost_a_running_member_is_dated_from_when_it_was_first_seen_short() -> None:
    tracker = ShortGangs()
    assert _dated(tracker, _gang("a", "b", "c", "d"), 10.0) is None
    short = _gang("a", "b", "c", pending=1)
    assert _dated(tracker, short, 20.0) == 20.0
    assert _dated(tracker, short, 30.0) == 20.0  # the same job handed over again keeps its date
    assert _dated(tracker, _gang("a", "b", "c", "e"), 40.0) is None  # whole again
    assert tracker.since == {}


def test_a_gang_still_growing_to_its_minimum_is_never_dated() -> None:
    # The operator creates the rest later (in stages, or slowly): nothing was lost.
    tracker = ShortGangs()
    assert _dated(tracker, _gang("leader", pending=0), 10.0) is None
    assert _dated(tracker, _gang("leader", pending=3), 20.0) is None
    assert _dated(tracker, _gang("leader", "w-0", pending=2), 30.0) is None


def test_a_failed_member_dates_a_short_gang_even_if_this_replica_never_saw_it_run() -> None:
    tracker = ShortGangs()
    assert _dated(tracker, _gang("a", "b", "c", pending=1, failed=1), 10.0) == 10.0


def test_members_that_succeeded_keep_a_gang_whole() -> None:
    tracker = ShortGangs()
    assert _dated(tracker, _gang("a", "b", "c", "d"), 10.0) is None
    assert _dated(tracker, _gang("c", "d", succeeded=2), 20.0) is None
    assert _dated(tracker, _gang("d", succeeded=2, failed=1), 30.0) == 30.0  # one failed: 3 of 4
