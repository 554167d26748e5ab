"""Remediation runs beside the scheduling cycles: a slow pass delays no bind, a fenced one ends the term's worker."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.cycle import ViewChanges
from scheduler.cluster.evict import Evictor
from scheduler.cluster.fence import LeaseLostError
from scheduler.remediation.controller import RemediationController, RemediationReport
from scheduler.remediation.devicetaints import DeviceTaintPublisher, DeviceTaintReport
from scheduler.remediation.worker import RemediationWorker
from scheduler.runner import SchedulerRunner
from tests.scheduler.cluster.kube_objects import node_of, pod, podgroup
from tests.scheduler.cluster.test_cycle_k8s import view
from tests.scheduler.cluster.test_runner_k8s import replicas
from tests.scheduler.remediation.test_controller_k8s import NO_WAIT
from tests.waiting import wait_for

pytestmark = pytest.mark.k8s

__all__ = ["replicas"]  # the fixture, shared with the runner's tests


def test_a_pod_is_bound_while_a_remediation_pass_is_stuck(  # noqa: PLR0917 (pytest fixtures)
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    replicas: Callable[[str], tuple[SchedulerRunner, threading.Event]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster(1)
    q = queue(8)
    entered = threading.Event()
    release = threading.Event()
    real = RemediationController.run

    def stuck(
        self: RemediationController,
        nodes: Mapping[str, Mapping[str, Any]],
        gpunodes: Mapping[str, Mapping[str, Any]],
        pods: Collection[Mapping[str, Any]],
        driver: Mapping[str, Any] | None = None,
    ) -> RemediationReport:
        entered.set()
        release.wait(120)  # as a pass waiting on a webhook, a drain or an API server that answers slowly
        return real(self, nodes, gpunodes, pods, driver)

    monkeypatch.setattr(RemediationController, "run", stuck)
    runner, _stop = replicas("replica-a")
    try:
        wait_for(entered.is_set, timeout=60, description="the first remediation pass")
        podgroup(k8s, namespace, "w", q, 1)
        pod(k8s, namespace, "w", group="w")
        wait_for(lambda: node_of(k8s, namespace, "w") is not None, timeout=60, description="the bind")
        worker = runner.remediation_worker
        assert worker is not None and worker.passes == 0, "the bind came while the pass was still stuck"
        cycles = runner.cycles
        wait_for(lambda: runner.cycles > cycles, timeout=30, description="cycles going on")
    finally:
        release.set()
    wait_for(lambda: worker.passes >= 1, timeout=60, description="the pass, once released")


def test_a_fenced_pass_ends_the_worker_and_later_views_are_not_taken(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]]
) -> None:
    nodes = set(cluster(1))

    def lost(operation: str) -> None:
        raise LeaseLostError(operation, 7)

    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT, write_guard=lost)
    worker = RemediationWorker(RemediationController(api, Evictor(api, retry=NO_WAIT)))
    try:
        # The first pass labels the new node: a write, refused at the fence.
        worker.offer(view(k8s, nodes), {})
        wait_for(lambda: worker.fenced is not None, timeout=30, description="the fenced write")
        assert "term 7" in (worker.fenced or "")
        worker.offer(view(k8s, nodes), {})
        assert worker.idle() and worker.passes == 0
        labels = client.CoreV1Api(k8s).read_node(next(iter(nodes))).metadata.labels or {}
        assert contract.LABEL_REMEDIATION_STATE not in labels, "nothing left the process"
    finally:
        worker.stop()


def _settle(k8s: client.ApiClient, worker: RemediationWorker, nodes: set[str]) -> None:
    """Full views (what changed unknown) until the first passes' writes are back in the view and every node is quiet."""

    def settled() -> bool:
        passes = worker.passes
        worker.offer(view(k8s, nodes), {})
        wait_for(lambda: worker.idle() and worker.passes > passes, timeout=30, description="a pass")
        return worker.controller.at_rest()

    wait_for(settled, timeout=60, description="every node quiet")


def test_a_view_that_changed_no_node_is_skipped_once_every_node_is_quiet(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]]
) -> None:
    """A healthy cluster costs no remediation pass per cycle; a Node change, merged over views, still gets one."""
    nodes = set(cluster(2))
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    controller = RemediationController(api, Evictor(api, retry=NO_WAIT))
    worker = RemediationWorker(controller)
    quiet = ViewChanges(since=1, pods=frozenset({"some-pod"}))
    try:
        _settle(k8s, worker, nodes)
        passes = worker.passes
        worker.offer(replace(view(k8s, nodes), changed=quiet), {})
        wait_for(lambda: worker.idle() and worker.skipped == 1, timeout=30, description="the view taken")
        assert worker.passes == passes, "a view that changed no node ran a pass"
        # A refusal is news to the drains: a pass, even with no node changed.
        worker.offer(replace(view(k8s, nodes), changed=quiet), {"team/p": "refused"})
        wait_for(lambda: worker.idle() and worker.passes == passes + 1, timeout=30, description="a pass")
        # A Node change in a view the worker did not take is merged into the next offer.
        name = sorted(nodes)[0]
        with worker._cond:  # hold the worker between offers, as a long pass would
            worker.offer(replace(view(k8s, nodes), changed=replace(quiet, nodes=frozenset({name}))), {})
            worker.offer(replace(view(k8s, nodes), changed=quiet), {})
        wait_for(lambda: worker.idle() and worker.passes == passes + 2, timeout=30, description="a pass")
        # The view's pods are the loop's own dict: an offer copies them only when a pass is expected.
        with worker._cond:
            worker.offer(replace(view(k8s, nodes), changed=quiet), {})
            assert worker._offer is not None and worker._offer.pods is None
            worker.offer(replace(view(k8s, nodes), changed=quiet), {"team/p": "refused"})
            assert worker._offer is not None and worker._offer.pods is not None
        wait_for(lambda: worker.idle() and worker.passes == passes + 3, timeout=30, description="a pass")
        # Work in hand (a drain's, a timer's) with no node changed: the view offered without its pods
        # is passed over, and the next one comes with them.
        controller.at_rest = lambda: False  # type: ignore[method-assign]
        worker.offer(replace(view(k8s, nodes), changed=quiet), {})
        wait_for(worker.idle, timeout=30, description="the view without pods taken")
        assert worker.passes == passes + 3
        worker.offer(replace(view(k8s, nodes), changed=quiet), {})
        wait_for(lambda: worker.idle() and worker.passes == passes + 4, timeout=30, description="a pass")
    finally:
        worker.stop()


class _CountingTaints(DeviceTaintPublisher):
    """The real publisher, counting the syncs the worker asks of it and what each saw."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__(api)
        self.seen: list[Mapping[str, Any]] = []

    def sync(
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        gpunodes: Mapping[str, Mapping[str, Any]],
        slices: Mapping[str, Mapping[str, Any]],
        rules: Mapping[str, Mapping[str, Any]],
        *,
        unknown: bool = False,
    ) -> DeviceTaintReport | None:
        self.seen.append(slices)
        return super().sync(nodes, gpunodes, slices, rules, unknown=unknown)


def test_device_taints_are_synced_on_a_dra_change_and_a_slice_change_brings_a_pass(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]]
) -> None:
    """A changed ResourceSlice or DeviceTaintRule brings a sync even when remediation has nothing to do."""
    nodes = set(cluster(1))
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    controller = RemediationController(api, Evictor(api, retry=NO_WAIT))
    taints = _CountingTaints(api)
    worker = RemediationWorker(controller, taints)
    quiet = ViewChanges(since=1, pods=frozenset({"some-pod"}))
    try:
        _settle(k8s, worker, nodes)
        synced = len(taints.seen)
        worker.offer(replace(view(k8s, nodes), changed=quiet), {})
        wait_for(worker.idle, timeout=30, description="the quiet view taken")
        assert len(taints.seen) == synced, "a view that changed nothing of remediation's synced"
        slices = {"00000-gpu.nvidia.com-node-x": {"spec": {"driver": "gpu.nvidia.com"}}}
        passes = worker.passes
        # A changed slice may carry the driver's health taints (driverhealth): a sync and a pass.
        # A changed rule is gpuwarden's own or someone's: a sync, no pass.
        for changed, passed in (
            (replace(quiet, resource_slices=frozenset(slices)), 1),
            (replace(quiet, device_taint_rules=frozenset({"r"})), 0),
        ):
            worker.offer(replace(view(k8s, nodes), changed=changed, resource_slices=slices), {})
            wanted = synced + 1
            wait_for(lambda: worker.idle() and len(taints.seen) == wanted, timeout=30, description="a sync")  # noqa: B023
            assert taints.seen[-1] == slices
            assert worker.passes == passes + passed
            synced += 1
            passes = worker.passes
    finally:
        worker.stop()


def test_a_fenced_device_taint_write_ends_the_worker_before_any_pass(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]]
) -> None:
    """A paused leader that wakes after losing the lease writes no DeviceTaintRule: the fence refuses it first."""
    (name,) = cluster(1)

    def lost(operation: str) -> None:
        raise LeaseLostError(operation, 9)

    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT, write_guard=lost)
    taints = _CountingTaints(api)
    worker = RemediationWorker(RemediationController(api, Evictor(api, retry=NO_WAIT)), taints)
    base = view(k8s, {name})
    node = {
        **base.nodes[name],
        "metadata": {**base.nodes[name]["metadata"], "annotations": {contract.ANNOTATION_QUARANTINED_GPUS: "0"}},
    }
    gpunode = {"metadata": {"name": name}, "status": {"gpus": [{"index": 0, "uuid": "GPU-0"}]}}
    slices = {
        "s": {
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": name,
                "pool": {"name": name, "generation": 1},
                "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}],
            }
        }
    }
    try:
        worker.offer(replace(base, nodes={name: node}, gpunodes={name: gpunode}, resource_slices=slices), {})
        wait_for(lambda: worker.fenced is not None, timeout=30, description="the fenced rule write")
        assert "term 9" in (worker.fenced or "") and worker.passes == 0 and len(taints.seen) == 1
        rules = client.CustomObjectsApi(k8s).list_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules")
        assert not [r for r in rules["items"] if r["metadata"]["name"].startswith(f"gpuwarden-quarantine-{name}")]
    finally:
        worker.stop()
