"""Executing the engine's evictions through the Eviction API, never by deleting pods.

The API server checks PodDisruptionBudgets for an Eviction and answers 429
when one refuses: that is reported as refused and left for a later cycle,
never bypassed with a delete. A pod already gone (404) is what the eviction
wanted, so it counts as done. Each Eviction carries the pod's UID as a
precondition, so a new pod that took the old one's name is left alone.

Evictions are rate limited (a token bucket, evictions per second) because each
one restarts someone's work and can wake a controller that makes a
replacement; a burst of reclaims must not turn into a storm. A gang's pods
are taken from the bucket together and submitted together: a gang that loses
one pod is broken anyway, so it should not lose the rest a minute later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import StrEnum

from gpuwarden.contract import ANNOTATION_LEASE_HOLDER
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.retrying import RetryPolicy, call_with_retries
from scheduler.engine.model import Eviction

log = get_logger(__name__)

DEFAULT_EVICT_WORKERS = 8
DEFAULT_EVICTIONS_PER_S = 10.0
DEFAULT_EVICTION_BURST = 20
_PDB_REFUSED = 429


class EvictOutcome(StrEnum):
    EVICTED = "Evicted"
    # 404: the pod had gone already; the room the engine wanted is free or freeing.
    GONE = "Gone"
    # A PodDisruptionBudget does not allow it now; try again in a later cycle.
    REFUSED = "Refused"
    FAILED = "Failed"
    # Not sent: the rate's tokens ran out this cycle (see Evictor.evict_all's ``wait``).
    DEFERRED = "Deferred"


@dataclass(frozen=True, slots=True)
class EvictResult:
    eviction: Eviction
    outcome: EvictOutcome
    error: str | None = None
    attempts: int = 0

    @property
    def ok(self) -> bool:
        """The pod is leaving or left."""
        return self.outcome in (EvictOutcome.EVICTED, EvictOutcome.GONE)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; thread-safe.

    :meth:`take` of more tokens than the burst waits for a full bucket and
    then goes into debt, so a gang larger than the burst is still evicted in
    one go, and the evictions after it wait for the debt to be paid.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    def try_take(self, n: int = 1) -> bool:
        """Take ``n`` tokens if they are there now (a gang larger than the burst needs a full bucket); never waits."""
        with self._lock:
            return self._took(n)

    def _took(self, n: int) -> bool:
        """Refill for the time passed, then take ``n`` if enough are there (see take); the caller holds the lock."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens >= min(n, self.burst):
            self._tokens -= n
            return True
        return False

    def take(self, n: int = 1) -> float:
        """Take ``n`` tokens, waiting as long as needed; returns the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                if self._took(n):
                    return waited
                delay = (min(n, self.burst) - self._tokens) / self.rate
            self._sleep(delay)
            waited += delay


def eviction_body(ev: Eviction, holder: str | None = None) -> JSON:
    """The Eviction: the pod's UID as a precondition, the deciding replica for the lease fence."""
    metadata: JSON = {"name": ev.pod, "namespace": ev.namespace}
    if holder:
        metadata["annotations"] = {ANNOTATION_LEASE_HOLDER: holder}
    body: JSON = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": metadata}
    if ev.uid:
        body["deleteOptions"] = {"preconditions": {"uid": ev.uid}}
    return body


class Evictor:
    """Evicts pods through pods/eviction, rate limited, gangs together; one per scheduler."""

    def __init__(
        self,
        api: KubeApi,
        *,
        evictions_per_s: float = DEFAULT_EVICTIONS_PER_S,
        burst: int = DEFAULT_EVICTION_BURST,
        workers: int = DEFAULT_EVICT_WORKERS,
        retry: RetryPolicy | None = None,
        bucket: TokenBucket | None = None,
        holder: Callable[[], str | None] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._api = api
        self._workers = workers
        # The lease holder each Eviction names (see scheduler.cluster.fence).
        self._holder = holder
        # A PDB's 429 is an answer, not overload: asking again at once is the
        # retry the budget exists to stop.
        policy = retry or RetryPolicy()
        self._retry = replace(policy, never_retry=policy.never_retry | {_PDB_REFUSED})
        # The bucket outlives one call, so the rate holds across cycles too.
        self._bucket = bucket or TokenBucket(evictions_per_s, burst)

    @property
    def bucket(self) -> TokenBucket:
        """The token bucket its evictions are taken from."""
        return self._bucket

    def evict_all(self, evictions: Sequence[Eviction], *, wait: bool = True) -> list[EvictResult]:
        """Execute ``evictions``; one result per eviction, in the same order.

        With ``wait`` a unit whose tokens are not there yet waits for them.
        Without it (the scheduling cycle, whose binds must not sleep behind
        the eviction rate) the units the bucket does not cover now are
        reported ``DEFERRED`` and not sent: the engine decides them again
        next cycle. A unit is what must go together (:func:`eviction_units`):
        a victim gang, and every victim of one beneficiary. The first unit
        deferred defers every unit after it, so that small ones cannot keep
        taking the tokens a large one waits for.
        """
        if not evictions:
            return []
        futures: dict[int, Future[EvictResult]] = {}
        deferred: dict[int, EvictResult] = {}
        with ThreadPoolExecutor(max_workers=min(self._workers, len(evictions)), thread_name_prefix="evict") as pool:
            for members in eviction_units(evictions):
                if wait:
                    self._bucket.take(len(members))
                elif deferred or not self._bucket.try_take(len(members)):
                    for i in members:
                        deferred[i] = EvictResult(evictions[i], EvictOutcome.DEFERRED, "eviction rate: next cycle")
                    continue
                for i in members:
                    futures[i] = pool.submit(self._evict_one, evictions[i])
            results = [deferred[i] if i in deferred else futures[i].result() for i in range(len(evictions))]
        counts = {o.value.lower(): sum(1 for r in results if r.outcome is o) for o in EvictOutcome}
        log.info("evictions_executed", **counts)
        return results

    def _evict_one(self, ev: Eviction) -> EvictResult:
        body = eviction_body(ev, self._holder() if self._holder is not None else None)
        answer, tries = call_with_retries(
            self._retry, lambda: self._api.create_pod_eviction(ev.namespace, ev.pod, body)
        )
        fields = {"namespace": ev.namespace, "pod": ev.pod, "job": ev.job, "action": ev.action.value}
        if not isinstance(answer, ApiError):
            log.info("pod_evicted", node=ev.node, reason=ev.reason, beneficiary=ev.beneficiary, **fields)
            return EvictResult(ev, EvictOutcome.EVICTED, attempts=tries)
        if answer.status == 404:
            return EvictResult(ev, EvictOutcome.GONE, attempts=tries)
        if answer.status == _PDB_REFUSED:
            log.info("eviction_refused", error=answer.detail, **fields)
            return EvictResult(ev, EvictOutcome.REFUSED, f"refused: {answer.detail}", tries)
        log.warning("eviction_failed", error=answer.detail, status=answer.status, **fields)
        return EvictResult(ev, EvictOutcome.FAILED, str(answer), tries)


def eviction_units(evictions: Sequence[Eviction]) -> list[list[int]]:
    """``evictions`` (by index) in the units the rate lets through whole, in order of first appearance.

    Evictions of one victim gang are one unit: a gang leaves whole. So are
    the victims evicted for one beneficiary: half of them sent, the room
    made for it would be half free, its reservation would lapse once the
    sent ones were gone, and the engine would evict others for it while
    the rest still ran. Units that share a gang or a beneficiary merge.
    """
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for ev in evictions:
        if ev.beneficiary is not None:
            parent[root("victim:" + ev.job)] = root("for:" + ev.beneficiary)
    units: dict[str, list[int]] = {}
    for i, ev in enumerate(evictions):
        units.setdefault(root("victim:" + ev.job), []).append(i)
    return list(units.values())


def refused_pods(results: Sequence[EvictResult]) -> dict[str, str]:
    """Pods (``namespace/name``) whose eviction a budget refused, with what the API server said."""
    return {
        f"{r.eviction.namespace}/{r.eviction.pod}": r.error or "refused"
        for r in results
        if r.outcome is EvictOutcome.REFUSED
    }
