"""The executors' pure parts: retries, the eviction rate, and what status and Events say."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import UnschedulableReason
from gpuwarden.kube import ApiError, Backoff
from scheduler.cluster import status
from scheduler.cluster.bind import binding_body
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.evict import Evictor, EvictOutcome, TokenBucket, eviction_body, eviction_units
from scheduler.cluster.grouping import GroupSpec
from scheduler.cluster.retrying import RetryPolicy, call_with_retries
from scheduler.cluster.status import (
    MAX_MESSAGE,
    QUEUE_AMOUNTS_INTERVAL_S,
    MembershipChange,
    StatusWriter,
    event_name,
    explanation,
    finished_phase,
    pod_group_status,
    queue_status,
)
from scheduler.engine.model import (
    Bind,
    Decisions,
    Eviction,
    EvictionAction,
    Job,
    JobStatus,
    PendingReason,
    QueueShare,
    Resources,
    Snapshot,
    Task,
)
from scheduler.engine.session import run_session
from tests.scheduler.builders import job, node, pending, queue


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Flaky:
    """Fails with the given statuses in turn, then answers."""

    def __init__(self, *statuses: int | None) -> None:
        self.statuses = list(statuses)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.statuses:
            raise ApiError("op", self.statuses.pop(0), "boom")
        return "answer"


def _policy(attempts: int = 3, never: frozenset[int] = frozenset()) -> tuple[RetryPolicy, FakeTime]:
    t = FakeTime()
    return RetryPolicy(
        attempts=attempts, backoff=lambda: Backoff(base_s=1, cap_s=4), sleep=t.sleep, never_retry=never
    ), t


def test_transient_failures_are_retried_with_growing_waits() -> None:
    policy, t = _policy()
    request = Flaky(503, None)
    assert call_with_retries(policy, request) == ("answer", 3)
    assert len(t.slept) == 2
    assert 0.5 <= t.slept[0] <= 1 < t.slept[1] <= 2


def test_retries_are_bounded_and_the_last_error_is_returned() -> None:
    policy, t = _policy(attempts=2)
    answer, tries = call_with_retries(policy, Flaky(500, 502, 504))
    assert isinstance(answer, ApiError)
    assert (answer.status, tries, len(t.slept)) == (502, 2, 1)


@pytest.mark.parametrize(("status", "never"), [(409, frozenset()), (403, frozenset()), (429, frozenset({429}))])
def test_answers_that_a_retry_cannot_change_are_not_retried(status: int, never: frozenset[int]) -> None:
    policy, t = _policy(never=never)
    answer, tries = call_with_retries(policy, Flaky(status))
    assert isinstance(answer, ApiError)
    assert (tries, t.slept) == (1, [])


def test_a_policy_needs_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)


def test_the_bucket_spends_its_burst_then_waits_for_the_rate() -> None:
    t = FakeTime()
    bucket = TokenBucket(rate=2.0, burst=3, clock=t.clock, sleep=t.sleep)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    t.now += 10  # idle: saves up to the burst, no more
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)


def test_a_gang_larger_than_the_burst_goes_at_once_and_the_next_pays_the_debt() -> None:
    t = FakeTime()
    bucket = TokenBucket(rate=1.0, burst=2, clock=t.clock, sleep=t.sleep)
    assert bucket.take(5) == 0.0  # a full bucket lets the whole gang through
    # 2 - 5 = -3 tokens: the next eviction waits for 4 to accrue.
    assert bucket.take() == pytest.approx(4.0)


class _EvictApi:
    def __init__(self) -> None:
        self.evicted: list[str] = []

    def create_pod_eviction(self, namespace: str, name: str, body: Any) -> Any:
        self.evicted.append(name)
        return {}


def test_a_cycle_never_sleeps_for_the_eviction_rate_the_gangs_beyond_it_wait_in_order() -> None:
    t = FakeTime()
    api = _EvictApi()
    bucket = TokenBucket(rate=1.0, burst=3, clock=t.clock, sleep=t.sleep)
    evictor = Evictor(api, bucket=bucket)  # type: ignore[arg-type]

    def ev(job: str, pod: str) -> Eviction:
        return Eviction(f"ns/{job}", "ns", pod, "", "n", EvictionAction.RECLAIM, "r")

    # Two pods of gang a (2 tokens), three of b (only 1 left: deferred), one of c (after b: deferred too).
    decided = [ev("a", "a-0"), ev("b", "b-0"), ev("a", "a-1"), ev("b", "b-1"), ev("b", "b-2"), ev("c", "c-0")]
    results = evictor.evict_all(decided, wait=False)
    assert [r.outcome for r in results] == [
        EvictOutcome.EVICTED,
        EvictOutcome.DEFERRED,
        EvictOutcome.EVICTED,
        EvictOutcome.DEFERRED,
        EvictOutcome.DEFERRED,
        EvictOutcome.DEFERRED,
    ]
    assert sorted(api.evicted) == ["a-0", "a-1"] and t.slept == []
    t.now += 2  # three tokens again: b goes as one gang, c waits once more
    again = [decided[1], decided[3], decided[4], decided[5]]  # the engine decides b and c again
    results = evictor.evict_all(again, wait=False)
    assert [r.outcome for r in results] == [EvictOutcome.EVICTED] * 3 + [EvictOutcome.DEFERRED]
    assert sorted(api.evicted[2:]) == ["b-0", "b-1", "b-2"] and t.slept == []


def test_a_bucket_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0, burst=1)


def test_binding_and_eviction_bodies_carry_the_uid_as_a_precondition() -> None:
    bind = Bind(job="ns/j", namespace="ns", pod="p", uid="u-1", node="n")
    body = binding_body(bind, None)
    assert body["metadata"] == {"name": "p", "namespace": "ns", "uid": "u-1"}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n"}
    with_gpus = binding_body(bind, '{"node":"n","gpus":[]}')
    assert with_gpus["metadata"]["annotations"] == {"gpuwarden.io/gpu-assignment": '{"node":"n","gpus":[]}'}
    ev = Eviction(job="ns/j", namespace="ns", pod="p", uid="u-2", node="n", action=EvictionAction.PREEMPT, reason="r")
    assert eviction_body(ev)["deleteOptions"] == {"preconditions": {"uid": "u-2"}}
    assert "deleteOptions" not in eviction_body(Eviction("ns/j", "ns", "p", "", "n", EvictionAction.PREEMPT, "r"))


def test_a_queue_in_several_pools_shows_the_sums() -> None:
    a = QueueShare(
        "q", "a", Resources(1000, 1000, 1024), Resources(500, 0, 0), Resources(2000, 0, 0), guaranteed=Resources(500)
    )
    b = QueueShare(
        "q",
        "b",
        Resources(2000, 0, 1024),
        Resources(0, 0, 0),
        Resources(0, 500, 0),
        guaranteed=Resources(2000, 0, 1024),
    )
    assert queue_status([a, b]) == {
        "fairShare": {"gpu": 3, "cpu": "1", "memory": "2Gi"},
        "guaranteed": {"gpu": 2.5, "cpu": "0", "memory": "1Gi"},
        "allocated": {"gpu": 0.5, "cpu": "0", "memory": "0Mi"},
        "allocatedNonPreemptible": {"gpu": 0, "cpu": "0", "memory": "0Mi"},
        "requested": {"gpu": 2, "cpu": "500m", "memory": "0Mi"},
        "conditions": [
            {"type": "QuotaNotBacked", "status": "False", "reason": "QuotaBacked", "message": ""},
            {"type": "QuotaNotGuaranteed", "status": "False", "reason": "QuotaGuaranteed", "message": ""},
            {"type": "Invalid", "status": "False", "reason": "Valid", "message": ""},
        ],
    }


def _over_subscribed() -> Snapshot:
    """Quotas of 6 + 6 GPUs on one 8-GPU node, both queues asking for 8: each is guaranteed 4."""
    return Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("a", 6), queue("b", 6)),
        jobs=(
            job("a-all", "a", *(pending(f"a-{i}", 1) for i in range(8)), created=0),
            job("b-all", "b", *(pending(f"b-{i}", 1) for i in range(8)), created=1),
        ),
    )


def test_a_queue_whose_quota_is_over_subscribed_shows_what_is_guaranteed_and_why() -> None:
    share = next(s for s in run_session(_over_subscribed()).queue_shares if s.queue == "b")
    status = queue_status([share])
    # GPUs: the quota as far as the fair share backs it; CPU and memory set no quota: their fair share.
    assert status["guaranteed"] == {
        "gpu": 4,
        "cpu": status["fairShare"]["cpu"],
        "memory": status["fairShare"]["memory"],
    }
    assert status["conditions"][1] == {
        "type": "QuotaNotGuaranteed",
        "status": "True",
        "reason": "QuotasExceedBacking",
        "message": "only 4 GPUs of its gpu quota of 6 GPUs is guaranteed (reclaim wins back no more): the quotas "
        "at this queue's level add up to 12 GPUs and the pool's healthy capacity is 8 GPUs",
    }
    # Over-subscribed, not short of healthy capacity: the quotas fit the pool one by one.
    assert status["conditions"][0]["type"] == "QuotaNotBacked"


def test_a_queue_in_several_pools_names_the_pool_of_each_note_and_clips_them() -> None:
    def share(pool: str, note: str) -> QueueShare:
        return QueueShare("q", pool, Resources(), Resources(), Resources(), guarantee_note=note)

    status = queue_status([share("a100", "1 GPU short"), share("h100", ""), share("l4", "2 GPUs short")])
    [cond] = [c for c in status["conditions"] if c["type"] == "QuotaNotGuaranteed"]
    assert (cond["status"], cond["message"]) == ("True", "node pool a100: 1 GPU short; node pool l4: 2 GPUs short")
    long = queue_status([share("a100", "x" * 5000)])["conditions"][1]["message"]
    assert len(long) == MAX_MESSAGE and long.endswith("…")


def test_the_explanation_keeps_the_engines_order_and_fits_an_event() -> None:
    # The reason is shown beside the message everywhere: one code is not repeated in it.
    one = JobStatus("ns/j", "q", (PendingReason(UnschedulableReason.OVER_LIMIT, "at limit"),))
    assert explanation(one) == ("OverLimit", "at limit")
    two = JobStatus(
        "ns/j",
        "q",
        (
            PendingReason(UnschedulableReason.GANG_INCOMPLETE, "1 of 4"),
            PendingReason(UnschedulableReason.GANG_INCOMPLETE, "x" * 2000),
        ),
    )
    reason, message = explanation(two)
    assert reason == "GangIncomplete"
    assert message.startswith("1 of 4; xxx")
    assert len(message) == MAX_MESSAGE
    assert explanation(JobStatus("ns/j", "q", ())) == ("Pending", "waiting to be placed")


def test_only_a_message_of_several_reason_codes_names_each_code() -> None:
    mixed = JobStatus(
        "ns/j",
        "q",
        (
            PendingReason(UnschedulableReason.OVER_LIMIT, "at limit"),
            PendingReason(UnschedulableReason.INSUFFICIENT_RESOURCES, "no room"),
        ),
    )
    assert explanation(mixed) == ("MultipleReasons", "OverLimit: at limit; InsufficientResources: no room")


def test_a_group_none_of_whose_pods_is_left_says_how_it_ended() -> None:
    def ended(*tasks: Task, succeeded: int = 0, failed: int = 0) -> tuple[str, str] | None:
        found = finished_phase(Job("j", "q", min_member=4, tasks=tasks, succeeded=succeeded, failed=failed))
        return (found[0].value, found[1]) if found is not None else None

    assert ended(succeeded=6) == ("Succeeded", "every pod finished: 6 succeeded")
    # A failed pod its controller replaced does not fail a gang that went on to complete.
    assert ended(succeeded=4, failed=1) == ("Succeeded", "every pod finished: 4 succeeded, 1 failed")
    assert ended(succeeded=1, failed=3) == (
        "Failed",
        "every pod finished: 1 succeeded, 3 failed, fewer than minMember 4",
    )
    assert ended(Task("last"), succeeded=5) is None  # one is still to run
    assert ended() is None  # nothing finished: gone, not done

    done = pod_group_status(None, placed_now=False, finished=finished_phase(Job("j", "q", succeeded=2)))
    assert done == {
        "phase": "Succeeded",
        "conditions": [
            {
                "type": "Unschedulable",
                "status": "False",
                "reason": "Scheduled",
                "message": "every pod finished: 2 succeeded",
            }
        ],
    }


def test_pod_group_phase_and_condition() -> None:
    pending = JobStatus("ns/j", "q", (PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, "none"),))
    assert pod_group_status(pending, placed_now=False)["phase"] == "Pending"
    partly = pod_group_status(pending, placed_now=True)
    assert (partly["phase"], partly["conditions"][0]["status"]) == ("Running", "True")
    placed = pod_group_status(None, placed_now=True)
    assert placed["conditions"] == [{"type": "Unschedulable", "status": "False", "reason": "Scheduled", "message": ""}]


def test_event_names_are_stable_per_group_and_valid() -> None:
    assert event_name("ns/train") == event_name("ns/train")
    assert event_name("ns/train") != event_name("other/train")
    long = event_name("ns/" + "a" * 253)
    assert len(long) <= 253
    assert long.startswith("a" * 200 + ".")


def _short_share(short_gpus: int, *, parent: str = "") -> QueueShare:
    g = 1000
    return QueueShare(
        "team",
        "default",
        Resources(6 * g, 0, 0),
        Resources(6 * g, 0, 0),
        Resources(8 * g, 0, 0),
        allocated_non_preemptible=Resources(2 * g, 0, 0),
        quota_shortfall=Resources(short_gpus * g, 0, 0),
        quota=Resources(8 * g, 0, 0),
        backing=Resources(40 * g, 0, 0),
        level_quota=Resources(48 * g, 0, 0),
        parent=parent,
    )


def test_a_queue_whose_quota_is_not_backed_says_by_how_much_and_why() -> None:
    status = queue_status([_short_share(2)])
    assert status["allocatedNonPreemptible"] == {"gpu": 2, "cpu": "0", "memory": "0Mi"}
    assert status["conditions"] == [
        {
            "type": "QuotaNotBacked",
            "status": "True",
            "reason": "HealthyCapacityBelowQuotas",
            "message": "2 of 8 GPUs of this queue's quota are not backed: "
            "the pool's healthy capacity (40 GPUs) is below the sum of quotas (48 GPUs)",
        },
        {"type": "QuotaNotGuaranteed", "status": "False", "reason": "QuotaGuaranteed", "message": ""},
        {"type": "Invalid", "status": "False", "reason": "Valid", "message": ""},
    ]
    child = queue_status([_short_share(1, parent="dept")])["conditions"][0]["message"]
    assert child.startswith("1 of 8 GPUs of this queue's quota is not backed: the backed part of parent queue dept")


class _Api:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    def patch_queue_status(self, name: str, body: Any) -> Any:
        self.patches.append((name, body))
        return {}


def test_the_writer_keeps_the_quota_condition_time_while_its_status_holds() -> None:
    api = _Api()
    t = [datetime(2025, 1, 1, tzinfo=UTC)]
    writer = StatusWriter(api, clock=lambda: t[0], instance="test")  # type: ignore[arg-type]

    def cycle(short: int) -> str | None:
        before = len(api.patches)
        writer.write(Decisions(queue_shares=(_short_share(short),)))
        if len(api.patches) == before:
            return None
        cond = api.patches[-1][1]["status"]["conditions"][0]
        assert cond["type"] == "QuotaNotBacked"
        return f"{cond['status']}@{cond['lastTransitionTime']}"

    assert cycle(2) == "True@2025-01-01T00:00:00Z"
    t[0] += timedelta(minutes=1)
    assert cycle(2) is None  # unchanged: nothing sent
    assert cycle(3) == "True@2025-01-01T00:00:00Z"  # the shortfall moved, the condition did not flip
    assert cycle(4) is None  # amounts alone wait for QUEUE_AMOUNTS_INTERVAL_S
    t[0] += timedelta(minutes=1)
    assert cycle(0) == "False@2025-01-01T00:02:00Z"


def test_queue_amounts_wait_for_the_interval_and_a_condition_that_flips_does_not() -> None:
    """Every bind moves the amounts; a patch per bind cost as much CPU as the binds themselves."""
    api = _Api()
    t = [datetime(2025, 1, 1, tzinfo=UTC)]
    writer = StatusWriter(api, clock=lambda: t[0], instance="test")  # type: ignore[arg-type]

    def allocated(gpus: int, short: int = 0) -> float | None:
        before = len(api.patches)
        share = replace(_short_share(short), allocated=Resources(gpus * 1000))
        report = writer.write(Decisions(queue_shares=(share,)))
        if len(api.patches) == before:
            assert report.deferred + report.unchanged == 1
            return None
        return float(api.patches[-1][1]["status"]["allocated"]["gpu"])

    assert allocated(1) == 1  # the first status goes out at once
    t[0] += timedelta(seconds=1)
    assert allocated(2) is None  # amounts only: held back
    t[0] += timedelta(seconds=QUEUE_AMOUNTS_INTERVAL_S - 1)
    assert allocated(3) == 3  # the interval is over: the latest amounts
    t[0] += timedelta(seconds=1)
    assert allocated(4, short=2) == 4  # QuotaNotBacked turned True: at once, with the amounts
    assert allocated(5, short=2) is None
    writer.forget(queue="team")
    assert allocated(5, short=2) == 5  # a Queue made again is written afresh


def test_an_invalid_queue_shows_why_and_its_condition_clears_with_its_own_time() -> None:
    api = _Api()
    t = [datetime(2025, 1, 1, tzinfo=UTC)]
    writer = StatusWriter(api, clock=lambda: t[0], instance="test")  # type: ignore[arg-type]
    problem = ("InvalidSpec", "queue team is invalid: spec.resources.gpu.quota: 1e+37 GPUs is beyond any cluster")

    def conditions() -> dict[str, str]:
        body = api.patches[-1][1]["status"]
        return {c["type"]: f"{c['status']}/{c['reason']}@{c['lastTransitionTime']}" for c in body["conditions"]}

    writer.write(Decisions(), queue_problems={"team": problem})
    (name, body) = api.patches[-1]
    assert name == "team" and body["status"]["fairShare"] is None and body["status"]["guaranteed"] is None
    assert body["status"]["conditions"][0]["message"] == problem[1]
    assert conditions() == {"Invalid": "True/InvalidSpec@2025-01-01T00:00:00Z"}
    t[0] += timedelta(minutes=1)
    sent = len(api.patches)
    writer.write(Decisions(), queue_problems={"team": problem})
    assert len(api.patches) == sent  # unchanged: nothing sent

    # Fixed: the queue has a share again and the condition flips to False.
    t[0] += timedelta(minutes=1)
    writer.write(Decisions(queue_shares=(_short_share(0),)))
    assert conditions() == {
        "QuotaNotBacked": "False/QuotaBacked@2025-01-01T00:02:00Z",
        "QuotaNotGuaranteed": "False/QuotaGuaranteed@2025-01-01T00:02:00Z",
        "Invalid": "False/Valid@2025-01-01T00:02:00Z",
    }


def test_the_writer_sends_the_guarantee_only_when_it_changes_and_keeps_its_condition_time() -> None:
    api = _Api()
    t = [datetime(2025, 1, 1, tzinfo=UTC)]
    writer = StatusWriter(api, clock=lambda: t[0], instance="test")  # type: ignore[arg-type]
    g = 1000

    def cycle(guaranteed: int, note: str) -> tuple[float, str] | None:
        share = QueueShare(
            "team", "default", Resources(4 * g), Resources(), Resources(8 * g), guaranteed=Resources(guaranteed * g)
        )
        before = len(api.patches)
        writer.write(Decisions(queue_shares=(replace(share, guarantee_note=note),)))
        if len(api.patches) == before:
            return None
        body = api.patches[-1][1]["status"]
        [cond] = [c for c in body["conditions"] if c["type"] == "QuotaNotGuaranteed"]
        return body["guaranteed"]["gpu"], f"{cond['status']}/{cond['reason']}@{cond['lastTransitionTime']}"

    assert cycle(4, "2 GPUs short") == (4, "True/QuotasExceedBacking@2025-01-01T00:00:00Z")
    t[0] += timedelta(minutes=1)
    assert cycle(4, "2 GPUs short") is None  # unchanged: nothing sent
    # Another amount and note: written, but the condition was True and stays so.
    assert cycle(3, "3 GPUs short") == (3, "True/QuotasExceedBacking@2025-01-01T00:00:00Z")
    t[0] += timedelta(minutes=1)
    assert cycle(6, "") == (6, "False/QuotaGuaranteed@2025-01-01T00:02:00Z")


class _GroupApi:
    """The PodGroup status and Event calls the writer makes, recorded; every group exists."""

    def __init__(self) -> None:
        self.patched: list[str] = []

    def patch_podgroup_status(self, namespace: str, name: str, body: Any) -> Any:
        self.patched.append(f"{namespace}/{name}")
        return {"metadata": {"uid": f"uid-{name}"}}

    def create_event(self, namespace: str, body: Any) -> Any:
        return body

    def patch_event(self, namespace: str, name: str, patch: Any) -> Any:
        return patch


def test_finished_groups_leave_the_writers_work_once_written(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _GroupApi()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    ended = {f"ns/done-{i}": finished_phase(Job(f"done-{i}", "q", succeeded=2)) for i in range(500)}
    finished = {group: how for group, how in ended.items() if how is not None}
    report = writer.write(Decisions(), finished=finished)
    assert report.pod_groups_patched == 500
    looked_at: list[object] = []
    real = status.pod_group_status

    def counting(*args: Any, **kwargs: Any) -> Any:
        looked_at.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(status, "pod_group_status", counting)
    report = writer.write(Decisions(), finished=finished)
    assert (report.pod_groups_patched, report.unchanged, looked_at) == (0, 500, [])
    # Handed the very same mapping again (nothing ended since): not one group is even counted.
    report = writer.write(Decisions(), finished=finished)
    assert (report.pod_groups_patched, report.unchanged, looked_at) == (0, 0, [])
    # A PodGroup deleted and made again is written afresh, though nothing else ended.
    writer.forget(pod_group="ns/done-3")
    assert writer.write(Decisions(), finished=finished).pod_groups_patched == 1
    assert api.patched[-1] == "ns/done-3"
    looked_at.clear()
    # One that runs again (its Job restarted a pod) is written again, and so is its end after that.
    again = Decisions(binds=(Bind(job="ns/done-7", namespace="ns", pod="p", uid="u", node="n1", gpu_indices=()),))
    writer.write(again, finished={g: h for g, h in finished.items() if g != "ns/done-7"})
    assert api.patched[-1] == "ns/done-7"
    writer.write(Decisions(), finished=finished)
    assert api.patched[-1] == "ns/done-7" and len(api.patched) == 503


def test_a_lone_pods_group_without_a_podgroup_is_written_only_when_it_has_news() -> None:
    """Placed or ended, nothing is sent or kept for it; pending or blocked, it is written like any group."""
    api = _GroupApi()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    lone = {f"ns/solo-{i}" for i in range(4)}
    running = [*sorted(lone), "ns/job"]
    report = writer.write(Decisions(), gang_met=running, unmirrored=lone.__contains__)
    assert (api.patched, report.unmirrored) == (["ns/job"], 4)
    report = writer.write(Decisions(), gang_met=running, unmirrored=lone.__contains__)
    assert (api.patched, report.unmirrored, report.unchanged) == (["ns/job"], 0, 5)  # not looked at again
    how = finished_phase(Job("solo", "q", succeeded=1))
    assert how is not None
    ended = {"ns/solo-0": how, "ns/solo-1": how}
    for _ in range(2):
        report = writer.write(
            Decisions(), gang_met=running[2:], finished=ended, finished_changed=set(ended), unmirrored=lone.__contains__
        )
        assert (api.patched, report.unmirrored) == (["ns/job"], 2)
    assert writer._final == {}  # no PodGroup's deletion will ever say to forget them: nothing kept
    # One that waits is news: written (the cycle makes its PodGroup first), and so is what follows.
    reason = (PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, "none"),)
    writer.write(Decisions(pending=(JobStatus("ns/solo-2", "q", reason),)), unmirrored=lone.__contains__)
    assert api.patched[-1] == "ns/solo-2"
    lone.discard("ns/solo-2")  # the cycle made its PodGroup
    writer.write(Decisions(), gang_met=["ns/solo-2"], unmirrored=lone.__contains__)
    assert api.patched == ["ns/job", "ns/solo-2", "ns/solo-2"]
    # Blocked (an eviction refused) is news too.
    writer.write(Decisions(), gang_met=["ns/solo-3"], blocked={"ns/solo-3": "a budget"}, unmirrored=lone.__contains__)
    assert api.patched[-1] == "ns/solo-3"


def test_a_new_finished_mapping_costs_the_groups_named_changed_not_a_walk_over_every_one() -> None:
    api = _GroupApi()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    ended = {f"ns/done-{i}": finished_phase(Job(f"done-{i}", "q", succeeded=2)) for i in range(500)}
    finished = {group: how for group, how in ended.items() if how is not None}
    # The first call has nothing to diff against: every group, although changes are named.
    assert writer.write(Decisions(), finished=finished, finished_changed=()).pod_groups_patched == 500
    assert writer.write(Decisions(), finished=finished).unchanged == 500  # and found settled
    late = finished_phase(Job("late", "q", succeeded=1))
    failed = finished_phase(Job("done-9", "q", failed=2))
    assert late is not None and failed is not None
    more = {**finished, "ns/late": late, "ns/done-9": failed}
    report = writer.write(Decisions(), finished=more, finished_changed={"ns/late", "ns/done-9"})
    assert (report.pod_groups_patched, report.unchanged) == (2, 0)
    assert sorted(api.patched[-2:]) == ["ns/done-9", "ns/late"]
    # Changes not known (a full read): every finished group is looked at, and found written.
    report = writer.write(Decisions(), finished=dict(more), finished_changed=None)
    assert (report.pod_groups_patched, report.unchanged) == (0, 501)
    # A batch that never reached the writer (its bookkeeping failed first): the next one's changes do not
    # cover what the writer last saw, so it looks at every finished group again.
    writer.forget_finished()
    report = writer.write(Decisions(), finished=dict(more), finished_changed=())
    assert (report.pod_groups_patched, report.unchanged) == (0, 501)


def test_a_status_found_unchanged_is_written_again_when_it_comes_back_after_a_change() -> None:
    api = _GroupApi()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    group = "ns/train"
    waits = Decisions(pending=(JobStatus(group, "q", (PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, "none"),)),))
    writer.write(Decisions(), gang_met=[group])
    for _ in range(3):  # running, cycle after cycle: nothing to send
        assert writer.write(Decisions(), gang_met=[group]).pod_groups_patched == 0
    assert writer.write(waits).pod_groups_patched == 1  # a member was lost: Pending
    assert writer.write(Decisions(), gang_met=[group]).pod_groups_patched == 1  # and Running again
    assert api.patched == [group] * 3


def test_running_groups_settled_at_the_last_write_are_not_looked_at_again(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _GroupApi()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    running = [f"ns/run-{i}" for i in range(1000)]
    assert writer.write(Decisions(), gang_met=running).pod_groups_patched == 1000
    writer.write(Decisions(), gang_met=running)  # found settled
    looked_at: list[str] = []
    real = writer._unchanged

    def counting(group: str, *args: Any) -> bool:
        looked_at.append(group)
        return real(group, *args)

    monkeypatch.setattr(writer, "_unchanged", counting)
    report = writer.write(Decisions(), gang_met=running)
    assert (report.pod_groups_patched, report.unchanged, looked_at) == (0, 1000, [])
    # One more placed, one gone pending, one whose PodGroup was made again: those three are looked at.
    waits = JobStatus("ns/run-5", "q", (PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, "none"),))
    writer.forget(pod_group="ns/run-9")
    report = writer.write(Decisions(pending=(waits,)), gang_met=[*running[:5], *running[6:], "ns/new"])
    assert sorted(looked_at) == ["ns/new", "ns/run-5", "ns/run-9"]
    assert sorted(api.patched[1000:]) == ["ns/new", "ns/run-5", "ns/run-9"]
    # Groups deferred while the scheduler is busy stay deferred without a look, and are written once it is not.
    more = [f"ns/later-{i}" for i in range(300)]
    assert writer.write(Decisions(), gang_met=[*running, *more], defer_placed=True).deferred == 300
    assert api.patched[-1] == "ns/run-5"  # running again: Running (it was Pending)
    looked_at.clear()
    report = writer.write(Decisions(), gang_met=[*running, *more], defer_placed=True)
    assert report.deferred == 300 and report.pod_groups_patched == 0
    assert looked_at == ["ns/run-5"]  # written at the last call: found settled now
    report = writer.write(Decisions(), gang_met=[*running, *more])
    assert report.pod_groups_patched == 300 and report.deferred == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.frozensets(st.integers(0, 7)),  # running
            st.frozensets(st.integers(0, 7)),  # pending
            st.frozensets(st.integers(0, 7)),  # blocked
            st.frozensets(st.integers(0, 7)),  # PodGroups deleted and made again
            st.booleans(),  # busy: placed groups never written wait
        ),
        max_size=12,
    )
)
def test_a_writer_that_skips_settled_groups_writes_what_a_writer_looking_at_every_group_writes(
    calls: list[tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int], bool]],
) -> None:
    skipping, walking = _GroupApi(), _GroupApi()
    writers = StatusWriter(skipping, workers=1), StatusWriter(walking, workers=1)  # type: ignore[arg-type]
    last: frozenset[str] = frozenset()
    for running, waiting, blocked, forgotten, busy in calls:
        reason = (PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, "none"),)
        decisions = Decisions(pending=tuple(JobStatus(f"ns/g{i}", "q", reason) for i in sorted(waiting)))
        gang_met = frozenset(f"ns/g{i}" for i in running - waiting)
        # The skipping writer is told which running groups changed (as the cycle tells it).
        change = MembershipChange(last, gang_met ^ last)
        last = gang_met
        reports = []
        for writer, api in zip(writers, (skipping, walking), strict=True):
            for i in forgotten:
                writer.forget(pod_group=f"ns/g{i}")
            if writer is writers[1]:
                writer._placed_before = None  # nothing known of the last call: every group is looked at
            before = len(api.patched)
            report = writer.write(
                decisions,
                gang_met=gang_met,
                blocked={f"ns/g{i}": "a budget" for i in blocked},
                defer_placed=busy,
                gang_met_changed=change if writer is writers[0] else None,
            )
            reports.append((sorted(api.patched[before:]), report.pod_groups_patched, report.unchanged, report.deferred))
        assert reports[0] == reports[1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.frozensets(st.integers(0, 7)),  # running at their minMember
            st.frozensets(st.integers(0, 7)),  # bound this cycle
            st.frozensets(st.integers(0, 7)),  # pending
            st.frozensets(st.integers(0, 7)),  # ended (Succeeded), running or not
            st.frozensets(st.integers(0, 7)),  # PodGroups deleted and made again
            st.booleans(),  # busy: placed groups never written wait
            st.frozensets(st.integers(0, 7)),  # named as changed although they did not (allowed)
            st.sampled_from(["told", "not told", "told of another version"]),
        ),
        max_size=12,
    )
)
def test_a_writer_told_which_running_groups_changed_writes_what_a_writer_looking_at_all_of_them_writes(
    calls: list[
        tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int], frozenset[int], bool, frozenset[int], str]
    ],
) -> None:
    """Binds, ended groups that still run, extra names, lost changes: the change only saves looks, it never decides."""
    told, walking = _GroupApi(), _GroupApi()
    writers = StatusWriter(told, workers=1), StatusWriter(walking, workers=1)  # type: ignore[arg-type]
    last_running: frozenset[str] = frozenset()
    last_ended: dict[str, status.Finished] = {}
    for running, bound, waiting, ended, forgotten, busy, extra, how in calls:
        reason = (PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, "none"),)
        decisions = Decisions(
            pending=tuple(JobStatus(f"ns/g{i}", "q", reason) for i in sorted(waiting - bound)),
            binds=tuple(Bind(f"ns/g{i}", "q", f"p{i}", f"uid-p{i}", "n1") for i in sorted(bound)),
        )
        gang_met = frozenset(f"ns/g{i}" for i in running)
        how_ended = finished_phase(Job("g", "q", succeeded=1))
        assert how_ended is not None
        finished = {f"ns/g{i}": how_ended for i in ended}
        names = (gang_met ^ last_running) | {f"ns/g{i}" for i in extra}
        change = {
            "told": MembershipChange(last_running, names),
            "not told": None,
            "told of another version": MembershipChange(frozenset(last_running), names),
        }[how]
        finished_changed = {g for g in finished.keys() | last_ended.keys() if finished.get(g) != last_ended.get(g)}
        last_running, last_ended = gang_met, finished
        patched = []
        for writer, api in zip(writers, (told, walking), strict=True):
            for i in forgotten:
                writer.forget(pod_group=f"ns/g{i}")
            if writer is writers[1]:
                writer._placed_before = None  # nothing known of the last call: every group is looked at
                writer.forget_finished()
            before = len(api.patched)
            report = writer.write(
                decisions,
                gang_met=gang_met,
                defer_placed=busy,
                finished=finished,
                finished_changed=finished_changed if writer is writers[0] else None,
                gang_met_changed=change if writer is writers[0] else None,
            )
            patched.append((sorted(api.patched[before:]), report.pod_groups_patched, report.deferred))
        assert patched[0] == patched[1]


class _CreateApi(_GroupApi):
    """The PodGroup creates of the cycle's bookkeeping, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []

    def create_podgroup(self, namespace: str, body: Any) -> Any:
        self.created.append(f"{namespace}/{body['metadata']['name']}")
        return body


def test_bookkeeping_behind_the_cycles_is_paced_and_the_cycles_own_writes_are_not() -> None:
    """Each PodGroup create and status patch written behind the cycles first takes a token; nothing else does."""
    api = _CreateApi()
    paced: list[str] = []
    writer = StatusWriter(api, workers=1, pace=lambda: paced.append("status"))  # type: ignore[arg-type]
    groups = [f"ns/g{i}" for i in range(3)]
    writer.write(Decisions(), gang_met=groups)
    assert paced == ["status"] * 3 and api.patched == groups
    writer.write(Decisions(), gang_met=groups)  # unchanged: nothing sent, no token taken
    assert len(paced) == 3

    cycle = SchedulingCycle(api, writes_in_background=True, bookkeeping_qps=1000.0)  # type: ignore[arg-type]
    try:
        assert cycle._pace is not None
        cycle._pace = lambda: paced.append("create")
        specs = [GroupSpec(namespace="ns", name=f"pg-{i}", queue="q", min_member=1) for i in range(5)]
        cycle._create_podgroups(specs[:3], paced=True)  # behind the cycles
        assert paced.count("create") == 3
        cycle._create_podgroups(specs[3:])  # on the cycle's thread (a group holding room): never waits for tokens
        assert paced.count("create") == 3 and len(api.created) == 5
    finally:
        cycle.close()
    assert SchedulingCycle(api)._pace is None  # type: ignore[arg-type]  # written in line: unpaced


def test_a_closing_cycle_drains_its_bookkeeping_without_waiting_for_the_pace() -> None:
    """After a lost lease every queued write is refused at the fence: pacing the refusals would only delay the reset."""
    api = _CreateApi()
    clock = FakeTime()
    cycle = SchedulingCycle(api, writes_in_background=True, bookkeeping_qps=1.0)  # type: ignore[arg-type]
    cycle._bucket = cycle._busy_bucket = TokenBucket(1.0, 1, clock=clock.clock, sleep=clock.sleep)
    specs = [GroupSpec(namespace="ns", name=f"pg-{i}", queue="q", min_member=1) for i in range(6)]
    try:
        for spec in specs[:3]:  # one at a time: the fake clock is not shared between threads
            cycle._create_podgroups([spec], paced=True)
        assert clock.slept == [1.0, 1.0]  # one token saved up, then one a second
    finally:
        cycle.close()
    cycle._create_podgroups(specs[3:], paced=True)  # what a drain still writes once closing
    assert len(clock.slept) == 2 and len(api.created) == 6


def test_bookkeeping_goes_slower_while_cycles_are_binding() -> None:
    """Held-back writes flushed while pods keep arriving must not take the API server from their binds at once."""
    api = _CreateApi()
    fast, slow = FakeTime(), FakeTime()
    cycle = SchedulingCycle(api, writes_in_background=True, bookkeeping_qps=4.0)  # type: ignore[arg-type]
    cycle._bucket = TokenBucket(4.0, 1, clock=fast.clock, sleep=fast.sleep)
    cycle._busy_bucket = TokenBucket(1.0, 1, clock=slow.clock, sleep=slow.sleep)
    specs = [GroupSpec(namespace="ns", name=f"pg-{i}", queue="q", min_member=1) for i in range(6)]
    try:
        cycle._bound_at = time.monotonic()  # a cycle has just bound
        for spec in specs[:3]:
            cycle._create_podgroups([spec], paced=True)
        assert (slow.slept, fast.slept) == ([1.0, 1.0], [])
        cycle._bound_at = time.monotonic() - 60  # no bind for a minute: the full pace
        for spec in specs[3:]:
            cycle._create_podgroups([spec], paced=True)
        assert fast.slept == [0.25, 0.25] and len(slow.slept) == 2
    finally:
        cycle.close()


class _ShownApi(_GroupApi):
    """Also keeps what each PodGroup's status became, as the watch would show it."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: dict[tuple[str, str], Any] = {}

    def patch_podgroup_status(self, namespace: str, name: str, body: Any) -> Any:
        self.shown[(namespace, name)] = {"metadata": {"uid": f"uid-{name}"}, "status": body["status"]}
        return super().patch_podgroup_status(namespace, name, body)


def test_a_new_leader_takes_the_statuses_podgroups_already_show_as_written() -> None:
    """A restart or failover does not patch every PodGroup of the cluster's history once."""
    api = _ShownApi()
    ended = {f"ns/done-{i}": finished_phase(Job(f"done-{i}", "q", succeeded=1)) for i in range(50)}
    finished = {group: how for group, how in ended.items() if how is not None}
    StatusWriter(api, workers=1).write(Decisions(), gang_met=["ns/runs"], finished=finished)  # type: ignore[arg-type]
    assert len(api.patched) == 51
    shown = dict(api.shown)
    # One of them was changed by someone else meanwhile: that one is written again, with its own times kept.
    changed = {
        "phase": "Running",
        "conditions": [{**c, "status": "True"} for c in shown[("ns", "done-3")]["status"]["conditions"]],
    }
    shown[("ns", "done-3")] = {"metadata": {"uid": "uid-done-3"}, "status": changed}

    leader = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    report = leader.write(Decisions(), gang_met=["ns/runs"], finished=finished, podgroups=shown)
    assert report.pod_groups_patched == 1 and api.patched[-1] == "ns/done-3"
    assert api.shown[("ns", "done-3")]["status"]["phase"] == "Succeeded"
    # Without the watched objects it writes each once, as before.
    assert StatusWriter(api, workers=1).write(Decisions(), finished=finished).pod_groups_patched == 50  # type: ignore[arg-type]


def test_the_writer_forgets_deleted_podgroups_and_writes_one_made_again_afresh() -> None:
    """What was written for a PodGroup goes with it; one made again under the same name is a new object."""
    api = _ShownApi()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    done = finished_phase(Job("b", "q", succeeded=1))
    assert done is not None
    writer.write(Decisions(), gang_met=["ns/a", "ns/c"], finished={"ns/b": done})
    assert sorted(api.patched) == ["ns/a", "ns/b", "ns/c"]
    shown = dict(api.shown)
    # Nothing changed: nothing forgotten.
    assert writer.forget_gone(shown, {("ns", "a"), ("ns", "b")}) == 0
    # b deleted (its Job went): forgotten, whether named as changed or found by a full check.
    del shown[("ns", "b")]
    assert writer.forget_gone(shown, {("ns", "b")}) == 1
    assert writer.forget_gone(shown, {("ns", "b")}) == 0  # nothing left of it to forget
    # a deleted and made again between two views: another UID, an empty status.
    shown[("ns", "a")] = {"metadata": {"uid": "uid-a-again"}, "status": {}}
    assert writer.forget_gone(shown, {("ns", "a")}) == 1
    before = len(api.patched)
    writer.write(Decisions(), gang_met=["ns/a", "ns/c"], podgroups=shown)
    assert api.patched[before:] == ["ns/a"]  # the new a is written; c stands as written
    # A full check (the view was read whole, after that write) finds c gone too.
    shown = {("ns", "a"): api.shown[("ns", "a")]}
    assert writer.forget_gone(shown, None) == 1


def test_a_beneficiarys_victims_and_a_victim_gang_are_one_unit_of_the_rate() -> None:
    def ev(job: str, pod: str, beneficiary: str | None) -> Eviction:
        return Eviction(f"ns/{job}", "ns", pod, "", "n", EvictionAction.RECLAIM, "r", beneficiary)

    decided = [
        ev("a", "a-0", "ns/x"),  # x needs a-0 and b-0 (two victim jobs)
        ev("c", "c-0", "ns/y"),
        ev("b", "b-0", "ns/x"),
        ev("c", "c-1", "ns/y"),
        ev("d", "d-0", None),  # health: its own unit
        ev("b", "b-1", "ns/z"),  # gang b leaves whole: z joins x's unit
    ]
    assert eviction_units(decided) == [[0, 2, 5], [1, 3], [4]]
