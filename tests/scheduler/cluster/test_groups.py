"""The grouping state without a cluster: a derived group follows its owner, a named group its PodGroup.

Both ways of grouping (kept from view to view, and from scratch) must say
the same; the views here are plain dictionaries as the watch cache holds
them, and the owners come from a table instead of the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuwarden import contract
from scheduler.cluster.groups import MANAGED_BY, PodGrouper

JOB_UID = "job-uid-1"
DERIVED = ("ns", f"pg-train-{JOB_UID}")


@dataclass
class Owners:
    """The owner chain of every pod: one batch Job whose parallelism the test changes."""

    parallelism: int = 4
    labels: dict[str, str] = field(default_factory=dict)

    def chain(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "train", "namespace": "ns", "uid": JOB_UID, "labels": self.labels},
                "spec": {"parallelism": self.parallelism},
            }
        ]


@dataclass
class View:
    pods: dict[str, Any]
    podgroups: dict[tuple[str, str], Any]
    generation: int | None = None
    changed: Any = None


def _pod(uid: str, *, named: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"p-{uid}",
        "namespace": "ns",
        "uid": uid,
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": JOB_UID, "controller": True}
        ],
    }
    if named:
        meta["annotations"] = {contract.ANNOTATION_POD_GROUP: named}
    return {"metadata": meta, "spec": {"schedulerName": contract.SCHEDULER_NAME}, "status": {"phase": "Pending"}}


def _podgroup(name: str, min_member: int, queue: str, *, ours: bool) -> dict[str, Any]:
    labels = {MANAGED_BY: contract.SCHEDULER_COMPONENT} if ours else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels, "resourceVersion": "7"},
        "spec": {"minMember": min_member, "queue": queue},
    }


def _grouped(owners: Owners, view: View, *, incremental: bool) -> PodGrouper:
    grouper = PodGrouper(owners, default_queue="default", incremental=incremental)
    if incremental:
        grouper.regroup(view)
    else:
        grouper.group_all(view)
    return grouper


@pytest.mark.parametrize("incremental", [True, False])
@pytest.mark.parametrize("ours", [True, False])
def test_a_derived_group_follows_its_owner_not_its_podgroup(incremental: bool, ours: bool) -> None:
    owners = Owners(parallelism=2, labels={contract.LABEL_QUEUE: "new"})
    view = View(
        pods={u: _pod(u) for u in ("a", "b")},
        podgroups={DERIVED: _podgroup(DERIVED[1], 4, "old", ours=ours)},  # written when the Job asked for 4
    )
    grouper = _grouped(owners, view, incremental=incremental)
    info = grouper.groups[DERIVED]
    assert (info.min_member, info.queue, info.uid) == (2, "new", f"uid-{DERIVED[1]}")
    drifted = grouper.drifted(view)
    # Only a PodGroup the scheduler made (labelled so) is rewritten; an older one is followed in memory.
    assert [(spec.min_member, spec.queue) for spec, _ in drifted] == ([(2, "new")] if ours else [])
    assert grouper.take_missing() == {}  # it exists: nothing to create


@pytest.mark.parametrize("incremental", [True, False])
def test_a_named_group_is_what_its_podgroup_says(incremental: bool) -> None:
    view = View(
        pods={"a": _pod("a", named="users"), "b": _pod("b", named="users")},
        podgroups={("ns", "users"): _podgroup("users", 4, "team", ours=False)},
    )
    grouper = _grouped(Owners(parallelism=1), view, incremental=incremental)
    info = grouper.groups[("ns", "users")]
    assert (info.min_member, info.queue) == (4, "team")
    assert grouper.drifted(view) == []


@pytest.mark.parametrize("incremental", [True, False])
def test_a_missing_derived_podgroup_is_handed_over_once_to_be_created(incremental: bool) -> None:
    view = View(pods={"a": _pod("a")}, podgroups={})
    grouper = _grouped(Owners(parallelism=1), view, incremental=incremental)
    missing = grouper.take_missing()
    assert list(missing) == [DERIVED]
    assert missing[DERIVED].min_member == 1
    assert grouper.take_missing() == {}
    grouper.mark_created(DERIVED)
    assert grouper.created(DERIVED)


@dataclass
class Changed:
    """What a cache view names as changed since generation ``since``."""

    since: int
    pods: set[str] = field(default_factory=set)
    podgroups: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class CachingOwners:
    """Owners as the resolver hands them out: the same cached object until the owner is read again."""

    parallelism: int = 4
    calls: int = 0
    job: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.read_again()

    def read_again(self) -> None:
        self.job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": "ns", "uid": JOB_UID},
            "spec": {"parallelism": self.parallelism},
        }

    def chain(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        self.calls += 1
        return [self.job]


def _next(view: View, generation: int, **changed: Any) -> View:
    return View(view.pods, view.podgroups, generation=generation, changed=Changed(since=generation - 1, **changed))


def test_an_unchanged_derived_pod_is_not_grouped_again() -> None:
    owners = CachingOwners()
    view = View(pods={u: _pod(u) for u in ("a", "b", "c")}, podgroups={}, generation=1)
    grouper = PodGrouper(owners, default_queue="default")
    assert grouper.regroup(view) is None  # the first grouping is whole
    same = _next(view, 2)
    changes = grouper.regroup(same)
    assert changes is not None
    assert (set(changes.pods), set(changes.groups), set(changes.pod_groups)) == (set(), set(), set())
    assert grouper.groups[DERIVED].min_member == 4
    assert grouper.drifted(same) == []  # nothing touched: nothing to compare with its PodGroup


def test_an_owner_read_again_regroups_its_pods() -> None:
    owners = CachingOwners(parallelism=4)
    view = View(pods={u: _pod(u) for u in ("a", "b")}, podgroups={}, generation=1)
    grouper = PodGrouper(owners, default_queue="default")
    grouper.regroup(view)
    owners.parallelism = 2
    owners.read_again()  # the resolver's TTL ran out and the Job was scaled down meanwhile
    changes = grouper.regroup(_next(view, 2))
    assert changes is not None
    assert set(changes.pods) == {"a", "b"}
    assert set(changes.groups) == {DERIVED}
    assert grouper.groups[DERIVED].min_member == 2


def test_a_finished_pod_keeps_its_group_without_its_owner_being_read() -> None:
    owners = CachingOwners()
    running = {u: _pod(u) for u in ("a", "b")}
    view = View(pods=running, podgroups={}, generation=1)
    grouper = PodGrouper(owners, default_queue="default")
    grouper.regroup(view)
    done = {u: {**pod, "status": {"phase": "Succeeded"}} for u, pod in running.items()}
    finished = View(done, {}, generation=2, changed=Changed(since=1, pods={"a", "b"}))
    grouper.regroup(finished)
    assert not grouper._derived_uids  # out of the set each cycle looks through
    assert not grouper._inputs  # and their owners are not held
    before = owners.calls
    owners.read_again()  # even an owner read again is not looked at for finished pods
    for generation in range(3, 6):
        changes = grouper.regroup(_next(finished, generation))
        assert changes is not None and not changes.pods
    assert owners.calls == before
    assert grouper.by_uid == {"a": DERIVED[1], "b": DERIVED[1]}
    assert grouper.groups[DERIVED].min_member == 4


def test_a_derived_podgroup_deleted_while_its_group_lives_is_made_again() -> None:
    """Deleted by hand, say: the scheduler stops taking it as created, and hands it over to be created again."""
    owners = CachingOwners(parallelism=1)
    pg = _podgroup(DERIVED[1], 1, "default", ours=True)
    view = View(pods={"a": _pod("a")}, podgroups={DERIVED: pg}, generation=1)
    grouper = PodGrouper(owners, default_queue="default")
    grouper.regroup(view)
    assert grouper.created(DERIVED) and grouper.take_missing() == {}
    gone = View(view.pods, {}, generation=2, changed=Changed(since=1, podgroups={DERIVED}))
    grouper.regroup(gone)
    assert not grouper.created(DERIVED)
    assert list(grouper.take_missing()) == [DERIVED]
    # A whole regroup (a fresh view) keeps only the PodGroups it sees as created.
    grouper.mark_created(("ns", "elsewhere"))
    grouper.regroup(View(view.pods, {DERIVED: pg}, generation=7))
    assert grouper.created(DERIVED) and not grouper.created(("ns", "elsewhere"))
