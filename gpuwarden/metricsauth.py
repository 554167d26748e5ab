"""Delegated authentication and authorization of scrapes, as Kubernetes' own components do it.

The agent serves on the host network, so anyone who reaches a node can ask
for its ``/metrics``. In delegated mode the API server decides who may: the
scraper sends its ServiceAccount token as a bearer token, a TokenReview
(authentication.k8s.io/v1) says whose token it is, and a SubjectAccessReview
(authorization.k8s.io/v1) asks whether that user may ``get`` the
non-resource URL ``/metrics``: what a ClusterRole with ``nonResourceURLs:
["/metrics"]`` grants, the same rule the kubelet, kube-rbac-proxy and
metrics-serving controllers check. No credential or RBAC rule lives in
gpuwarden; revoking a binding revokes the scrape.

Two API calls per new token would be a request per scrape per node, so
answers are cached by token for a short while (10 s when allowed, 2 s when
refused by default), long enough that a burst of scrapes (two Prometheus
replicas, a retry) costs nothing more and short enough that a revoked
binding stops the scrapes within seconds. The cache holds SHA-256 digests,
not tokens, and is bounded, so garbage tokens cannot grow it. An API server
that does not answer is never cached: the scrape gets 503 (the scraper
retries; the target shows down rather than forbidden), one warning is logged
per outage, and the server keeps serving the probes.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwarden.http import AuthDecision
from gpuwarden.kube import ApiError, KubeApi, OutageLog
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

MAX_CACHED = 1024


@dataclass(frozen=True, slots=True)
class ReviewedUser:
    """The user a TokenReview found, as the SubjectAccessReview must name it."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class DelegatedAuthorizer:
    """Decides a request for ``path`` by asking the API server; see the module docstring.

    ``api`` should have a short timeout (the scrape waits for it) and its
    own request counts (see :func:`gpuwarden.serving.build_server`).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        path: str = "/metrics",
        verb: str = "get",
        allowed_ttl_s: float = 10.0,
        denied_ttl_s: float = 2.0,
        max_cached: int = MAX_CACHED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._path = path
        self._verb = verb
        self._allowed_ttl = allowed_ttl_s
        self._denied_ttl = denied_ttl_s
        self._max_cached = max_cached
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[bytes, tuple[float, AuthDecision]] = {}
        self._outage = OutageLog(clock)

    def authorize(self, authorization: str | None) -> AuthDecision:
        """200, 401 (no token, or one the API server does not know), 403 (not allowed) or 503 (no answer)."""
        token = bearer_token(authorization)
        if token is None:
            return AuthDecision(401, "a bearer token is required")
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        try:
            decision = self._review(token)
        except ApiError as exc:
            with self._lock:
                self._outage.failed(exc)
            return AuthDecision(503, "cannot check credentials with the Kubernetes API server")
        with self._lock:
            if self._outage.in_outage:
                self._outage.recovered()
            self._remember(key, decision, now)
        if decision.status != 200:
            log.info("metrics_request_refused", status=decision.status, reason=decision.reason, user=decision.user)
        return decision

    def _remember(self, key: bytes, decision: AuthDecision, now: float) -> None:
        """Cache ``decision`` (caller holds the lock), dropping expired entries, then the oldest, when full."""
        if len(self._cache) >= self._max_cached:
            for stale in [k for k, (expires, _) in self._cache.items() if expires <= now]:
                del self._cache[stale]
            while len(self._cache) >= self._max_cached:
                del self._cache[next(iter(self._cache))]
        ttl = self._allowed_ttl if decision.status == 200 else self._denied_ttl
        self._cache.pop(key, None)  # re-inserted last: the dict's order is the age order
        self._cache[key] = (now + ttl, decision)

    def _review(self, token: str) -> AuthDecision:
        user = self._authenticate(token)
        if user is None:
            return AuthDecision(401, "the bearer token is not valid")
        allowed, reason = self._access(user)
        if not allowed:
            detail = f": {reason}" if reason else ""
            return AuthDecision(403, f"{user.username} may not {self._verb} {self._path}{detail}", user=user.username)
        return AuthDecision(200, "ok", user=user.username)

    def _authenticate(self, token: str) -> ReviewedUser | None:
        reply = self._api.create_token_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        )
        status: dict[str, Any] = reply.get("status") or {}
        user: dict[str, Any] = status.get("user") or {}
        username = user.get("username")
        if status.get("authenticated") is not True or not isinstance(username, str) or not username:
            return None
        extra = user.get("extra") or {}
        return ReviewedUser(
            username=username,
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or []),
            extra={str(k): [str(v) for v in vs or []] for k, vs in extra.items()} if isinstance(extra, dict) else {},
        )

    def _access(self, user: ReviewedUser) -> tuple[bool, str]:
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": self._path, "verb": self._verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        reply = self._api.create_subject_access_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        )
        status: dict[str, Any] = reply.get("status") or {}
        return status.get("allowed") is True, str(status.get("reason") or "")
