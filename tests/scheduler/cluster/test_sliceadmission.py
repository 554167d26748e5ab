"""What a GPU slice pod must carry: the webhook injects it, the scheduler refuses a pod without it.

No cluster here: the webhook's verdict, the pod as it would be stored after
its patch, and the scheduler's reading of both (its converter, its cache's
pruning, one engine session). The same cases against the real API server
are in test_webhook_k8s.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden import contract
from scheduler.cluster.convert import GroupInfo, snapshot_from, task_from_pod
from scheduler.cluster.sliceadmission import (
    RESERVED_ENV,
    SHARING_ANNOTATIONS,
    SliceAdmission,
    missing_injection,
    reserved,
    sharing_changed_expression,
)
from scheduler.cluster.sliceconfig import config_map_name
from scheduler.cluster.slim import slim_pod
from scheduler.cluster.webhook.review import review_pod
from scheduler.engine.model import Queue, QueueResource, SchedulerConfig
from scheduler.engine.session import run_session

RUNTIME = "hami"
ADMISSION = SliceAdmission(RUNTIME)


def slice_pod(name: str = "p", annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"schedulerName": contract.SCHEDULER_NAME, "containers": [{"name": "main"}], **spec}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "annotations": {contract.ANNOTATION_GPU_FRACTION: "0.5"} if annotations is None else annotations,
        },
        "spec": body,
        "status": {"phase": "Pending"},
    }


def admitted(pod: dict[str, Any], runtime_class: str | None = RUNTIME) -> dict[str, Any]:
    """The pod as the API server stores it after the webhook's patch (its "add" operations applied)."""
    verdict = review_pod(pod, largest_gpu_mib=None, runtime_class=runtime_class)
    assert verdict.allowed, verdict.message
    out = copy.deepcopy(pod)
    for op in verdict.patch:
        assert op["op"] == "add"
        *parents, last = op["path"].strip("/").split("/")
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


SHAPES = {
    "one container": {},
    "init and main containers": {"initContainers": [{"name": "fetch"}], "containers": [{"name": "a"}, {"name": "b"}]},
    "its own envFrom": {
        "containers": [{"name": "main", "envFrom": [{"configMapRef": {"name": "settings"}}]}],
    },
    "its own runtime class": {"runtimeClassName": "mine"},
    "a sidecar": {"initContainers": [{"name": "proxy", "restartPolicy": "Always"}]},
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
@pytest.mark.parametrize(
    "annotations",
    [
        {contract.ANNOTATION_GPU_FRACTION: "0.25"},
        {contract.ANNOTATION_GPU_MEMORY: "20000", contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: "2"},
        {contract.ANNOTATION_KAI_GPU_FRACTION: "0.5"},
    ],
    ids=["fraction", "memory on two devices", "KAI fraction"],
)
def test_what_the_webhook_injects_is_exactly_what_the_scheduler_requires(
    shape: dict[str, Any], annotations: dict[str, str]
) -> None:
    pod = slice_pod(annotations=annotations, **shape)
    assert ADMISSION.refusal(pod) is not None, "not yet admitted: refused"
    stored = admitted(pod)
    assert ADMISSION.refusal(stored) is None
    assert missing_injection(stored, "p", RUNTIME) == []
    assert task_from_pod(stored, ADMISSION).refusal == ""
    # The cache's pruned copy reads the same.
    assert task_from_pod(slim_pod(stored), ADMISSION).refusal == ""
    assert task_from_pod(slim_pod(pod), ADMISSION).refusal == task_from_pod(pod, ADMISSION).refusal != ""


def test_a_pod_annotated_as_a_slice_after_creation_is_refused_saying_what_it_lacks_and_how_to_fix_it() -> None:
    pod = slice_pod(initContainers=[{"name": "fetch"}])
    why = task_from_pod(pod, ADMISSION).refusal
    assert f"container 'fetch' has no envFrom of its slice ConfigMap {config_map_name('p')}" in why
    assert "container 'main' has no envFrom" in why
    assert f"the pod has no runtimeClassName (the webhook sets {RUNTIME}" in why
    assert "see whole GPUs" in why
    assert "delete the pod and create it again" in why
    assert "kube-system and gpuwarden are excluded and cannot run GPU slices" in why


def test_an_optional_or_prefixed_envfrom_of_the_slice_does_not_count() -> None:
    ref = {"configMapRef": {"name": config_map_name("p"), "optional": True}}
    optional = slice_pod(runtimeClassName=RUNTIME, containers=[{"name": "main", "envFrom": [ref]}])
    assert "container 'main' has no envFrom" in (ADMISSION.refusal(optional) or "")
    prefixed = {"prefix": "X_", "configMapRef": {"name": config_map_name("p")}}
    renamed = slice_pod(runtimeClassName=RUNTIME, containers=[{"name": "main", "envFrom": [prefixed]}])
    assert "container 'main' has no envFrom" in (ADMISSION.refusal(renamed) or "")
    plain = {"configMapRef": {"name": config_map_name("p")}}
    hand_written = slice_pod(runtimeClassName=RUNTIME, containers=[{"name": "main", "envFrom": [plain]}])
    assert ADMISSION.refusal(hand_written) is None


def test_without_a_configured_runtime_class_only_the_envfrom_is_required() -> None:
    pod = admitted(slice_pod(), runtime_class=None)
    assert "runtimeClassName" not in pod["spec"]
    assert SliceAdmission(None).refusal(pod) is None
    assert "no runtimeClassName" in (SliceAdmission(RUNTIME).refusal(pod) or "")


def test_a_container_that_sets_a_slice_variable_is_refused_even_in_the_pruned_cache_copy() -> None:
    env = [{"name": "LANG", "value": "C"}, {"name": f"{contract.ENV_CUDA_DEVICE_MEMORY_LIMIT}_0", "value": "0"}]
    stored = admitted(slice_pod())
    stored["spec"]["containers"][0]["env"] = env
    why = task_from_pod(slim_pod(stored), ADMISSION).refusal
    assert f"container 'main' sets {contract.ENV_CUDA_DEVICE_MEMORY_LIMIT}_0" in why
    assert slim_pod(stored)["spec"]["containers"][0]["env"] == env[1:]


def test_only_pending_well_formed_slice_pods_are_checked() -> None:
    whole = slice_pod(annotations={})
    whole["spec"]["containers"][0]["resources"] = {"limits": {contract.RESOURCE_NVIDIA_GPU: "1"}}
    assert task_from_pod(whole, ADMISSION).refusal == ""
    # Malformed: the engine's InvalidRequest says why, not this check.
    assert task_from_pod(slice_pod(annotations={contract.ANNOTATION_GPU_FRACTION: "2"}), ADMISSION).refusal == ""
    bound = slice_pod(nodeName="n1")
    assert task_from_pod(bound, ADMISSION).refusal == ""
    # Without an admission to check against (the webhook's own reading), nothing is refused.
    assert task_from_pod(slice_pod()).refusal == ""


def test_the_engine_never_places_a_refused_slice_pod_and_says_why_on_its_group() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", contract.RESOURCE_NVIDIA_GPU: "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    queue = Queue(name="q", gpu=QueueResource(quota=8000))
    groups = {("ns", "bare"): GroupInfo(queue="q"), ("ns", "ok"): GroupInfo(queue="q")}
    bare = slice_pod("bare")
    ok = admitted(slice_pod("ok"))
    bare["metadata"]["annotations"][contract.ANNOTATION_POD_GROUP] = "bare"
    ok["metadata"]["annotations"][contract.ANNOTATION_POD_GROUP] = "ok"
    snapshot = snapshot_from({"n1": node}, {}, [bare, ok], [queue], groups, 0.0, SchedulerConfig(), admission=ADMISSION)
    decisions = run_session(snapshot)
    assert [b.pod for b in decisions.binds] == ["ok"]
    (pending,) = decisions.pending
    assert pending.job == "ns/bare"
    (reason,) = pending.reasons
    assert reason.code is contract.UnschedulableReason.SLICE_NOT_ADMITTED
    assert reason.message.startswith("pod bare is not placed: it would not obey its GPU slice")
    # The same snapshot without the check binds both: the check is what keeps the bare pod off.
    unchecked = snapshot_from({"n1": node}, {}, [bare, ok], [queue], groups, 0.0, SchedulerConfig())
    assert sorted(b.pod for b in run_session(unchecked).binds) == ["bare", "ok"]


def test_the_shipped_update_policy_names_every_sharing_annotation_and_the_webhook_stays_create_only() -> None:
    manifests = Path(__file__).resolve().parents[3] / "manifests" / "scheduler"
    docs = [d for d in yaml.safe_load_all((manifests / "gpu-sharing-policy.yaml").read_text()) if d]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["changed"] == sharing_changed_expression()
    assert all(f"'{key}'" in variables["changed"] for key in SHARING_ANNOTATIONS)
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"] and rule["resources"] == ["pods"]
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and "matchResources" not in binding["spec"]
    kustomization = yaml.safe_load((manifests / "kustomization.yaml").read_text())
    assert "gpu-sharing-policy.yaml" in kustomization["resources"]
    webhook = next(d for d in yaml.safe_load_all((manifests / "webhook.yaml").read_text()) if d and "webhooks" in d)
    assert [r["operations"] for r in webhook["webhooks"][0]["rules"]] == [["CREATE"]]


@given(
    st.one_of(
        st.sampled_from(RESERVED_ENV),
        st.builds(lambda v, s: v + s, st.sampled_from(RESERVED_ENV), st.sampled_from(["_0", "_", "0", "X_1", ""])),
        st.text(max_size=30),
        st.integers(),
        st.none(),
    )
)
def test_a_reserved_variable_is_one_the_slice_sets_or_its_per_device_form(name: object) -> None:
    """Each variable name, or the name followed by ``_`` and anything (``CUDA_DEVICE_MEMORY_LIMIT_0``)."""
    expected = isinstance(name, str) and any(name == v or name.startswith(v + "_") for v in RESERVED_ENV)
    assert reserved(name) is expected
