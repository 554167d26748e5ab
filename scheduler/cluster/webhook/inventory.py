"""The largest GPU in the cluster, as the engine sees the nodes: what bounds a MiB slice at admission.

Read with the engine's own node converter, so a GPU the engine would offer
slices on (from the GPUNode, or the device plugin's count and NVIDIA's
memory label) is the one measured here; MIG GPUs take no slices and do not
count. Admission reads one number under no lock; a thread recomputes it at
most every ``refresh_s`` after the watched Nodes or GPUNodes changed, and
converts again only the nodes whose objects changed since, so a busy
cluster's node heartbeats cost the webhook little.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from gpuwarden.kube import RequestStats
from gpuwarden.logconfig import get_logger
from scheduler.cluster.cache import GPUNODES, NODES, ClusterCache, default_resources
from scheduler.cluster.convert import node_from_objects

log = get_logger(__name__)


def _version(obj: Mapping[str, Any] | None) -> str:
    meta = obj.get("metadata") if obj is not None else None
    return str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""


class GpuInventory:
    """Watches Nodes and GPUNodes; :meth:`largest_gpu_mib` is None until they are listed or without GPUs."""

    def __init__(
        self, api_client: client.ApiClient, *, refresh_s: float = 1.0, stats: RequestStats | None = None
    ) -> None:
        resources = tuple(r for r in default_resources() if r.name in (NODES, GPUNODES))
        self.cache = ClusterCache(api_client, resources=resources, stats=stats)
        self._refresh_s = refresh_s
        self._largest: int | None = None
        self._per_node: dict[str, tuple[str, str, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def largest_gpu_mib(self) -> int | None:
        return self._largest

    def synced(self) -> bool:
        return self.cache.synced()

    def start(self) -> GpuInventory:
        self.cache.start()
        self._thread = threading.Thread(target=self._run, name="webhook-inventory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.cache.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def refresh(self) -> int | None:
        """Recompute from the cache now; returns the new value."""
        view = self.cache.view()
        if not view.synced:
            return self._largest
        gpunodes = view.gpunodes
        per_node: dict[str, tuple[str, str, int]] = {}
        for name, raw in view.nodes.items():
            gpunode = gpunodes.get(name)
            versions = (_version(raw), _version(gpunode))
            known = self._per_node.get(name)
            if known is not None and known[:2] == versions:
                per_node[name] = known
                continue
            node = node_from_objects(raw, gpunode)
            sizes = [g.memory_mib for g in node.gpus if not g.mig_enabled]
            per_node[name] = (*versions, max(sizes, default=0))
        self._per_node = per_node
        largest = max((entry[2] for entry in per_node.values()), default=0)
        new = largest or None
        if new != self._largest:
            log.info("webhook_largest_gpu", mib=new, nodes=len(per_node))
        self._largest = new
        return new

    def _run(self) -> None:
        generation = -1
        while not self._stop.is_set():
            changed = self.cache.wait_for_change(generation, self._refresh_s)
            if changed != generation:
                generation = changed
                try:
                    self.refresh()
                except Exception:  # a malformed object must not end the refresh loop
                    log.exception("webhook_inventory_failed")
            self._stop.wait(self._refresh_s)
