"""Clients that act as a ServiceAccount, so RBAC is tested as the pods would meet it.

The admin impersonates the ServiceAccount's user name with its groups instead
of minting tokens: no token controller has to run, the ServiceAccount object
need not exist, and the API server still authorizes exactly as it would for
the pod's own credentials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client import rest
from urllib3 import HTTPHeaderDict

SA_GROUP = "system:serviceaccounts"
AUTHENTICATED_GROUP = "system:authenticated"


class _ImpersonatingRESTClient(rest.RESTClientObject):
    """Adds Kubernetes impersonation headers to every request.

    The generated client keeps headers in a plain dict, which cannot hold the
    repeated ``Impersonate-Group`` header the API server expects (one header
    per group; a comma-joined value would be a single group name). urllib3's
    HTTPHeaderDict can, and urllib3 sends each value as its own header line.
    """

    def __init__(self, configuration: client.Configuration, user: str, groups: Sequence[str]) -> None:
        super().__init__(configuration)
        self._user = user
        self._groups = list(groups)

    def request(self, method: str, url: str, headers: Mapping[str, str] | None = None, *args: Any, **kw: Any) -> Any:
        merged = HTTPHeaderDict(dict(headers or {}))
        merged["Impersonate-User"] = self._user
        for group in self._groups:
            merged.add("Impersonate-Group", group)
        return super().request(method, url, merged, *args, **kw)  # type: ignore[no-untyped-call]


def service_account_identity(service_account: str, namespace: str) -> tuple[str, list[str]]:
    """The user name and groups the API server gives a ServiceAccount's token."""
    user = f"system:serviceaccount:{namespace}:{service_account}"
    return user, [SA_GROUP, f"{SA_GROUP}:{namespace}", AUTHENTICATED_GROUP]


def impersonating_client(configuration: client.Configuration, service_account: str, namespace: str) -> client.ApiClient:
    """A new client (the caller closes it) that acts as ``namespace/service_account``.

    ``configuration`` must belong to a user allowed to impersonate, such as
    the control plane's admin.
    """
    user, groups = service_account_identity(service_account, namespace)
    api = client.ApiClient(configuration)
    api.rest_client = _ImpersonatingRESTClient(api.configuration, user, groups)
    return api
