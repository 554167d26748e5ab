"""The Kubernetes API wrapper: the agent's API access, kept in the core so the scheduler's
connected mode uses the same calls, timeouts, error type and request counts.

Client construction and patch content types (:mod:`.client`), the one error
type (:mod:`.errors`), request counting (:mod:`.stats`), backoff and outage
logging (:mod:`.retry`), and the calls themselves (:mod:`.api`).
"""

from gpuwarden.kube.api import KubeApi
from gpuwarden.kube.client import JSON, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, load_api_client
from gpuwarden.kube.errors import ApiError, resource_missing
from gpuwarden.kube.retry import Backoff, OutageLog
from gpuwarden.kube.stats import RequestStats

__all__ = [
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ApiError",
    "Backoff",
    "KubeApi",
    "OutageLog",
    "RequestStats",
    "load_api_client",
    "resource_missing",
]
