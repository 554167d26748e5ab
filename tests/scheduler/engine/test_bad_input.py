"""Snapshots no healthy cluster produces: the session schedules what it can,
says on the job or in the log what was wrong, and never over-commits."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.model import Snapshot, Task
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, fraction, gpu_mib, job, node, pending, queue, running


def _warnings(logs: list[dict[str, object]]) -> list[str]:
    return [str(entry["event"]) for entry in logs if entry["log_level"] == "warning"]


def test_a_job_listed_twice_is_charged_and_placed_once() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2, gpu_limit=2),),
        jobs=(
            job("a", "q", running("a-0", "n1", (0,))),
            job("a", "q", running("a-0", "n1", (0,))),
            job("b", "q", pending("b-0", 1)),
        ),
    )
    with capture_logs() as logs:
        d = run_session(snap)
    assert "duplicate job in snapshot; keeping one" in _warnings(logs)
    # Counted twice, queue q would sit at its 2-GPU limit and b would be refused.
    assert binds_by_job(d) == {"b": [("b-0", "n1", (1,))]}
    assert next(s for s in d.queue_shares if s.queue == "q").allocated.gpu == 2000


def test_which_duplicate_is_kept_does_not_depend_on_input_order() -> None:
    wide = job("x", "q", pending("x-0", 2), priority=1)
    narrow = job("x", "q", pending("x-0", 1), priority=1)
    cluster = {"nodes": (node("n1", 2),), "queues": (queue("q", 2),)}
    first = run_session(Snapshot(jobs=(wide, narrow), **cluster))
    second = run_session(Snapshot(jobs=(narrow, wide), **cluster))
    assert first == second
    assert len(first.binds) == 1


def test_a_pod_in_two_jobs_is_seated_once() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2, gpu_limit=2),),
        jobs=(
            job("a", "q", running("shared-0", "n1", (0,))),
            job("b", "q", running("shared-0", "n1", (0,))),
            job("c", "q", pending("c-0", 1)),
        ),
    )
    with capture_logs() as logs:
        d = run_session(snap)
    assert "duplicate pod in snapshot; keeping the first" in _warnings(logs)
    assert binds_by_job(d) == {"c": [("c-0", "n1", (1,))]}


def test_running_pod_without_gpu_assignment_still_holds_its_gpus() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 4),),
        jobs=(
            job("r", "q", running("r-0", "n1", (), gpus=2)),
            job("p", "q", pending("p-0", 1)),
        ),
    )
    with capture_logs() as logs:
        d = run_session(snap)
    assert not d.binds, "both GPUs of n1 are in use by r-0"
    assert any(
        e["event"].startswith("running pod's GPUs partly unknown") and "names fewer GPUs than it requests" in e["why"]
        for e in logs
        if e["log_level"] == "warning"
    )
    assert d.pending[0].reasons[0].message.startswith("each pod needs 1 GPU")


def test_running_pod_naming_one_gpu_twice_holds_as_many_as_it_asked() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("q", 4),),
        jobs=(
            job("r", "q", running("r-0", "n1", (1, 1), gpus=2)),
            job("p", "q", pending("p-0", 2)),
        ),
    )
    d = run_session(snap)
    # r-0 is counted on GPU 1 and on the first free one, GPU 0.
    assert binds_by_job(d) == {"p": [("p-0", "n1", (2, 3))]}


def test_overlapping_running_pods_keep_the_gpu_taken_until_both_leave() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 4),),
        jobs=(
            job("a", "q", running("a-0", "n1", (0,))),
            job("b", "q", running("b-0", "n1", (0,))),
            job("p", "q", pending("p-0", 2)),
            job("s", "q", pending("s-0", 1)),
        ),
    )
    d = run_session(snap)
    assert binds_by_job(d) == {"s": [("s-0", "n1", (1,))]}


@pytest.mark.parametrize(
    ("task", "fragment"),
    [
        (pending("p-0", 9), "pod p-0 asks for 9 GPUs on one node; the largest node of pool default has 8"),
        (gpu_mib("p-0", 900_000), "asks for 900000 MiB of GPU memory per device; the largest GPU in pool default has"),
        (fraction("p-0", 0.5, devices=9), "asks for a GPU slice on 9 GPUs of one node; the largest node of pool"),
    ],
)
def test_a_request_no_node_could_ever_hold_says_so_and_evicts_nothing(task: Task, fragment: str) -> None:
    snap = Snapshot(
        nodes=(node("n1", 8), node("n2", 4)),
        queues=(queue("q", 8), queue("other", 0)),
        jobs=(job("hog", "other", running("hog-0", "n1", tuple(range(8)))), job("p", "q", task)),
    )
    with capture_logs() as logs:
        d = run_session(snap)
    assert "GPU request fits no node of its pool" in _warnings(logs)
    assert not d.evictions and not d.binds
    (status,) = d.pending
    assert [r.code for r in status.reasons] == [UnschedulableReason.NO_ELIGIBLE_NODES]
    assert fragment in status.reasons[0].message


def test_jobs_of_a_queue_that_could_not_be_read_say_so_not_that_it_does_not_exist() -> None:
    why = "queue broken is invalid: spec.resources.gpu.quota: 1e+37 GPUs is beyond any cluster"
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("fine", 2), queue("child", 1, parent="broken")),
        jobs=(
            job("a", "broken", pending("a-0", 1)),
            job("b", "child", pending("b-0", 1)),
            job("c", "nowhere", pending("c-0", 1)),
            job("d", "fine", pending("d-0", 1)),
        ),
        invalid_queues=(("broken", why),),
    )
    d = run_session(snap)
    assert set(binds_by_job(d)) == {"d"}
    reasons = {p.job.split("/")[1]: p.reasons[0] for p in d.pending}
    assert (reasons["a"].code, reasons["a"].message) == (UnschedulableReason.INVALID_QUEUE, why)
    assert reasons["b"].code is UnschedulableReason.UNKNOWN_QUEUE
    assert reasons["b"].message == f"queue child: ancestor broken is unusable ({why})"
    assert (reasons["c"].code, reasons["c"].message) == (
        UnschedulableReason.UNKNOWN_QUEUE,
        "queue nowhere does not exist",
    )


def test_a_guessed_gpu_is_never_one_a_later_pod_names() -> None:
    # "a" sorts first and names no GPU; "b" names GPU 0. Guessed first, a would
    # take GPU 0 too, and GPU 1 would look free.
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 4),),
        jobs=(
            job("a", "q", running("a-0", "n1", (), gpus=1)),
            job("b", "q", running("b-0", "n1", (0,), gpus=1)),
            job("p", "q", pending("p-0", 1)),
        ),
    )
    d = run_session(snap)
    assert not d.binds, "a holds GPU 1, b GPU 0"
