"""Pod groups derived from the workload that owns a pod."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import ANNOTATION_POD_GROUP, LABEL_KAI_QUEUE, LABEL_QUEUE
from scheduler.cluster.grouping import OwnerRef, derive_group
from tests.scheduler.cluster.objects import pod_json


def obj(api_version: str, kind: str, name: str, spec: dict[str, Any] | None = None, *,
        owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{kind}-{name}", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec or {}}


def ref(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": True}  # fmt: skip


def pod_of(owner: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    return pod_json("p-0", owners=[ref(owner)] if owner is not None else None, **kw)


def test_a_batch_job_is_one_gang_of_its_parallelism_capped_by_completions() -> None:
    job = obj("batch/v1", "Job", "train", {"parallelism": 8, "completions": 4})
    group = derive_group(pod_of(job), [job])
    assert group.name == "pg-train-uid-job-train"
    assert group.namespace == "team-a"
    assert group.min_member == 4
    assert group.owner == OwnerRef("batch/v1", "Job", "train", "uid-Job-train")
    assert derive_group(pod_of(obj("batch/v1", "Job", "j", {})), [obj("batch/v1", "Job", "j", {})]).min_member == 1


def test_a_cronjob_run_is_grouped_by_its_job() -> None:
    cron = obj("batch/v1", "CronJob", "nightly")
    job = obj("batch/v1", "Job", "nightly-123", {"parallelism": 2}, owner=cron)
    group = derive_group(pod_of(job), [job, cron])
    assert group.owner is not None and group.owner.kind == "Job"
    assert group.min_member == 2


def test_a_jobset_sums_replicas_times_each_job_size() -> None:
    js = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "llm", {"replicatedJobs": [
        {"name": "workers", "replicas": 4, "template": {"spec": {"parallelism": 2, "completions": 2}}},
        {"name": "driver", "template": {"spec": {}}},
    ]})  # fmt: skip
    job = obj("batch/v1", "Job", "llm-workers-0", {"parallelism": 2}, owner=js)
    group = derive_group(pod_of(job), [job, js])
    assert (group.min_member, group.owner and group.owner.kind) == (9, "JobSet")


def test_kubeflow_jobs_use_min_available_else_the_sum_of_replicas() -> None:
    spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 7}}}
    pt = obj("kubeflow.org/v1", "PyTorchJob", "bert", spec)
    assert derive_group(pod_of(pt), [pt]).min_member == 8
    spec2 = {**spec, "runPolicy": {"schedulingPolicy": {"minAvailable": 5, "priorityClass": "high"}}}
    pt2 = obj("kubeflow.org/v1", "PyTorchJob", "bert", spec2)
    group = derive_group(pod_of(pt2), [pt2])
    assert (group.min_member, group.priority_class_name) == (5, "high")
    mpi = obj("kubeflow.org/v2beta1", "MPIJob", "hpc", {"mpiReplicaSpecs": {"Launcher": {"replicas": 1},
                                                                             "Worker": {"replicas": 4}}})  # fmt: skip
    launcher_job = obj("batch/v1", "Job", "hpc-launcher", {}, owner=mpi)
    assert derive_group(pod_of(launcher_job), [launcher_job, mpi]).min_member == 5
    tf = obj("kubeflow.org/v1", "TFJob", "tf", {"tfReplicaSpecs": {"PS": {"replicas": 2}, "Worker": {}}})
    assert derive_group(pod_of(tf), [tf]).min_member == 3


def test_ray_counts_the_head_and_each_worker_group() -> None:
    spec = {"headGroupSpec": {}, "workerGroupSpecs": [
        {"replicas": 3, "minReplicas": 1}, {"replicas": 2, "numOfHosts": 2}]}  # fmt: skip
    rc = obj("ray.io/v1", "RayCluster", "rc", spec)
    assert derive_group(pod_of(rc), [rc]).min_member == 8
    rc_auto = obj("ray.io/v1", "RayCluster", "rc", {**spec, "enableInTreeAutoscaling": True})
    assert derive_group(pod_of(rc_auto), [rc_auto]).min_member == 6
    rayjob = obj("ray.io/v1", "RayJob", "rj", {"rayClusterSpec": spec})
    cluster = obj("ray.io/v1", "RayCluster", "rj-raycluster", spec, owner=rayjob)
    submitter = obj("batch/v1", "Job", "rj", {}, owner=rayjob)
    worker_group = derive_group(pod_of(cluster), [cluster, rayjob])
    submitter_group = derive_group(pod_of(submitter), [submitter, rayjob])
    assert worker_group.name == submitter_group.name == "pg-rj-uid-rayjob-rj"
    assert worker_group.min_member == 8


def test_a_leaderworkerset_has_one_group_per_replica() -> None:
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", {"leaderWorkerTemplate": {"size": 4}})
    leader_sts = obj("apps/v1", "StatefulSet", "serve", owner=lws)
    leader = obj("v1", "Pod", "serve-1", owner=leader_sts)
    worker_sts = obj("apps/v1", "StatefulSet", "serve-1", owner=leader)
    label = "leaderworkerset.sigs.k8s.io/group-index"
    g1 = derive_group(pod_of(worker_sts, labels={label: "1"}), [worker_sts, leader, leader_sts, lws])
    g1_leader = derive_group(pod_of(leader_sts, labels={label: "1"}), [leader_sts, lws])
    g0 = derive_group(pod_of(leader_sts, labels={label: "0"}), [leader_sts, lws])
    assert g1.name == g1_leader.name != g0.name
    assert g1.min_member == 4


def test_a_leaderworkerset_that_starts_workers_once_the_leader_is_ready_is_no_gang() -> None:
    # With LeaderReady the worker StatefulSet appears only after the leader
    # runs: a gang of ``size`` would wait for workers that wait for it.
    spec = {"startupPolicy": "LeaderReady", "leaderWorkerTemplate": {"size": 4}}
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", spec)
    leader_sts = obj("apps/v1", "StatefulSet", "serve", owner=lws)
    label = "leaderworkerset.sigs.k8s.io/group-index"
    group = derive_group(pod_of(leader_sts, labels={label: "0"}), [leader_sts, lws])
    assert (group.name, group.min_member) == ("pg-serve-0-uid-leaderworkerset-serve", 1)
    created = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", {**spec, "startupPolicy": "LeaderCreated"})
    assert derive_group(pod_of(leader_sts, labels={label: "0"}), [leader_sts, created]).min_member == 4


def test_replicas_step_pods_and_bare_pods_are_groups_of_one() -> None:
    deploy = obj("apps/v1", "Deployment", "web")
    rs = obj("apps/v1", "ReplicaSet", "web-abc", owner=deploy)
    wf = obj("argoproj.io/v1alpha1", "Workflow", "wf")
    for pod, owners in ((pod_of(rs), [rs, deploy]), (pod_of(wf), [wf]), (pod_of(None), [])):
        group = derive_group(pod, owners)
        assert group.min_member == 1
        assert group.name == "pg-p-0-uid-team-a-p-0"
        assert group.owner == OwnerRef("v1", "Pod", "p-0", "uid-team-a-p-0")


def test_an_unknown_owner_keeps_its_pods_together_without_a_gang() -> None:
    custom = obj("example.com/v1", "Trainer", "t")
    group = derive_group(pod_of(custom), [custom])
    assert (group.name, group.min_member) == ("pg-t-uid-trainer-t", 1)
    # An owner the caller could not read is known by its reference alone.
    job = obj("batch/v1", "Job", "gone", {"parallelism": 8})
    assert derive_group(pod_of(job), []).min_member == 1


def test_queue_comes_from_the_workload_then_the_pod_then_kai_then_the_default() -> None:
    job = obj("batch/v1", "Job", "j", labels={LABEL_QUEUE: "from-job"})
    assert derive_group(pod_of(job, labels={LABEL_QUEUE: "from-pod"}), [job]).queue == "from-job"
    plain = obj("batch/v1", "Job", "j")
    assert derive_group(pod_of(plain, labels={LABEL_QUEUE: "from-pod"}), [plain]).queue == "from-pod"
    assert derive_group(pod_of(plain, labels={LABEL_KAI_QUEUE: "kai"}), [plain]).queue == "kai"
    assert derive_group(pod_of(plain), [plain], default_queue="fallback").queue == "fallback"


def test_an_explicit_pod_group_annotation_wins() -> None:
    job = obj("batch/v1", "Job", "j", {"parallelism": 3})
    assert derive_group(pod_of(job, annotations={ANNOTATION_POD_GROUP: "mine"}), [job]).name == "mine"


def test_names_are_valid_object_names() -> None:
    job = obj("batch/v1", "Job", "x" * 300)
    name = derive_group(pod_of(job), [job]).name
    assert len(name) <= 253
    assert name == name.lower() and name[0].isalnum() and name[-1].isalnum()


def _chain() -> list[dict[str, Any]]:
    js = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", {"replicatedJobs": [{"replicas": 2, "template": {}}]})
    job = obj("batch/v1", "Job", "js-0", {"parallelism": 4}, owner=js)
    decoy = obj("batch/v1", "Job", "other", {"parallelism": 9})
    return [job, js, decoy]


@settings(max_examples=100, deadline=None)
@given(st.permutations(_chain()), st.booleans())
def test_derive_group_is_deterministic_and_ignores_owner_order(owners: list[dict[str, Any]], twice: bool) -> None:
    pod = pod_of(owners[0] if owners[0]["metadata"]["name"] == "js-0" else _chain()[0])
    listed = owners + owners if twice else owners
    assert derive_group(pod, listed) == derive_group(pod, _chain())
    assert derive_group(pod, _chain()).min_member == 2


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=15,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["metadata", "spec", "kind", "apiVersion"]), _json), st.lists(_json, max_size=3))
def test_derive_group_never_raises(pod: dict[str, Any], owners: list[Any]) -> None:
    group = derive_group(pod, owners)
    assert group.min_member >= 1 and group.name
