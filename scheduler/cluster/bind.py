"""Executing the engine's binds: pods/binding, with the GPU assignment, many at once.

The GPU assignment (:mod:`.assignment`) travels in the Binding's own
annotations. The API server copies a Binding's annotations onto the pod in
the same write that sets ``spec.nodeName``, so a pod is either bound with its
assignment or unbound without one: never half-bound, with nothing to undo
after a failed bind. Writing the annotation first with a separate patch would
cost a second request per pod and, on a bind refused because the pod was
already bound, would have overwritten the assignment of a running pod.

Binds run in a bounded pool of threads (the API server answers each in
milliseconds, so the time of a large cycle is round trips). Every bind of a
gang is attempted and reported on its own: the engine decided the gang fits,
and a pod left out by an API failure is placed again next cycle, into room
the engine keeps for it. Transient failures are retried a few times with
backoff; a pod that keeps failing holds up only its own worker.

A slice pod's ConfigMap (the GPUs and memory limit its containers obey,
:mod:`.sliceconfig`) is written by a pre-bind step just before its bind; a
pod whose ConfigMap cannot be written is not bound, so no pod runs without
its limits. A pod with DRA claims has them allocated and reserved for it
just before its bind (:mod:`.claimbind`), and taken back when the bind
fails.

A pipelined bind uses room that evictions on its node are still freeing. It
waits (is reported deferred) while any pod on that node is terminating or any
eviction passed along is still there; the next cycle decides it again. The
API server is asked, not the cycle's view: the view was taken before this
cycle's evictions, and a cycle under a deep backlog lasts long enough for
earlier victims to leave while it runs. Answering from the view deferred
three times as many binds, each keeping its reservation (and its writes)
for another cycle. The nodes are asked about all at once, and only for
their pods that still run: one after the other, with every finished pod
on them, the lists took most of a cycle's execute stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from gpuwarden.contract import ANNOTATION_GPU_ASSIGNMENT, ANNOTATION_LEASE_HOLDER
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.assignment import encode_assignment
from scheduler.cluster.claimbind import ClaimBinder
from scheduler.cluster.retrying import RetryPolicy, call_with_retries
from scheduler.engine.model import Bind, Eviction, Node

log = get_logger(__name__)

DEFAULT_BIND_WORKERS = 16
# Pods that no longer hold resources on their node, terminating or not.
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class BindOutcome(StrEnum):
    BOUND = "Bound"
    # Not attempted this cycle (a pipelined bind whose room is still being freed).
    DEFERRED = "Deferred"
    # The pod is bound to another node already (or was replaced by a new pod).
    CONFLICT = "Conflict"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class BindResult:
    """What became of one bind; ``error`` says why it did not happen."""

    bind: Bind
    outcome: BindOutcome
    error: str | None = None
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome is BindOutcome.BOUND


def binding_body(bind: Bind, assignment: str | None, holder: str | None = None) -> JSON:
    """The Binding object: the pod's UID as a precondition, the assignment and the deciding replica as annotations.

    ``holder`` is the lease holder this bind was decided under: the admission
    policy of the lease fence refuses the bind when the Lease names another
    (see :mod:`.fence`), and the API server copies it onto the pod.
    """
    metadata: JSON = {"name": bind.pod, "namespace": bind.namespace}
    if bind.uid:
        # A pod deleted and recreated under the same name is not the pod the
        # engine placed: the API server refuses the bind (409) instead.
        metadata["uid"] = bind.uid
    annotations: JSON = {}
    if assignment is not None:
        annotations[ANNOTATION_GPU_ASSIGNMENT] = assignment
    if holder:
        annotations[ANNOTATION_LEASE_HOLDER] = holder
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": bind.node},
    }


class PreBind(Protocol):
    """A step before each bind (the GPU slice ConfigMap, :mod:`.sliceconfig`): None to go on, else why not."""

    def prepare(self, bind: Bind, node: Node) -> str | None: ...


class Binder:
    """Binds pods through the pods/binding subresource; thread-safe, one per scheduler."""

    def __init__(
        self,
        api: KubeApi,
        *,
        workers: int = DEFAULT_BIND_WORKERS,
        retry: RetryPolicy | None = None,
        prebind: PreBind | None = None,
        holder: Callable[[], str | None] | None = None,
        claims: ClaimBinder | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._api = api
        self._workers = workers
        self._holder = holder
        self._retry = retry or RetryPolicy()
        self._prebind = prebind
        self._claims = claims
        # Made on the first cycle that binds several pods and kept: starting
        # threads for every cycle was a measurable part of a busy cycle.
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def holder(self) -> str | None:
        """The lease term the binds name (``<identity>#<leaseTransitions>``), None when not fenced."""
        return self._holder() if self._holder is not None else None

    def use_claims(self, claims: ClaimBinder) -> None:
        """Allocate pods' DRA claims before their binds from now on (the cycle's own plans, :mod:`.claims`)."""
        self._claims = claims

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="bind")
            return self._executor

    def close(self) -> None:
        """Stop the bind threads (after the binds in flight); a later bind_all starts them again."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def bind_all(
        self,
        binds: Sequence[Bind],
        nodes: Mapping[str, Node],
        *,
        evictions: Sequence[Eviction] = (),
    ) -> list[BindResult]:
        """Execute ``binds``; one result per bind, in the same order.

        ``nodes`` is the snapshot's view (by name): a bind to a node missing
        from it fails without a request. ``evictions`` are the ones executed
        in the same cycle; pipelined binds on their nodes wait for them.
        """
        if not binds:
            return []
        deferred = self._nodes_still_releasing(binds, evictions)
        results: list[BindResult | None] = [None] * len(binds)
        todo: list[int] = []
        for i, bind in enumerate(binds):
            why = deferred.get(bind.node) if bind.pipelined else None
            if why is not None:
                results[i] = BindResult(bind, BindOutcome.DEFERRED, why)
            else:
                if self._claims is not None:
                    self._claims.hold(bind)
                todo.append(i)
        if len(todo) == 1:
            # The common cycle under steady arrivals binds one pod: a thread
            # hand-off would only add its latency to that pod's.
            i = todo[0]
            results[i] = self._bind_one(binds[i], nodes.get(binds[i].node))
        elif todo:
            pool = self._pool()
            futures = {i: pool.submit(self._bind_one, binds[i], nodes.get(binds[i].node)) for i in todo}
            # Every bind is over before this returns or raises (a fenced one
            # raises): none may still be going out behind the caller.
            wait(futures.values())
            for i, future in futures.items():
                results[i] = future.result()
        done = [r for r in results if r is not None]
        counts = {o.value: sum(1 for r in done if r.outcome is o) for o in BindOutcome}
        # Debug: the cycle's own line (cycle_done) says how many bound and failed.
        log.debug("binds_executed", **{k.lower(): v for k, v in counts.items()})
        return done

    def submit(self, bind: Bind, node: Node | None) -> Future[BindResult]:
        """Send one bind (not pipelined) from the pool without waiting (see :mod:`.inflight`)."""
        if bind.pipelined:
            raise ValueError("a pipelined bind waits for evictions: bind_all it")
        if self._claims is not None:
            self._claims.hold(bind)
        return self._pool().submit(self._bind_one, bind, node)

    def start(self, bind: Bind, node: Node | None) -> Future[BindResult]:
        """Send one bind (not pipelined) from this thread; its answer is read, and retried, on the pool.

        The caller's thread writes the request, so no thread hand-off comes
        between the decision and the API server; it does not wait for the
        answer (see :mod:`.inflight`). A slice pod's ConfigMap is written
        first, from this thread too. Raises only what the write guard
        raises (the lease fence): every other failure is the future's result.
        """
        if bind.pipelined:
            raise ValueError("a pipelined bind waits for evictions: bind_all it")
        if self._claims is not None and self._claims.hold(bind):
            # Its claims take requests of their own before the bind: on the pool, not the cycle's thread.
            return self._pool().submit(self._bind_one, bind, node)
        body = self._body(bind, node)
        if isinstance(body, BindResult):
            failed: Future[BindResult] = Future()
            failed.set_result(body)
            return failed
        first = self._api.send_pod_binding(bind.namespace, bind.pod, body)
        try:
            return self._pool().submit(self._answered, bind, body, first)
        except RuntimeError:  # the pool shut down meanwhile (close): the request is out, its answer still counts
            answered: Future[BindResult] = Future()
            answered.set_result(self._answered(bind, body, first))
            return answered

    # -- one pod ------------------------------------------------------------

    def _bind_one(self, bind: Bind, node: Node | None) -> BindResult:
        body = self._body(bind, node)
        if isinstance(body, BindResult):
            return body
        answer, tries = call_with_retries(
            self._retry, lambda: self._api.create_pod_binding(bind.namespace, bind.pod, body)
        )
        return self._outcome(bind, answer, tries)

    def _answered(self, bind: Bind, body: JSON, first: Callable[[], JSON]) -> BindResult:
        """The outcome of a bind sent already (``first`` reads its answer); a transient failure is sent again."""
        sent = [first]

        def request() -> JSON:
            return sent.pop()() if sent else self._api.create_pod_binding(bind.namespace, bind.pod, body)

        answer, tries = call_with_retries(self._retry, request)
        return self._outcome(bind, answer, tries)

    def _body(self, bind: Bind, node: Node | None) -> JSON | BindResult:
        """The Binding to send, after the pre-bind step; the failed result if there is none to send."""
        body = self._prepared(bind, node)
        if isinstance(body, BindResult) and self._claims is not None:
            # No bind goes out: what the claim writer kept for it goes (a plan held for a later attempt
            # would be that attempt's, stale).
            self._claims.settle(bind, bound=False)
        return body

    def _prepared(self, bind: Bind, node: Node | None) -> JSON | BindResult:
        if node is None:
            return self._failed(bind, f"node {bind.node!r} is not in the scheduler's view", 0)
        assignment = None
        if bind.gpu_indices:
            try:
                assignment = encode_assignment(bind, node)
            except ValueError as err:
                return self._failed(bind, f"GPU assignment: {err}", 0)
        if self._prebind is not None:
            problem = self._prebind.prepare(bind, node)
            if problem is not None:
                return self._failed(bind, problem, 0)
        if self._claims is not None:
            problem = self._claims.prepare(bind)
            if problem is not None:
                return self._failed(bind, problem, 0)
        return binding_body(bind, assignment, self.holder())

    def _outcome(self, bind: Bind, answer: JSON | ApiError, tries: int) -> BindResult:
        result = self._answer(bind, answer, tries)
        if self._claims is not None:
            # Claims written for a pod that did not bind are taken back (claimbind).
            self._claims.settle(bind, result.ok)
        return result

    def _answer(self, bind: Bind, answer: JSON | ApiError, tries: int) -> BindResult:
        if not isinstance(answer, ApiError):
            log.debug("pod_bound", namespace=bind.namespace, pod=bind.pod, node=bind.node, job=bind.job)
            return BindResult(bind, BindOutcome.BOUND, attempts=tries)
        if answer.status == 409:
            return self._after_conflict(bind, answer, tries)
        if answer.status == 404:
            return self._failed(bind, "pod not found (deleted since the snapshot)", tries)
        return self._failed(bind, str(answer), tries)

    def _after_conflict(self, bind: Bind, error: ApiError, tries: int) -> BindResult:
        """A 409 after a retried bind may be our own earlier attempt whose reply was lost."""
        try:
            pod = self._api.get_pod(bind.namespace, bind.pod)
        except ApiError:
            pod = None
        if pod is not None:
            meta = pod.get("metadata") or {}
            same_pod = not bind.uid or meta.get("uid") == bind.uid
            if same_pod and (pod.get("spec") or {}).get("nodeName") == bind.node:
                return BindResult(bind, BindOutcome.BOUND, attempts=tries)
        log.warning(
            "bind_conflict", namespace=bind.namespace, pod=bind.pod, node=bind.node, job=bind.job, error=error.detail
        )
        return BindResult(bind, BindOutcome.CONFLICT, f"conflict: {error.detail}", tries)

    @staticmethod
    def _failed(bind: Bind, error: str, tries: int) -> BindResult:
        log.warning("bind_failed", namespace=bind.namespace, pod=bind.pod, node=bind.node, job=bind.job, error=error)
        return BindResult(bind, BindOutcome.FAILED, error, tries)

    # -- pipelined binds ----------------------------------------------------

    def _nodes_still_releasing(self, binds: Sequence[Bind], evictions: Sequence[Eviction]) -> dict[str, str]:
        """For each node of a pipelined bind whose room is not free yet: why not."""
        ask = sorted({b.node for b in binds if b.pipelined})
        if not ask:
            return {}
        evicted: dict[str, set[str]] = {}
        for ev in evictions:
            evicted.setdefault(ev.node, set()).add(ev.uid or f"{ev.namespace}/{ev.pod}")
        waiting: dict[str, str] = {}
        if len(ask) == 1:
            answers = [self._asked(ask[0], evicted.get(ask[0], set()))]
        else:
            answers = list(self._pool().map(lambda name: self._asked(name, evicted.get(name, set())), ask))
        for name, why in zip(ask, answers, strict=True):
            if why is not None:
                waiting[name] = why
        return waiting

    def _asked(self, node: str, evicted: Collection[str]) -> str | None:
        """Whether ``node`` is still releasing, by its pods that still run as the API server has them now."""
        try:
            pods = self._api.list_pods_on_node(node, running_only=True)
        except ApiError as err:
            return f"cannot tell whether evictions on {node} finished: {err}"
        return _releasing(node, pods, evicted)


def _releasing(node: str, pods: Iterable[Mapping[str, Any]], evicted: Collection[str]) -> str | None:
    """Why ``node`` is still releasing room: a pod on it terminating, or one evicted still there; None if neither."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            continue
        ident = {meta.get("uid"), f"{meta.get('namespace')}/{meta.get('name')}"}
        if meta.get("deletionTimestamp") or ident & set(evicted):
            return f"evictions on {node} have not finished ({meta.get('namespace')}/{meta.get('name')})"
    return None
