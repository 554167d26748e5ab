"""The pods that hold this node's GPUs: their UID and who scheduled them.

The kubelet's PodResources API names a GPU's holders by namespace, pod and
container only; the scheduler needs the pod's UID (a StatefulSet's pod
recreated under the same name is another pod) and its ``schedulerName`` (a
pod gpuwarden did not place). Those come from the API server, one GET per
holder by name: RBAC cannot narrow a list of pods to one node, and a token
that may list every pod of the cluster reads every workload's spec, while
``get`` reads only pods it can name, and the agent names only the GPU
holders its kubelet reported (a few per node).

A holder is read when it first appears, when the set of holders changes (a
pod recreated under its old name shows up only that way) and once every
``max_age_s`` however steady the node, so a recreated pod's UID is right
within that time and a steady node costs a GET per holder per
``max_age_s``. A pod that is not on this node (a name reused elsewhere after
the kubelet's answer) or gone is left without identity. A failed GET keeps
what was known, stops the pass (an API server that does not answer must not
hold the publisher for a timeout per holder) and is logged once per outage;
every request counts in ``gpuwarden_api_requests_total`` and
``gpuwarden_api_errors_total``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

PodKey = tuple[str, str]  # (namespace, name)

# Holders read in one pass at most (8 GPUs x a few holders is the usual node).
MAX_READS_PER_PASS = 64


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What the API server says of one pod that PodResources does not."""

    uid: str
    scheduler_name: str


class PodDirectory:
    """UID and scheduler of the GPU holders, read by name when due; see the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        *,
        max_age_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._node = node
        self._max_age_s = max_age_s
        self._clock = clock
        self._pods: dict[PodKey, PodIdentity | None] = {}
        self._read_at: dict[PodKey, float] = {}
        self._holders: frozenset[PodKey] = frozenset()
        self._failing = False
        self.reads = 0

    def resolve(self, holders: Iterable[PodKey]) -> dict[PodKey, PodIdentity]:
        """The identity of each holder that could be read, reading those that are due first."""
        wanted = frozenset(holders)
        now = self._clock()
        if wanted != self._holders:
            # Who holds a GPU changed: read the newcomers again, whatever their age.
            for key in wanted - self._holders:
                self._read_at.pop(key, None)
            self._holders = wanted
        for key in list(self._pods):
            if key not in wanted:
                del self._pods[key]
                self._read_at.pop(key, None)
        due = sorted(k for k in wanted if now - self._read_at.get(k, -self._max_age_s - 1) > self._max_age_s)
        for key in due[:MAX_READS_PER_PASS]:
            if not self._read(key, now):
                break
        return {k: who for k in wanted if (who := self._pods.get(k)) is not None}

    def _read(self, key: PodKey, now: float) -> bool:
        namespace, name = key
        try:
            pod = self._api.get_pod(namespace, name)
        except ApiError as exc:
            if not self._failing:
                log.warning(
                    "gpu_holder_unreadable",
                    node=self._node,
                    pod=f"{namespace}/{name}",
                    error=str(exc),
                    effect="GPU holders are published without uid and schedulerName until a read succeeds",
                )
            self._failing = True
            return False
        if self._failing:
            log.info("gpu_holder_readable", node=self._node)
        self._failing = False
        self.reads += 1
        self._read_at[key] = now
        self._pods[key] = _identity(pod, self._node)
        return True


def _identity(pod: dict[str, object] | None, node: str) -> PodIdentity | None:
    if pod is None:
        return None
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict) or spec.get("nodeName") != node:
        return None
    uid, scheduler = meta.get("uid"), spec.get("schedulerName")
    if not isinstance(uid, str) or not uid:
        return None
    return PodIdentity(uid, scheduler if isinstance(scheduler, str) else "")
