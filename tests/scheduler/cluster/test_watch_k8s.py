"""The watch cache against the real API server: sync, follow, relist after 410, outages, missing CRDs."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from structlog.testing import capture_logs

from gpuwarden import contract
from gpuwarden.kube import MERGE_PATCH, RequestStats
from scheduler.cluster.bind import binding_body
from scheduler.cluster.cache import (
    DEVICETAINTRULES,
    GPUNODES,
    NODES,
    PODS,
    RESOURCESLICES,
    ClusterCache,
    WatchedResource,
    default_resources,
)
from scheduler.cluster.slim import slim_pod
from scheduler.cluster.wakes import quiet_pod_change
from scheduler.cluster.watch import EventType, Reflector, ReflectorSettings, WatchEvent
from scheduler.engine.model import Bind
from tests.harness import ControlPlane, create_gpu_node, simple_pod, unique_name, wait_for

pytestmark = pytest.mark.k8s

GPUNODE_CRD_FILE = Path(__file__).resolve().parents[3] / "manifests" / "crd-gpunodes.yaml"
GPUNODE_CRD = f"{contract.GPUNODE_PLURAL}.{contract.API_GROUP}"

# Short enough that a test sees retries and re-opened watches within seconds.
FAST = ReflectorSettings(
    page_size=50,
    watch_timeout_s=30,
    connect_timeout_s=2.0,
    read_timeout_s=20.0,
    list_timeout_s=10.0,
    missing_retry_s=0.3,
    backoff_base_s=0.1,
    backoff_cap_s=1.0,
)


@pytest.fixture(scope="module")
def gpunode_crd(control_plane: ControlPlane) -> None:
    """The shipped GPUNode CRD, applied as a user would (left for the session: others use it too)."""
    control_plane.kubectl("apply", "-f", str(GPUNODE_CRD_FILE))
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{GPUNODE_CRD}", "--timeout=60s")


@contextlib.contextmanager
def running_cache(api: client.ApiClient, **kwargs: Any) -> Iterator[ClusterCache]:
    cache = ClusterCache(api, settings=FAST, **kwargs).start()
    try:
        assert cache.wait_synced(30), "the cache did not sync"
        yield cache
    finally:
        cache.stop()
        assert not [r.name for r in cache.reflectors if r._thread is not None and r._thread.is_alive()]


def _gpunode(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.GPUNODE_KIND,
        "metadata": {"name": name},
        "spec": {"nodeName": name},
    }


def _create_pod(api: client.ApiClient, namespace: str, name: str, **labels: str) -> None:
    client.CoreV1Api(api).create_namespaced_pod(namespace, simple_pod(name, labels=labels or None))


def test_the_cache_lists_then_follows_nodes_gpunodes_and_pods(
    k8s: client.ApiClient, namespace: str, gpunode_crd: None
) -> None:
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    node = unique_name("cache-node")
    create_gpu_node(k8s, node, gpus=8)
    gpunode_args = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)
    try:
        custom.create_cluster_custom_object(*gpunode_args, _gpunode(node))
        _create_pod(k8s, namespace, "before")
        with running_cache(k8s) as cache:
            view = cache.view()
            assert view.synced
            assert view.nodes[node]["status"]["capacity"][contract.RESOURCE_NVIDIA_GPU] == "8"
            assert "images" not in view.nodes[node]["status"]
            assert view.gpunodes[node]["spec"] == {"nodeName": node}
            assert "managedFields" not in view.gpunodes[node]["metadata"]
            pod = view.pods[f"{namespace}/before"]
            assert [c["name"] for c in pod["spec"]["containers"]] == ["main"]
            assert "image" not in pod["spec"]["containers"][0]
            assert pod["status"]["phase"] == "Pending"

            generation = cache.generation
            _create_pod(k8s, namespace, "after", team="a")
            assert cache.wait_for_change(generation, timeout=10) > generation
            wait_for(lambda: cache.get(PODS, f"{namespace}/after"), description="a new pod is seen")
            core.patch_namespaced_pod("after", namespace, {"metadata": {"labels": {"team": "b"}}})
            wait_for(
                lambda: (
                    (cache.get(PODS, f"{namespace}/after") or {}).get("metadata", {}).get("labels") == {"team": "b"}
                ),
                description="a label change is seen",
            )
            core.delete_namespaced_pod("before", namespace, grace_period_seconds=0)
            wait_for(lambda: cache.get(PODS, f"{namespace}/before") is None, description="a deleted pod goes")
            custom.patch_cluster_custom_object(
                *gpunode_args, node, {"metadata": {"labels": {"pool": "b"}}}, _content_type=MERGE_PATCH
            )
            wait_for(
                lambda: (cache.get(GPUNODES, node) or {}).get("metadata", {}).get("labels") == {"pool": "b"},
                description="a GPUNode change is seen",
            )
            core.delete_node(node)
            wait_for(lambda: cache.get(NODES, node) is None, description="a deleted node goes")

            # A view is the cycle's own: later changes do not reach it.
            assert f"{namespace}/before" in view.pods
            assert node in view.nodes
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_node(node)
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*gpunode_args, node)


class Recorder:
    """Collects a reflector's events from its thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[WatchEvent] = []

    def __call__(self, event: WatchEvent) -> None:
        with self.lock:
            self.events.append(event)

    def seen(self) -> list[tuple[EventType, str, bool]]:
        with self.lock:
            return [(e.type, e.key, e.final_state_unknown) for e in self.events]


# What the API server sends on a watch whose resourceVersion it no longer has.
EXPIRED_EVENT = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 1 (4711)",
        "reason": "Expired",
        "code": 410,
    },
}


class ExpiredWatch:
    """The reply to one watch: the API server's 410 ERROR event, then the end of the stream."""

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        yield json.dumps(EXPIRED_EVENT).encode() + b"\n"

    def read(self, amt: int | None = None, decode_content: bool | None = None) -> bytes:
        return b""

    def shutdown(self) -> None:
        pass

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("answer", ["error-event", "http-status"])
def test_a_watch_whose_resource_version_expired_relists_and_reports_what_vanished(
    k8s: client.ApiClient, namespace: str, answer: str
) -> None:
    """Lists and later watches are the real server's; the first watch is answered with 410.

    The 410 is handed over rather than provoked: the API server's watch
    cache replays its store for any old resourceVersion until it has evicted
    events, and it keeps every event younger than 75 s, so a real 410 takes
    minutes to arrange. What the reflector must do with it is the same.
    """
    core = client.CoreV1Api(k8s)
    _create_pod(k8s, namespace, "stays")
    _create_pod(k8s, namespace, "goes")
    gap_done = threading.Event()
    watch_calls: list[str] = []

    def list_fn(**params: Any) -> Any:
        if params.get("watch"):
            watch_calls.append(str(params.get("resource_version")))
            if len(watch_calls) == 1:
                # The gap: changes this watch would have carried happen
                # while the server has forgotten its resourceVersion.
                gap_done.wait(30)
                if answer == "http-status":
                    raise client.ApiException(status=410, reason="Gone")
                return ExpiredWatch()
        return core.list_namespaced_pod(namespace, **params)

    recorder = Recorder()
    reflector = Reflector("pods", list_fn, recorder, settings=FAST).start()
    try:
        assert reflector.wait_synced(30)
        assert sorted(recorder.seen()) == [
            (EventType.ADDED, f"{namespace}/goes", False),
            (EventType.ADDED, f"{namespace}/stays", False),
        ]
        core.delete_namespaced_pod("goes", namespace, grace_period_seconds=0)
        _create_pod(k8s, namespace, "new")
        gap_done.set()
        wait_for(lambda: reflector.lists >= 2, timeout=20, description="the reflector lists again after 410")
        wait_for(lambda: len(watch_calls) >= 2, description="and watches from the new list")
        # The pod deleted in the gap is reported deleted, the new one added,
        # the unchanged one not reported again.
        assert sorted(recorder.seen()[2:]) == [
            (EventType.ADDED, f"{namespace}/new", False),
            (EventType.DELETED, f"{namespace}/goes", True),
        ]
        assert int(watch_calls[1]) > int(watch_calls[0])
        core.delete_namespaced_pod("stays", namespace, grace_period_seconds=0)
        wait_for(
            lambda: (EventType.DELETED, f"{namespace}/stays", False) in recorder.seen(),
            description="the watch after the relist sees a deletion",
        )
    finally:
        gap_done.set()
        reflector.stop()
    assert reflector._thread is not None and not reflector._thread.is_alive()


def test_the_cache_survives_an_api_server_restart(
    control_plane: ControlPlane, k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    _create_pod(k8s, namespace, "old")
    pods_only = [r for r in default_resources() if r.name == PODS]
    with capture_logs() as logs, running_cache(k8s, resources=pods_only) as cache:
        reflector = cache.reflectors[0]
        watches = reflector.watches
        wait_for(lambda: reflector.watches > watches or reflector._response is not None, description="watching")
        control_plane.stop_apiserver()
        try:
            wait_for(lambda: reflector.outages.in_outage, timeout=20, description="the outage is noticed")
        finally:
            control_plane.start_apiserver()
        core.delete_namespaced_pod("old", namespace, grace_period_seconds=0)
        _create_pod(k8s, namespace, "new")
        wait_for(
            lambda: cache.get(PODS, f"{namespace}/new") and cache.get(PODS, f"{namespace}/old") is None,
            timeout=30,
            description="changes after the restart are seen",
        )
        wait_for(lambda: not reflector.outages.in_outage, timeout=10, description="the outage is over")
    failing = [e for e in logs if e["event"] == "kubernetes_api_failing"]
    assert reflector.outages.outages == len(failing) == 1
    assert [e for e in logs if e["event"] == "kubernetes_api_recovered"]


def test_a_collection_whose_crd_is_missing_is_empty_until_the_crd_comes(
    control_plane: ControlPlane, k8s: client.ApiClient
) -> None:
    group = "cachetest.gpuwarden.io"
    plural = unique_name("widgets").replace("-", "")
    widgets = WatchedResource(
        "widgets",
        lambda api: functools.partial(client.CustomObjectsApi(api).list_cluster_custom_object, group, "v1", plural),
    )
    nodes = [r for r in default_resources() if r.name == NODES]
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"kind": "Widget" + plural[-6:], "plural": plural, "singular": plural[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    extensions = client.ApiextensionsV1Api(k8s)
    stats = RequestStats()
    try:
        with capture_logs() as logs, running_cache(k8s, resources=[*nodes, widgets], stats=stats) as cache:
            view = cache.view()
            assert view.synced and view.missing == frozenset({"widgets"}) and view.store("widgets") == {}
            reflector = cache.reflectors[1]
            lists = reflector.lists
            wait_for(lambda: reflector.lists >= lists + 3, description="the missing collection is retried")
            extensions.create_custom_resource_definition(crd)
            control_plane.kubectl("wait", "--for=condition=Established", f"crd/{plural}.{group}", "--timeout=60s")
            wait_for(lambda: not reflector.missing, timeout=20, description="the collection is found")
            client.CustomObjectsApi(k8s).create_cluster_custom_object(
                group,
                "v1",
                plural,
                {"apiVersion": f"{group}/v1", "kind": crd["spec"]["names"]["kind"], "metadata": {"name": "one"}},
            )
            wait_for(lambda: cache.get("widgets", "one"), timeout=20, description="its object is seen")
            assert cache.view().missing == frozenset()
            # Every list and watch is counted; the lists of the missing
            # collection are errors, as the scheduler's API-error alert needs.
            requests, errors = stats.snapshot()
            assert requests["list_nodes"] >= 1 and requests["watch_nodes"] >= 1 and "list_nodes" not in errors
            assert errors["list_widgets"] >= 3
            # Background requests are no sign of a cycle making progress.
            assert stats.last_finished is None
        assert len([e for e in logs if e["event"] == "watched_resource_not_served"]) == 1
    finally:
        with contextlib.suppress(client.ApiException):
            extensions.delete_custom_resource_definition(f"{plural}.{group}")


def _field(cache: ClusterCache, key: str, part: str, name: str) -> Any:
    return ((cache.get(PODS, key) or {}).get(part) or {}).get(name)


def test_changes_from_the_api_server_wake_as_the_wakes_module_says(k8s: client.ApiClient, namespace: str) -> None:
    """Objects as the real API server sends them.

    A bind by another scheduler wakes, the echo of gpuwarden's own Binding
    (its annotations, as the binder sends it) does not; the pod starting
    after its bind does not; its end does. The verdicts are recorded per
    event (other tests' objects may change meanwhile, so the cache's own
    counter would not say which event woke).
    """
    verdicts: dict[str, list[tuple[str | None, bool, bool]]] = {"p": [], "q": []}
    verdicts_lock = threading.Lock()

    def recording(old: Any, new: Any) -> bool:
        quiet = quiet_pod_change(old, new)
        meta = new.get("metadata") or {}
        if meta.get("namespace") == namespace:
            bound = bool((new.get("spec") or {}).get("nodeName"))
            with verdicts_lock:
                verdicts[meta["name"]].append(((old or {}).get("status", {}).get("phase"), bound, quiet))
        return quiet

    pods = WatchedResource(PODS, lambda api: client.CoreV1Api(api).list_pod_for_all_namespaces, slim_pod, recording)
    core = client.CoreV1Api(k8s)
    node = unique_name("wakes-node")
    create_gpu_node(k8s, node, gpus=8)
    try:
        with running_cache(k8s, resources=[pods]) as cache:

            def bind(name: str, body: dict[str, Any]) -> None:
                core.api_client.call_api(
                    *core.api_client.param_serialize(
                        "POST",
                        f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                        header_params={"Content-Type": "application/json", "Accept": "application/json"},
                        body=body,
                        auth_settings=["BearerToken"],
                    )
                ).read()
                wait_for(lambda: _field(cache, f"{namespace}/{name}", "spec", "nodeName") == node, description="bound")

            _create_pod(k8s, namespace, "p")
            _create_pod(k8s, namespace, "q")
            # p: bound as any other scheduler binds it (no annotations).
            plain = {"name": "p", "namespace": namespace}
            target = {"apiVersion": "v1", "kind": "Node", "name": node}
            bind("p", {"apiVersion": "v1", "kind": "Binding", "metadata": plain, "target": target})
            # q: bound as gpuwarden's binder binds, GPU assignment and lease holder included.
            ours = Bind(job=f"{namespace}/q", namespace=namespace, pod="q", uid="", node=node, gpu_indices=(0,))
            assignment = json.dumps({"node": node, "gpus": [{"index": 0, "uuid": "GPU-0", "memoryMiB": 81920}]})
            bind("q", binding_body(ours, assignment, "gpuwarden-0"))
            started = {"status": {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}}
            core.patch_namespaced_pod_status("p", namespace, started)
            wait_for(lambda: _field(cache, f"{namespace}/p", "status", "phase") == "Running", description="ran")
            core.patch_namespaced_pod_status("p", namespace, {"status": {"phase": "Succeeded"}})
            wait_for(lambda: _field(cache, f"{namespace}/p", "status", "phase") == "Succeeded", description="end")
    finally:
        core.delete_node(node)
    with verdicts_lock:
        p, q = list(verdicts["p"]), list(verdicts["q"])
    # p: created wakes, bound wakes, started is quiet, finished wakes.
    assert p[:2] == [(None, False, False), ("Pending", True, False)]
    assert ("Pending", True, True) in p[2:]
    assert ("Running", True, False) in p
    assert all(not quiet for old, _, quiet in p[2:] if old != "Pending")
    # q: created wakes; the echo of gpuwarden's own bind is quiet.
    assert q[:2] == [(None, False, False), ("Pending", True, True)]


def test_the_dra_collections_are_empty_not_blocking_when_rbac_does_not_grant_them(
    control_plane: ControlPlane, k8s: client.ApiClient
) -> None:
    """A scheduler whose RBAC predates device taints (no list of ResourceSlices) still syncs, and schedules.

    The DRA collections are optional: a refused list leaves them empty, as
    an API the server does not serve would, while a refused list of Nodes
    would still hold the sync (every cycle needs them).
    """
    account, namespace = unique_name("old-rbac"), "default"
    rbac = client.RbacAuthorizationV1Api(k8s)
    rbac.create_cluster_role(
        {
            "metadata": {"name": account},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
    )
    wanted = {NODES, RESOURCESLICES, DEVICETAINTRULES}
    resources = [r for r in default_resources() if r.name in wanted]
    stats = RequestStats()
    try:
        with (
            capture_logs() as logs,
            control_plane.impersonate(account, namespace) as api,
            running_cache(api, resources=resources, stats=stats) as cache,
        ):
            view = cache.view()
            assert view.synced and view.missing == frozenset({RESOURCESLICES, DEVICETAINTRULES})
            assert view.store(RESOURCESLICES) == {} and NODES not in view.missing
            slices = cache.reflectors[[r.name for r in resources].index(RESOURCESLICES)]
            lists = slices.lists
            wait_for(lambda: slices.lists >= lists + 2, description="the refused collection is asked again")
        # Refused for good by older RBAC: an answer, not an API error, or the error alert would never clear.
        requests, errors = stats.snapshot()
        assert requests["list_resourceslices"] >= 3 and "list_resourceslices" not in errors
        assert "list_devicetaintrules" not in errors
        forbidden = [e for e in logs if e["event"] == "watched_resource_forbidden"]
        assert sorted(e["resource"] for e in forbidden) == [DEVICETAINTRULES, RESOURCESLICES]
    finally:
        rbac.delete_cluster_role_binding(account)
        rbac.delete_cluster_role(account)
