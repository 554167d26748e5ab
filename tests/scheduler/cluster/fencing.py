"""What the lease-fence tests share: the shipped Lease, replicas on it, the policy in force, the over-commit check."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.leader import LeaderElectionConfig
from scheduler.runner import RunnerSettings, SchedulerRunner
from tests.harness import ControlPlane, unique_name
from tests.waiting import wait_for

# The Lease the shipped fence policy's binding names (manifests/scheduler/admission-policy.yaml).
LEASE_NAMESPACE = "gpuwarden"
LEASE_NAME = contract.SCHEDULER_COMPONENT
_TERMINAL = frozenset({"Succeeded", "Failed"})


class PausedAfterCheck:
    """Stops replica ``runner`` where no check in the process can help: after its lease check for
    ``operation``, before the request leaves; from the first such stop its lease is no longer renewed
    (its whole process stands still, as SIGSTOP would). :meth:`wake` lets everything go on."""

    def __init__(self, runner: SchedulerRunner, operation: str) -> None:
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.passed = 0  # requests that passed the check and were stopped
        self._runner = runner
        self._renew = runner.elector._attempt
        self._lock = threading.Lock()
        check = runner.fence.check

        def check_then_pause(name: str) -> None:
            check(name)
            if name != operation:
                return
            with self._lock:
                self.passed += 1
            if not self.paused.is_set():
                runner.elector._attempt = lambda: False  # type: ignore[method-assign]
                self.paused.set()
            self.resume.wait(60)

        runner.api._guard = check_then_pause

    def wake(self) -> None:
        self._runner.elector._attempt = self._renew  # type: ignore[method-assign]
        self.resume.set()


def forget_lease(k8s: client.ApiClient) -> None:
    """No Lease left by an earlier test: the first replica of this one takes it at once."""
    with contextlib.suppress(client.ApiException):
        client.CoordinationV1Api(k8s).delete_namespaced_lease(LEASE_NAME, LEASE_NAMESPACE)


def lease_holder(k8s: client.ApiClient) -> str:
    try:
        lease = client.CoordinationV1Api(k8s).read_namespaced_lease(LEASE_NAME, LEASE_NAMESPACE)
    except client.ApiException:
        return ""
    return str(lease.spec.holder_identity or "")


def wait_for_fence_policy(k8s: client.ApiClient, scheduler: client.ApiClient, namespace: str) -> None:
    """Until the API server enforces the fence: a bind naming a replica that does not hold the Lease is refused.

    Policies take effect a moment after they are created. The probe holds the
    shipped Lease under a name of its own for the while (and removes it
    after), and binds pods no scheduler of ours takes; one admitted before
    the policy loaded is deleted with the others.
    """
    coordination = client.CoordinationV1Api(k8s)
    coordination.create_namespaced_lease(
        LEASE_NAMESPACE,
        {"metadata": {"name": LEASE_NAME}, "spec": {"holderIdentity": "fence-probe", "leaseDurationSeconds": 60}},
    )
    core = client.CoreV1Api(k8s)
    made: list[str] = []

    def refused() -> bool:
        name = unique_name("fence-probe")
        core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
            },
        )
        made.append(name)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "annotations": {contract.ANNOTATION_LEASE_HOLDER: "a-replica-that-never-led"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "no-such-node"},
        }
        try:
            client.CoreV1Api(scheduler).create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        except client.ApiException as exc:
            return exc.status == 403 and "lease" in str(exc.body)
        return False

    try:
        wait_for(refused, timeout=30, interval=0.3, description="the fence policy in force")
    finally:
        for name in made:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        forget_lease(k8s)


def gpu_holders(k8s: client.ApiClient, nodes: set[str]) -> dict[tuple[str, int], list[str]]:
    """Per (node, GPU index), the live pods whose bind assigned it; several for one GPU is an over-commit."""
    held: dict[tuple[str, int], list[str]] = {}
    for pod in client.CoreV1Api(k8s).list_pod_for_all_namespaces().items:
        node = pod.spec.node_name
        if node not in nodes or (pod.status.phase or "") in _TERMINAL:
            continue
        text = (pod.metadata.annotations or {}).get(contract.ANNOTATION_GPU_ASSIGNMENT)
        indices = decode_assignment(text, node=node) if text else None
        assert indices is not None, f"{pod.metadata.namespace}/{pod.metadata.name} bound without a GPU assignment"
        for index in indices:
            held.setdefault((node, index), []).append(f"{pod.metadata.namespace}/{pod.metadata.name}")
    return held


def over_committed(k8s: client.ApiClient, nodes: set[str]) -> dict[tuple[str, int], list[str]]:
    return {gpu: pods for gpu, pods in gpu_holders(k8s, nodes).items() if len(pods) > 1}


def binders(k8s: client.ApiClient, namespace: str) -> Counter[str]:
    """How many bound pods of ``namespace`` each replica bound (the Binding's annotation, copied onto the pod)."""
    counts: Counter[str] = Counter()
    for pod in client.CoreV1Api(k8s).list_namespaced_pod(namespace).items:
        if pod.spec.node_name:
            token = (pod.metadata.annotations or {}).get(contract.ANNOTATION_LEASE_HOLDER, "")
            counts[token.split("#", 1)[0]] += 1  # <identity>#<leaseTransitions>: by replica
    return counts


def gpu_pod(name: str, queue: str, *, gpus: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {contract.LABEL_QUEUE: queue}},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "resources": {
                        "requests": {"cpu": "100m", contract.RESOURCE_NVIDIA_GPU: str(gpus)},
                        "limits": {contract.RESOURCE_NVIDIA_GPU: str(gpus)},
                    },
                }
            ],
        },
    }


@pytest.fixture
def fenced_replicas(
    control_plane: ControlPlane, k8s: client.ApiClient
) -> Iterator[Callable[[str], tuple[SchedulerRunner, threading.Event]]]:
    """Starts replicas on the fence policy's Lease, as the scheduler's ServiceAccount; stops them afterwards."""
    forget_lease(k8s)
    started: list[tuple[SchedulerRunner, threading.Event, threading.Thread, client.ApiClient]] = []

    def start(identity: str) -> tuple[SchedulerRunner, threading.Event]:
        config = LeaderElectionConfig(
            namespace=LEASE_NAMESPACE,
            name=LEASE_NAME,
            identity=identity,
            lease_duration_s=3.0,
            renew_deadline_s=2.0,
            retry_period_s=0.4,
        )
        api = control_plane.impersonate("gpuwarden-scheduler", "gpuwarden")
        runner = SchedulerRunner(
            api, RunnerSettings(period_s=0.3, lease=config, bind_workers=8, remediation=None, metrics_port=None)
        )
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), name=f"runner-{identity}", daemon=True)
        thread.start()
        started.append((runner, stop, thread, api))
        return runner, stop

    try:
        yield start
    finally:
        for _, stop, _, _ in started:
            stop.set()
        for _, _, thread, api in started:
            thread.join(30)
            api.close()
        forget_lease(k8s)
    assert not any(thread.is_alive() for _, _, thread, _ in started)
