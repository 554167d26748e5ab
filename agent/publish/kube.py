"""Kubernetes API access shared by the publishers: client, calls, backoff, outages.

The publishers work on plain JSON dicts rather than the client's generated
models: what they send is a strategic-merge or merge patch that must contain
exactly the fields they own, and what they read back is a handful of fields
of the Node. Every call goes through :class:`KubeApi` so that there is one
place that sets the patch content type (the client would otherwise send a
JSON patch), one request timeout (a hung API server must not hang the agent),
one counter of requests and errors (the request budget and the
``gpuwarden_api_errors_total`` metric), and one translation of the client's
exceptions into :class:`ApiError`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agent import contract
from agent.logconfig import get_logger

log = get_logger(__name__)

JSON = dict[str, Any]

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"

# Who the agent's writes are attributed to in managedFields.
FIELD_MANAGER = contract.AGENT_COMPONENT

# HTTP statuses worth retrying: the server is overloaded, restarting or timed
# out. Everything else in 4xx is the request's fault (or RBAC's) and is
# reported as such, though the daemon still retries it with backoff, because
# the cause (a CRD or a RoleBinding being applied) is often fixed from outside.
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """A Kubernetes API call failed.

    ``status`` is the HTTP status, or None when no response came back
    (connection refused, timeout). ``transient`` says whether the same request
    may simply succeed later.
    """

    def __init__(self, operation: str, status: int | None, detail: str) -> None:
        self.operation = operation
        self.status = status
        self.detail = detail
        self.transient = status is None or status in _TRANSIENT_STATUSES
        super().__init__(f"{operation}: {'no response' if status is None else f'HTTP {status}'}: {detail}")


def load_api_client(kubeconfig: str | None, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or the pod's service account when None.

    urllib3's own retries are turned off: the publishers retry with backoff
    and jitter themselves, and immediate retries only multiply the load on an
    API server that is already failing.
    """
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]  # the client ships no annotations here
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = 0
    return client.ApiClient(configuration)


@dataclass
class RequestStats:
    """Requests and errors per operation, since start; thread-safe.

    Read by the metrics publisher (``gpuwarden_api_requests_total``,
    ``gpuwarden_api_errors_total``) and by the latency benchmark (requests
    per minute in steady state).
    """

    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    # Monotonic time the latest request finished (answered or failed): the
    # daemon's liveness tells a slow publisher from a stuck one by it.
    last_finished: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, operation: str, ok: bool) -> None:
        with self._lock:
            self.requests[operation] = self.requests.get(operation, 0) + 1
            if not ok:
                self.errors[operation] = self.errors.get(operation, 0) + 1
            self.last_finished = time.monotonic()

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.requests), dict(self.errors)

    def total_requests(self) -> int:
        with self._lock:
            return sum(self.requests.values())


class KubeApi:
    """The endpoints the agent uses, JSON in and JSON out.

    404 on a read returns None (the object not existing is an answer, not an
    error); every other failure raises :class:`ApiError` and is counted.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        timeout_s: float = 10.0,
        stats: RequestStats | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._timeout = timeout_s
        self.stats = stats if stats is not None else RequestStats()

    # -- plumbing -----------------------------------------------------------

    def _call(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        return self._request(operation, fn, args, kwargs, absent_ok=False) or {}

    def _read(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON | None:
        return self._request(operation, fn, args, kwargs, absent_ok=True)

    def _request(
        self,
        operation: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        absent_ok: bool,
    ) -> JSON | None:
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
            try:
                raw = response.data
            finally:
                # Back to the pool: one agent keeps one connection, not one per request.
                response.release_conn()
        except ApiException as exc:
            if absent_ok and exc.status == 404:
                self.stats.record(operation, ok=True)
                return None
            self.stats.record(operation, ok=False)
            raise ApiError(operation, exc.status, _status_message(exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self.stats.record(operation, ok=False)
            raise ApiError(operation, None, f"{type(exc).__name__}: {exc}") from exc
        self.stats.record(operation, ok=True)
        try:
            decoded = json.loads(raw)
        except ValueError as exc:
            raise ApiError(operation, None, f"response is not JSON: {exc}") from exc
        if not isinstance(decoded, dict):
            raise ApiError(operation, None, f"response is a {type(decoded).__name__}, not an object")
        return decoded

    # -- Node ---------------------------------------------------------------

    def get_node(self, name: str) -> JSON | None:
        return self._read("get_node", self._core.read_node, name)

    def patch_node_status(self, name: str, patch: JSON) -> JSON:
        """Strategic-merge patch of nodes/status: conditions merge by type."""
        return self._call(
            "patch_node_status",
            self._core.patch_node_status,
            name,
            patch,
            field_manager=FIELD_MANAGER,
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    # -- GPUNode --------------------------------------------------------------

    def get_gpunode(self, name: str) -> JSON | None:
        return self._read(
            "get_gpunode",
            self._custom.get_cluster_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            name,
        )

    def create_gpunode(self, body: JSON) -> JSON:
        return self._call(
            "create_gpunode",
            self._custom.create_cluster_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            body,
            field_manager=FIELD_MANAGER,
        )

    def patch_gpunode(self, name: str, patch: JSON) -> JSON:
        return self._call(
            "patch_gpunode",
            self._custom.patch_cluster_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            name,
            patch,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
        )

    def patch_gpunode_status(self, name: str, patch: JSON) -> JSON:
        return self._call(
            "patch_gpunode_status",
            self._custom.patch_cluster_custom_object_status,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            name,
            patch,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
        )

    # -- Events -------------------------------------------------------------

    def create_event(self, namespace: str, body: JSON) -> JSON:
        return self._call("create_event", self._core.create_namespaced_event, namespace, body)

    def get_event(self, namespace: str, name: str) -> JSON | None:
        return self._read("get_event", self._core.read_namespaced_event, name, namespace)

    def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        return self._call(
            "patch_event",
            self._core.patch_namespaced_event,
            name,
            namespace,
            patch,
            _content_type=MERGE_PATCH,
        )


def _status_message(exc: ApiException) -> str:
    """The API server's own explanation from a Status body, else the reason."""
    body = exc.body
    if body:
        try:
            status = json.loads(body)
        except ValueError:
            return body[:500]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])[:500]
    return str(exc.reason or "unknown error")


@dataclass
class Backoff:
    """Exponential backoff with jitter, for retrying a failing API server.

    Each delay is drawn from the upper half of the exponential window ("equal
    jitter"): never zero, so one agent does not spin, and spread, so a fleet
    of agents that lost the API server together does not come back in step.
    """

    base_s: float = 0.2
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        window = min(self.cap_s, self.base_s * float(1 << self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        return window / 2 + self.rng.uniform(0, window / 2)

    def reset(self) -> None:
        self.attempt = 0


class OutageLog:
    """Logs an API outage once when it starts and once when it ends.

    Retrying every few seconds through a long outage must not write a line
    per retry across a whole fleet; the count of failures is in the metrics.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: float | None = None
        self._failures = 0
        # Outages logged since start (each is one warning line).
        self.outages = 0

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    def failed(self, error: ApiError) -> None:
        self._failures += 1
        if self._since is None:
            self._since = self._clock()
            self.outages += 1
            log.warning(
                "kubernetes_api_failing",
                operation=error.operation,
                status=error.status,
                error=error.detail,
                transient=error.transient,
            )

    def recovered(self) -> None:
        if self._since is None:
            return
        log.info(
            "kubernetes_api_recovered",
            failures=self._failures,
            outage_s=round(self._clock() - self._since, 3),
        )
        self._since = None
        self._failures = 0
