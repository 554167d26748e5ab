"""Pod groups derived from the workload that owns a pod."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import ANNOTATION_POD_GROUP, LABEL_KAI_QUEUE, LABEL_QUEUE
from scheduler.cluster.grouping import OwnerRef, derive_group
from tests.scheduler.cluster.objects import pod_json


def obj(api_version: str, kind: str, name: str, spec: dict[str, Any] | None = None, *,
        owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{kind}-{name}", "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
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
    # Autoscaling: what each group always keeps, its minReplicas (CRD default 0).
    rc_auto = obj("ray.io/v1", "RayCluster", "rc", {**spec, "enableInTreeAutoscaling": True})
    assert derive_group(pod_of(rc_auto), [rc_auto]).min_member == 2
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
        assert group.lone  # its PodGroup would repeat the pod: made only when it has news


def test_only_a_group_derived_from_its_one_pod_is_lone() -> None:
    """A Job of one pod, an unknown owner's pods or a LeaderReady leader's group are the owner's: not lone."""
    job = obj("batch/v1", "Job", "once", {"parallelism": 1})
    custom = obj("example.com/v1", "Trainer", "t")
    lws = obj(
        "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve",
        {"startupPolicy": "LeaderReady", "leaderWorkerTemplate": {"size": 4}},
    )  # fmt: skip
    leader_sts = obj("apps/v1", "StatefulSet", "serve", owner=lws)
    label = {"leaderworkerset.sigs.k8s.io/group-index": "0"}
    for pod, owners in (
        (pod_of(job), [job]),
        (pod_of(custom), [custom]),
        (pod_of(leader_sts, labels=label), [leader_sts, lws]),
    ):
        group = derive_group(pod, owners)
        assert group.min_member == 1 and not group.lone, group
    # A leaderworkerset pod without its group index is grouped alone: lone.
    assert derive_group(pod_of(leader_sts), [leader_sts, lws]).lone


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


# -- staged start-up -------------------------------------------------------------
#
# The objects below are the operators' own examples (file and revision named
# at each), reduced to the fields grouping reads; the Jobs and pods are made
# as each operator's controller makes them.

JOBSET_V = "jobset.x-k8s.io/v1alpha2"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


def jobset_pod(js: dict[str, Any], rjob: str, index: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A pod of replicated job ``rjob``, with its Job, as the JobSet controller makes them.

    kubernetes-sigs/jobset@08dfbdfd pkg/controllers/jobset_controller.go
    (constructJob, labelAndAnnotateObject): Job ``<jobset>-<rjob>-<index>``
    owned by the JobSet, the replicated job's name labelled on the Job and
    on its pod template.
    """
    name = f"{js['metadata']['name']}-{rjob}-{index}"
    job = obj("batch/v1", "Job", name, {}, owner=js, labels={RJOB_LABEL: rjob})
    return pod_json(f"{name}-0", owners=[ref(job)], labels={RJOB_LABEL: rjob}), [job, js]


def _rjob(name: str, size: int = 1, *, depends: list[tuple[str, str]] | None = None,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    rjob: dict[str, Any] = {"name": name, "template": {"spec": {"parallelism": size, "completions": size}}, **extra}
    if depends:
        rjob["dependsOn"] = [{"name": n, "status": status} for n, status in depends]
    return rjob


def test_a_jobset_with_depends_on_is_one_gang_per_stage_so_the_first_does_not_wait_for_the_next() -> None:
    # kubernetes-sigs/jobset@08dfbdfd site/static/examples/depends-on/depends-on.yaml:
    # the launcher waits for the initializer to complete, the workers for the
    # launcher to be ready (pkg/controllers/depends_on.go).
    js = obj(JOBSET_V, "JobSet", "depends-on", {"replicatedJobs": [
        _rjob("initializer"),
        _rjob("launcher", depends=[("initializer", "Complete")]),
        _rjob("worker", 4, depends=[("launcher", "Ready")]),
    ]}, labels={LABEL_QUEUE: "team-a"})  # fmt: skip
    groups = {rjob: derive_group(*jobset_pod(js, rjob)) for rjob in ("initializer", "launcher", "worker")}
    uid = "uid-jobset-depends-on"
    assert {r: (g.name, g.min_member) for r, g in groups.items()} == {
        "initializer": (f"pg-depends-on-initializer-{uid}", 1),
        "launcher": (f"pg-depends-on-launcher-{uid}", 1),
        "worker": (f"pg-depends-on-worker-{uid}", 4),
    }
    assert {(g.queue, g.owner and g.owner.kind) for g in groups.values()} == {("team-a", "JobSet")}


def test_a_trainjobs_initializers_are_one_gang_and_its_trainer_nodes_the_next_in_the_trainjobs_queue() -> None:
    # kubeflow/trainer@8c0f5059 manifests/base/runtimes (the torchtune runtimes)
    # and examples/yaml/05-multi-step.yaml: the ``node`` job dependsOn the
    # initializers with status Complete; the JobSet is named as the TrainJob
    # and owned by it, carries the runtime template's labels, not the
    # TrainJob's (pkg/runtime/framework/plugins/jobset/jobset.go, Build), and
    # the trainer job runs numNodes pods at once (builder.go, Trainer).
    trainjob = obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "multi-step", {"trainer": {"numNodes": 2}},
                   labels={LABEL_KAI_QUEUE: "research"})  # fmt: skip
    init = {"replicas": 1}
    js = obj(JOBSET_V, "JobSet", "multi-step", {"replicatedJobs": [
        _rjob("dataset-initializer", **init),
        _rjob("model-initializer", **init),
        _rjob("node", 2, depends=[("dataset-initializer", "Complete"), ("model-initializer", "Complete")]),
    ]}, owner=trainjob, labels={"trainer.kubeflow.org/framework": "torch",
                                LABEL_KAI_QUEUE: "runtime-default"})  # fmt: skip
    uid = "uid-jobset-multi-step"
    for rjob, (name, size) in {
        "dataset-initializer": (f"pg-multi-step-dataset-initializer-{uid}", 2),
        "model-initializer": (f"pg-multi-step-dataset-initializer-{uid}", 2),
        "node": (f"pg-multi-step-node-{uid}", 2),
    }.items():
        pod, owners = jobset_pod(js, rjob)
        group = derive_group(pod, [*owners, trainjob])
        # The user's label on the TrainJob, over the runtime's on the JobSet.
        assert (group.name, group.min_member, group.queue) == (name, size, "research")


def test_a_jobset_started_in_order_is_one_gang_per_replicated_job() -> None:
    # kubernetes-sigs/jobset@08dfbdfd site/static/examples/startup-policy/startup-driver-ready.yaml:
    # the workers are created once the driver has started (startup_policy.go).
    spec = {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [_rjob("driver"),
                                                                                  _rjob("workers", 4)]}  # fmt: skip
    js = obj(JOBSET_V, "JobSet", "startup-driver-ready", spec)
    driver, workers = (derive_group(*jobset_pod(js, r)) for r in ("driver", "workers"))
    assert (driver.min_member, workers.min_member) == (1, 4)
    assert driver.name.startswith("pg-startup-driver-ready-driver-") and workers.name != driver.name
    # AnyOrder (the default): every Job at once, one gang of all of them.
    any_order_spec = {**spec, "startupPolicy": {"startupPolicyOrder": "AnyOrder"}}
    any_order = obj(JOBSET_V, "JobSet", "startup-driver-ready", any_order_spec)
    whole = {derive_group(*jobset_pod(any_order, r)) for r in ("driver", "workers")}
    assert {(g.name, g.min_member) for g in whole} == {("pg-startup-driver-ready-uid-jobset-startup-driver-ready", 5)}


def test_a_jobset_with_exclusive_placement_counts_each_jobs_leader_only() -> None:
    # kubernetes-sigs/jobset@08dfbdfd site/static/examples/simple/exclusive-placement.yaml;
    # pkg/webhooks/pod_webhook.go (ValidateCreate) admits a follower only once
    # its Job's leader is scheduled: three Jobs of three, three leaders first.
    exclusive = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
    spec = {"replicatedJobs": [_rjob("workers", 3, replicas=3)]}
    js = obj(JOBSET_V, "JobSet", "exclusive-placement", spec, annotations=exclusive)
    assert derive_group(*jobset_pod(js, "workers")).min_member == 3
    # On a replicated job's template instead of the JobSet: the same.
    on_template = {"replicatedJobs": [{**_rjob("workers", 3, replicas=3), "template": {
        "metadata": {"annotations": exclusive}, "spec": {"parallelism": 3, "completions": 3}}}]}  # fmt: skip
    assert derive_group(*jobset_pod(obj(JOBSET_V, "JobSet", "e", on_template), "workers")).min_member == 3
    # The node-selector strategy has no such wait: all nine at once.
    strategy = {**exclusive, "alpha.jobset.sigs.k8s.io/node-selector": "true"}
    js_ns = obj(JOBSET_V, "JobSet", "exclusive-placement", spec, annotations=strategy)
    assert derive_group(*jobset_pod(js_ns, "workers")).min_member == 9
    # The flag counts only beside its own exclusive key (labelAndAnnotateObject).
    on_template_ns = obj(
        JOBSET_V, "JobSet", "e", on_template, annotations={"alpha.jobset.sigs.k8s.io/node-selector": "true"}
    )
    assert derive_group(*jobset_pod(on_template_ns, "workers")).min_member == 3


def test_a_staged_jobset_pod_without_its_replicated_job_label_is_grouped_by_its_job() -> None:
    js = obj(JOBSET_V, "JobSet", "d", {"replicatedJobs": [_rjob("a"), _rjob("b", 2, depends=[("a", "Ready")])]})
    job = obj("batch/v1", "Job", "d-b-0", {"parallelism": 2, "completions": 2}, owner=js)
    group = derive_group(pod_of(job), [job, js])
    assert (group.name, group.min_member) == ("pg-d-b-0-uid-job-d-b-0", 2)


def _lws_leader(lws: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    leader_sts = obj("apps/v1", "StatefulSet", lws["metadata"]["name"], owner=lws)
    labels = {"leaderworkerset.sigs.k8s.io/group-index": "0"}
    return pod_of(leader_sts, labels=labels), [leader_sts, lws]


def test_a_leaderworkerset_with_exclusive_topology_starts_each_group_with_its_leader() -> None:
    # kubernetes-sigs/lws@060ab4da config/samples/leaderworkerset_exclusiveplacement.yaml;
    # pkg/controllers/pod_controller.go makes a group's worker StatefulSet
    # only once its leader pod is scheduled (spec.nodeName set).
    spec = {"replicas": 3, "leaderWorkerTemplate": {"size": 4, "restartPolicy": "RecreateGroupOnPodRestart"}}
    exclusive = {"leaderworkerset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkerset-sample", spec, annotations=exclusive)
    group = derive_group(*_lws_leader(lws))
    name = "pg-leaderworkerset-sample-0-uid-leaderworkerset-leaderworkerset-sample"
    assert (group.name, group.min_member) == (name, 1)
    plain = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkerset-sample", spec)
    assert derive_group(*_lws_leader(plain)).min_member == 4


MPI_ROLE = "training.kubeflow.org/job-role"


def _pi(policy: str | None) -> dict[str, Any]:
    # kubeflow/mpi-operator@caa3c47f examples/v2beta1/pi/pi.yaml (two workers,
    # one launcher), with the launcher creation policy under test.
    spec: dict[str, Any] = {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
                            "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 2}}}  # fmt: skip
    if policy is not None:
        spec["launcherCreationPolicy"] = policy
    return obj("kubeflow.org/v2beta1", "MPIJob", "pi", spec, labels={LABEL_QUEUE: "hpc"})


def _pi_pods(mpijob: dict[str, Any]) -> tuple[tuple[dict[str, Any], list[dict[str, Any]]], ...]:
    """A worker and the launcher, as mpi-operator v2 makes them.

    kubeflow/mpi-operator@caa3c47f pkg/controller/mpi_job_controller.go:
    workers are pods owned by the MPIJob (newWorker), the launcher a batch
    Job ``<job>-launcher`` owned by it (newLauncherJob); pods labelled
    training.kubeflow.org/job-role worker or launcher (defaultLabels).
    """
    worker = pod_json("pi-worker-0", owners=[ref(mpijob)], labels={MPI_ROLE: "worker"})
    launcher_job = obj("batch/v1", "Job", "pi-launcher", {}, owner=mpijob, labels={"app": "pi"})
    launcher = pod_json("pi-launcher-x", owners=[ref(launcher_job)], labels={MPI_ROLE: "launcher"})
    return (worker, [mpijob]), (launcher, [launcher_job, mpijob])


def test_an_mpijob_that_waits_for_its_workers_is_a_gang_of_workers_and_a_launcher_apart() -> None:
    # WaitForWorkersReady: the launcher Job is created once every worker pod
    # is Ready (syncHandler, countReadyWorkerPods).
    waiting = _pi("WaitForWorkersReady")
    (worker, w_owners), (launcher, l_owners) = _pi_pods(waiting)
    workers, alone = derive_group(worker, w_owners), derive_group(launcher, l_owners)
    assert (workers.name, workers.min_member) == ("pg-pi-uid-mpijob-pi", 2)
    assert (alone.name, alone.min_member) == ("pg-pi-launcher-uid-job-pi-launcher", 1)
    assert alone.owner == OwnerRef("batch/v1", "Job", "pi-launcher", "uid-Job-pi-launcher")
    assert workers.queue == alone.queue == "hpc"
    # AtStartup (the default): everything at once, one gang of three.
    for policy in (None, "AtStartup"):
        groups = {derive_group(p, o) for p, o in _pi_pods(_pi(policy))}
        assert {(g.name, g.min_member) for g in groups} == {("pg-pi-uid-mpijob-pi", 3)}


def test_an_mpijob_read_as_v1_has_no_launcher_policy_and_stays_one_gang() -> None:
    # kubeflow/trainer@4445c12a (v1.9.4) pkg/controller.v1/mpi: the v1
    # launcher is a bare pod of the MPIJob, created with the workers.
    spec = {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 2}}}
    v1 = obj("kubeflow.org/v1", "MPIJob", "tensorflow-mnist", spec)
    launcher = pod_json("tensorflow-mnist-launcher", owners=[ref(v1)], labels={MPI_ROLE: "master"})
    assert derive_group(launcher, [v1]).min_member == 3


# -- sizes ---------------------------------------------------------------------------


def _ray(*groups: dict[str, Any]) -> dict[str, Any]:
    # ray-project/kuberay@feeaf72f ray-operator/config/samples/ray-cluster.sample.yaml
    # (one worker group), with the worker groups under test.
    return obj("ray.io/v1", "RayCluster", "raycluster-kuberay", {"headGroupSpec": {"rayStartParams": {}},
                                                                 "workerGroupSpecs": list(groups)})  # fmt: skip


def test_a_raycluster_is_sized_as_kuberay_clamps_each_group() -> None:
    # ray-operator/controllers/ray/utils/util.go GetWorkerGroupDesiredReplicas:
    # replicas clamped to [minReplicas, maxReplicas], times numOfHosts, none
    # for a suspended group; plus the head.
    cases = {
        # replicas omitted: as the CRD defaults it (0), so minReplicas.
        "omitted": ({"groupName": "w", "minReplicas": 2}, 3),
        "crd-default": ({"groupName": "w", "replicas": 0, "minReplicas": 2, "maxReplicas": 2147483647}, 3),
        "sample": ({"groupName": "workergroup", "replicas": 1, "minReplicas": 1, "maxReplicas": 5}, 2),
        "above-max": ({"groupName": "w", "replicas": 10, "minReplicas": 1, "maxReplicas": 4}, 5),
        "multi-host": ({"groupName": "w", "replicas": 3, "maxReplicas": 2, "numOfHosts": 4}, 9),
        "suspended": ({"groupName": "w", "replicas": 3, "suspend": True}, 1),
        "no-min": ({"groupName": "w"}, 1),
    }
    for case, (group, size) in cases.items():
        rc = _ray(group)
        assert derive_group(pod_of(rc), [rc]).min_member == size, case
    two = _ray(cases["omitted"][0], cases["above-max"][0])
    assert derive_group(pod_of(two), [two]).min_member == 1 + 2 + 4


def test_a_rayservice_is_followed_and_each_of_its_rayclusters_is_a_gang() -> None:
    # ray-project/kuberay@feeaf72f ray-operator/controllers/ray/rayservice_controller.go:
    # RayClusters <service>-<random> owned by the RayService (an upgrade runs
    # a pending one beside the active one), each with its own pods.
    service = obj("ray.io/v1", "RayService", "rayservice-sample", {}, labels={LABEL_QUEUE: "serving"})
    spec = {"workerGroupSpecs": [{"groupName": "small-group", "replicas": 1, "minReplicas": 1}]}
    active = obj("ray.io/v1", "RayCluster", "rayservice-sample-abcde", spec, owner=service)
    pending = obj("ray.io/v1", "RayCluster", "rayservice-sample-fghij", spec, owner=service)
    groups = [derive_group(pod_of(rc), [rc, service]) for rc in (active, pending)]
    assert [(g.owner and g.owner.name, g.min_member, g.queue) for g in groups] == [
        ("rayservice-sample-abcde", 2, "serving"), ("rayservice-sample-fghij", 2, "serving")]  # fmt: skip


# -- queues --------------------------------------------------------------------------


def test_kubeflows_scheduling_policy_queue_comes_after_the_queue_labels() -> None:
    spec = {"runPolicy": {"schedulingPolicy": {"queue": "from-policy"}}, "pytorchReplicaSpecs": {"Worker": {}}}
    ptj = obj("kubeflow.org/v1", "PyTorchJob", "bert", spec)
    assert derive_group(pod_of(ptj), [ptj]).queue == "from-policy"
    # gpuwarden's or KAI's label, on the job or on the pod, is more specific.
    labelled = obj("kubeflow.org/v1", "PyTorchJob", "bert", spec, labels={LABEL_KAI_QUEUE: "from-label"})
    assert derive_group(pod_of(labelled), [labelled]).queue == "from-label"
    assert derive_group(pod_of(ptj, labels={LABEL_QUEUE: "from-pod"}), [ptj]).queue == "from-pod"
    # mpi-operator v2: the launcher, grouped by its own Job, still reads its MPIJob's policy.
    mpijob = _pi("WaitForWorkersReady")
    mpijob["metadata"]["labels"] = {}
    mpijob["spec"]["runPolicy"]["schedulingPolicy"] = {"queue": "hpc-policy", "priorityClass": "batch-high"}
    for pod, owners in _pi_pods(mpijob):
        group = derive_group(pod, owners)
        assert (group.queue, group.priority_class_name) == ("hpc-policy", "batch-high")


def test_the_outermost_owner_of_a_group_decides_its_queue() -> None:
    cron = obj("batch/v1", "CronJob", "nightly", labels={LABEL_QUEUE: "from-cron"})
    job = obj("batch/v1", "Job", "nightly-1", {}, owner=cron, labels={LABEL_QUEUE: "from-template"})
    assert derive_group(pod_of(job), [job, cron]).queue == "from-cron"


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


# Field values as a malformed or unusual object may hold them.
_value = st.none() | st.booleans() | st.integers(-2, 6) | st.sampled_from(["", "3", "Ready", "Complete"])
_count_or_junk = st.integers(0, 5) | _value


@st.composite
def _jobset(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True))
    rjobs = []
    for position, name in enumerate(names):
        rjob: dict[str, Any] = {"name": name, "replicas": draw(_count_or_junk), "template": {
            "spec": {"parallelism": draw(_count_or_junk), "completions": draw(_count_or_junk)}}}  # fmt: skip
        earlier = names[:position]
        if earlier and draw(st.booleans()):
            deps = draw(st.lists(st.sampled_from(earlier), min_size=1, unique=True))
            rjob["dependsOn"] = [{"name": d, "status": draw(st.sampled_from(["Ready", "Complete", 7]))} for d in deps]
        if draw(st.booleans()):
            rjob["template"]["metadata"] = {"annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "rack"}}
        rjobs.append(rjob)
    spec: dict[str, Any] = {"replicatedJobs": rjobs}
    if draw(st.booleans()):
        spec["startupPolicy"] = {"startupPolicyOrder": draw(st.sampled_from(["InOrder", "AnyOrder", None]))}
    return obj(JOBSET_V, "JobSet", "js", spec, labels=draw(st.sampled_from([{}, {LABEL_QUEUE: "js-q"}])))


@st.composite
def _owned_pod(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A pod and its owner chain for one of the staged or sized kinds, with random specs."""
    kind = draw(st.sampled_from(["jobset", "trainjob", "mpijob", "ray", "lws"]))
    if kind in ("jobset", "trainjob"):
        js = draw(_jobset())
        owners: list[dict[str, Any]] = []
        if kind == "trainjob":
            trainjob = obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "js", {}, labels={LABEL_KAI_QUEUE: "t"})
            js["metadata"]["ownerReferences"] = [ref(trainjob)]
            owners.append(trainjob)
        rjob = draw(st.sampled_from([*(r["name"] for r in js["spec"]["replicatedJobs"]), "unknown"]))
        pod, chain = jobset_pod(js, rjob, draw(st.integers(0, 2)))
        if draw(st.booleans()):
            del pod["metadata"]["labels"][RJOB_LABEL]
        return pod, chain + owners
    if kind == "mpijob":
        workers = {"Launcher": {"replicas": 1}, "Worker": {"replicas": draw(_count_or_junk)}}
        spec = {"launcherCreationPolicy": draw(st.sampled_from(["WaitForWorkersReady", "AtStartup", None, 3])),
                "runPolicy": {"schedulingPolicy": {"minAvailable": draw(_value), "queue": draw(_value)}},
                "mpiReplicaSpecs": workers}  # fmt: skip
        mpijob = obj(draw(st.sampled_from(["kubeflow.org/v2beta1", "kubeflow.org/v1"])), "MPIJob", "pi", spec)
        return draw(st.sampled_from(_pi_pods(mpijob)))
    if kind == "ray":
        groups = draw(st.lists(st.fixed_dictionaries({
            "replicas": _count_or_junk, "minReplicas": _count_or_junk, "maxReplicas": _count_or_junk,
            "numOfHosts": _count_or_junk, "suspend": _value}), max_size=3))  # fmt: skip
        rc = _ray(*groups)
        rc["spec"]["enableInTreeAutoscaling"] = draw(_value)
        if draw(st.booleans()):
            service = obj("ray.io/v1", "RayService", "svc", {}, labels={LABEL_QUEUE: "svc-q"})
            rc["metadata"]["ownerReferences"] = [ref(service)]
            return pod_of(rc), [rc, service]
        return pod_of(rc), [rc]
    spec = {"startupPolicy": draw(_value), "leaderWorkerTemplate": {"size": draw(_count_or_junk)}}
    annotations = draw(st.sampled_from([{}, {"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"}]))
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws", spec, annotations=annotations)
    return _lws_leader(lws)


@settings(max_examples=300, deadline=None)
@given(_owned_pod(), st.data())
def test_staged_and_sized_kinds_never_raise_and_ignore_owner_order(
    case: tuple[dict[str, Any], list[dict[str, Any]]], data: st.DataObject
) -> None:
    pod, owners = case
    decoy = obj("batch/v1", "Job", "decoy", {"parallelism": 9})
    shuffled = data.draw(st.permutations([*owners, decoy]))
    group = derive_group(pod, owners)
    assert derive_group(pod, shuffled) == group
    assert group.min_member >= 1 and group.name and group.queue
    js = next((o for o in owners if o["kind"] == "JobSet"), None)
    if js is None:
        return
    # A stage never counts more pods than the whole JobSet started at once would.
    flat = json.loads(json.dumps(js))
    flat["spec"].pop("startupPolicy", None)
    for rjob in flat["spec"]["replicatedJobs"]:
        rjob.pop("dependsOn", None)
        rjob["template"].pop("metadata", None)
    assert group.min_member <= derive_group(pod, [owners[0], flat, *owners[2:]]).min_member
    # Every pod of a replicated job the JobSet names lands in the same group,
    # whichever of its Jobs it is in (one it does not name: its own Job's).
    rjob = owners[0]["metadata"]["labels"][RJOB_LABEL]
    other, other_owners = jobset_pod(js, rjob, 3)
    if rjob != "unknown":
        again = derive_group(other, [*other_owners, *owners[2:]])
        assert (again.name, again.min_member, again.queue) == (group.name, group.min_member, group.queue)
