"""Pod to engine Task: requests as the kube-scheduler counts them, status, held GPUs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import ANNOTATION_GPU_FRACTION, RESOURCE_NVIDIA_GPU
from scheduler.cluster.assignment import encode_assignment
from scheduler.cluster.convert import _read_tolerations, task_from_pod
from scheduler.engine.model import Bind, Gpu, Node, TaskStatus, Toleration
from tests.scheduler.cluster.objects import pod_json, raw


def _container(cpu: str | None = None, mem: str | None = None, gpu: int = 0, **extra: Any) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if cpu:
        requests["cpu"] = cpu
    if mem:
        requests["memory"] = mem
    resources: dict[str, Any] = {"requests": requests}
    if gpu:
        resources["limits"] = {RESOURCE_NVIDIA_GPU: str(gpu)}
    return {"name": "c", "resources": resources, **extra}


def _pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers, **spec}
    if init is not None:
        body["initContainers"] = init
    return raw({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": body})


def test_requests_are_summed_over_containers_and_rounded_up() -> None:
    task = task_from_pod(_pod([_container("500m", "1Gi", 1), _container("0.0001", "1", 2)]))
    assert (task.cpu_milli, task.memory_mib, task.gpus) == (501, 1025, 3)
    assert (task.name, task.namespace, task.uid) == ("p", "ns", "u1")


def test_init_containers_count_at_their_peak_and_sidecars_alongside() -> None:
    init = [_container("4", "1Gi"), _container("1", "8Gi", 1)]
    task = task_from_pod(_pod([_container("2", "2Gi")], init))
    assert (task.cpu_milli, task.memory_mib, task.gpus) == (4000, 8192, 1)
    sidecar = [_container("1", "1Gi", restartPolicy="Always"), _container("3", "1Gi")]
    task = task_from_pod(_pod([_container("2", "2Gi")], sidecar))
    # Main containers plus the sidecar (3 cores) versus the one-shot init
    # container plus the sidecar already running (4 cores).
    assert (task.cpu_milli, task.memory_mib) == (4000, 3072)


def test_limits_stand_in_for_missing_requests_and_overhead_is_added() -> None:
    container = {"name": "c", "resources": {"limits": {"cpu": "2", "memory": "1Gi", RESOURCE_NVIDIA_GPU: "1"}}}
    task = task_from_pod(_pod([container], overhead={"cpu": "250m", "memory": "64Mi"}))
    assert (task.cpu_milli, task.memory_mib, task.gpus) == (2250, 1088, 1)


def test_status_follows_binding_and_deletion() -> None:
    assert task_from_pod(pod_json("a")).status is TaskStatus.PENDING
    bound = task_from_pod(pod_json("a", node="n1"))
    assert bound.status is TaskStatus.RUNNING and bound.node == "n1"
    assert task_from_pod(pod_json("a", node="n1", deleting=True)).status is TaskStatus.RELEASING


def test_held_gpus_come_from_the_assignment_for_the_pod_node() -> None:
    node = Node("n1", gpus=tuple(Gpu(i) for i in range(8)))
    text = encode_assignment(Bind("j", "team-a", "a", "u", "n1", gpu_indices=(5, 6)), node)
    assert task_from_pod(pod_json("a", node="n1", gpus=2, assignment=text)).gpu_indices == (5, 6)
    assert task_from_pod(pod_json("a", node="n2", gpus=2, assignment=text)).gpu_indices == ()
    assert task_from_pod(pod_json("a", node="n1", gpus=2, assignment="{oops")).gpu_indices == ()
    # A pending pod holds nothing, whatever it says.
    assert task_from_pod(pod_json("a", gpus=2, assignment=text)).gpu_indices == ()


def test_annotations_selectors_and_tolerations_pass_through() -> None:
    pod = pod_json("a", annotations={ANNOTATION_GPU_FRACTION: "0.5"})
    pod["spec"]["nodeSelector"] = {"gpu": "h100"}
    pod["spec"]["tolerations"] = [
        {"operator": "Exists"},
        {"key": "k", "value": "v", "effect": "NoSchedule"},
        {"key": "bad", "operator": "Contains"},
    ]
    task = task_from_pod(pod)
    assert task.annotations[ANNOTATION_GPU_FRACTION] == "0.5"
    assert task.node_selector == {"gpu": "h100"}
    assert task.tolerations == (Toleration(operator="Exists"), Toleration("k", "Equal", "v", "NoSchedule"))


def test_malformed_quantities_count_as_nothing_and_odd_maps_are_filtered() -> None:
    pod = _pod([_container("lots", "2Gi", 1)])
    pod["metadata"]["annotations"] = {"a": "1", "b": 2}
    task = task_from_pod(pod)
    assert (task.cpu_milli, task.memory_mib, task.gpus) == (0, 2048, 1)
    assert task.annotations == {"a": "1"}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=15,
)
_fields = st.sampled_from(
    ["metadata", "spec", "status", "containers", "initContainers", "resources", "requests", "limits", "cpu",
     "memory", RESOURCE_NVIDIA_GPU, "nodeName", "annotations", "tolerations", "nodeSelector", "overhead",
     "deletionTimestamp", "restartPolicy", "name"]
)  # fmt: skip
_shaped = st.recursive(
    _json, lambda inner: st.dictionaries(_fields, inner, max_size=5) | st.lists(inner, max_size=3), max_leaves=30
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_fields, _shaped, max_size=5))
def test_any_pod_json_converts_without_raising(pod: dict[str, Any]) -> None:
    task = task_from_pod(pod)
    assert task.cpu_milli >= 0 and task.memory_mib >= 0 and task.gpus >= 0


_TOLERATION = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from(["k", "nvidia.com/gpu", ""]) | st.integers(0, 2),
        "operator": st.sampled_from(["Equal", "Exists", "Contains", ""]),
        "value": st.sampled_from(["v", ""]) | st.lists(st.just("x"), max_size=1),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", ""]),
    },
)


@given(st.lists(st.lists(_TOLERATION, max_size=3) | st.just("oops"), min_size=1, max_size=4))
def test_tolerations_read_again_from_the_memo_are_those_read_fresh(lists: list[Any]) -> None:
    """Pods carrying the same tolerations share one reading, and it is what reading them afresh gives."""
    for tolerations in lists:
        pods = [pod_json(name) for name in ("a", "b")]
        for pod in pods:
            pod["spec"]["tolerations"] = tolerations
        read = [task_from_pod(pod).tolerations for pod in pods]
        fresh, _ = _read_tolerations(tolerations, "pod/team-a/c")
        assert read == [fresh, fresh]
