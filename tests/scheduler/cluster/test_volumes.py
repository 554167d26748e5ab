"""Pending pods' claims on a snapshot: a volume's zone and node affinity join the pod's rules; verdicts are kept."""

from __future__ import annotations

from scheduler.cluster.volumes import VolumeJudge
from scheduler.engine.model import Job, NodeTerm, Requirement, Snapshot, Task

ZONE = "topology.kubernetes.io/zone"


def _snapshot(*claims: str) -> Snapshot:
    task = Task(name="p", namespace="ns", claims=claims)
    return Snapshot(jobs=(Job(name="j", queue="q", namespace="ns", tasks=(task,)),))


def _claim(name: str, volume: str = "", modes: tuple[str, ...] = ("ReadWriteOnce",)) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"volumeName": volume, "accessModes": list(modes)}}


def test_a_zonal_volume_keeps_its_pod_in_its_zones() -> None:
    volume = {"metadata": {"name": "pv", "labels": {"failure-domain.beta.kubernetes.io/zone": "z1__z2"}}, "spec": {}}
    judged = VolumeJudge().apply(_snapshot("c"), {"ns/c": _claim("c", "pv")}, {"pv": volume})
    placement = judged.jobs[0].tasks[0].placement
    assert placement is not None
    assert placement.volume_terms == ((NodeTerm(expressions=(Requirement(ZONE, "In", ("z1", "z2")),)),),)


def test_claims_that_cannot_be_judged_make_the_pod_wait() -> None:
    judge = VolumeJudge()
    once = judge.apply(_snapshot("c"), {"ns/c": _claim("c", "pv", ("ReadWriteOncePod",))}, {})
    assert "ReadWriteOncePod" in once.jobs[0].tasks[0].unplaceable
    gone = judge.apply(_snapshot("c"), {"ns/c": _claim("c", "pv")}, {})
    assert gone.jobs[0].tasks[0].unplaceable == "persistentvolume pv of claim c not found"


def test_a_verdict_is_kept_until_the_claim_changes() -> None:
    judge = VolumeJudge()
    snapshot = _snapshot("c")
    waiting = {"ns/c": _claim("c")}
    first = judge.apply(snapshot, waiting, {})
    assert "not bound yet" in first.jobs[0].tasks[0].unplaceable
    assert judge.apply(snapshot, waiting, {}).jobs[0] is first.jobs[0]
    bound = {"ns/c": _claim("c", "pv")}
    later = judge.apply(snapshot, bound, {"pv": {"metadata": {"name": "pv"}, "spec": {}}})
    assert later.jobs[0] is snapshot.jobs[0]  # nothing to add: the job is the snapshot's own
