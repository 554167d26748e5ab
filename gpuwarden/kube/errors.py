"""The one exception every Kubernetes call of gpuwarden raises.

Callers decide between "retry later" and "report and stop" from
:attr:`ApiError.transient`, never from the client library's exception types,
so the kubernetes package stays an implementation detail of this folder.
"""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

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


def status_message(exc: ApiException) -> str:
    """The API server's own explanation from a Status body, else the reason."""
    body = exc.body
    if body:
        try:
            status = json.loads(body)
        except ValueError:
            return body[:500]
        if isinstance(status, dict) and status.get("message"):
            # The causes carry what the message leaves out, e.g. which
            # disruption budget refused an eviction and what it needs.
            details = status.get("details")
            causes = details.get("causes") if isinstance(details, dict) else None
            extra = [str(c["message"]) for c in causes or () if isinstance(c, dict) and c.get("message")]
            return "; ".join([str(status["message"]), *extra])[:500]
    return str(exc.reason or "unknown error")


def resource_missing(exc: ApiError) -> bool:
    """Whether a 404 means the resource type is not served (its CRD is not installed), not a missing object.

    The API server answers a path no installed resource serves with a plain
    ``404 page not found`` body, and a missing object with a Status whose
    reason is NotFound (its message names the object).
    """
    return exc.status == 404 and "page not found" in exc.detail
