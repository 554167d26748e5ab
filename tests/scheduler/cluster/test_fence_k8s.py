"""A leader that lost its lease binds nothing: the fence in the process and at the API server, for real.

Two replicas in this process (the ``fenced_replicas`` fixture) share the shipped Lease, as the scheduler's
ServiceAccount under the shipped RBAC and admission policies. Replica A is
stopped exactly where no check in the process can help: every bind worker
has passed the lease check and is about to send its Binding, and A's lease
is no longer renewed (its whole process is paused, as SIGSTOP would). B
takes the lease over and fills the GPUs with other pods; then A's binds go
out. The API server must refuse every one of them, and nothing may end up
on a GPU that B gave to another pod. The real processes, paused with
SIGSTOP, are in test_fence_process_k8s.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from kubernetes import client

from scheduler.runner import SchedulerRunner
from tests.harness import ControlPlane, unique_name
from tests.scheduler.cluster.fencing import (
    PausedAfterCheck,
    binders,
    gpu_pod,
    over_committed,
    wait_for_fence_policy,
)
from tests.scheduler.cluster.kube_objects import create_queue, delete_queue
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_rbac")]

GPUS_PER_NODE = 8


def test_binds_paused_between_the_lease_check_and_the_write_are_refused_after_a_takeover(  # noqa: PLR0917
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    fenced_replicas: Callable[[str], tuple[SchedulerRunner, threading.Event]],
) -> None:
    nodes = set(cluster(4))
    gpus = GPUS_PER_NODE * len(nodes)
    early = unique_name("q")  # borrows the idle cluster, once it exists (below)
    urgent = queue(gpus)  # deserves all of it: placed first by whoever leads
    with control_plane.impersonate("gpuwarden-scheduler", "gpuwarden") as as_scheduler:
        wait_for_fence_policy(k8s, as_scheduler, namespace)

    a, _ = fenced_replicas("replica-a")
    wait_for(a.elector.is_leader, timeout=20, description="replica a leads")
    b, _ = fenced_replicas("replica-b")

    # Replica A pauses right after its lease check, before each Binding leaves.
    pause = PausedAfterCheck(a, "create_pod_binding")
    core = client.CoreV1Api(k8s)
    # The early pods wait for their queue, so that one cycle of A places
    # them all: its first binds pause after the check, the rest stay queued
    # behind them in the process.
    for i in range(gpus + 8):
        core.create_namespaced_pod(namespace, gpu_pod(f"early-{i}", early))
    create_queue(k8s, early, {"gpu": {"quota": 0}})
    request.addfinalizer(lambda: delete_queue(k8s, early))
    wait_for(pause.paused.is_set, timeout=30, description="replica a about to bind, paused")

    # While A stands still, work that B must place first arrives; B takes the lease over and fills every GPU.
    for i in range(gpus):
        core.create_namespaced_pod(namespace, gpu_pod(f"urgent-{i}", urgent))
    wait_for(b.elector.is_leader, timeout=20, description="replica b takes the lease over")
    wait_for(
        lambda: binders(k8s, namespace)["replica-b"] == gpus,
        timeout=60,
        description="replica b binds a pod to every GPU",
    )

    # A wakes: its binds in flight go out, the ones still queued meet the fence in the process.
    collector = a.collector
    pause.wake()
    wait_for(lambda: a.resets >= 1, timeout=30, description="replica a drops its kept state")
    # What it dropped was frozen long ago: the same collector looks at everything once, at its next turn.
    wait_for(lambda: collector.sweeps >= 1, timeout=30, description="replica a sweeps what it dropped")
    assert a.collector is collector
    # The cycle's bookkeeping goes out behind it on its own thread, so its
    # refusal may come just after the runner has started over.
    wait_for(lambda: a.fence.refused >= 1, timeout=30, description="a write of replica a meets the fence")
    assert not a.elector.is_leader()
    assert b.elector.is_leader()

    assert over_committed(k8s, nodes) == {}
    counts = binders(k8s, namespace)
    assert counts == {"replica-b": gpus}, counts
    early_bound = [p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.spec.node_name]
    assert not [name for name in early_bound if name.startswith("early-")]
