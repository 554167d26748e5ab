"""Client construction and the patch content types, for every process that talks to the API.

The processes work on plain JSON dicts rather than the client's generated
models: what they send is a strategic-merge or merge patch that must contain
exactly the fields they own, and what they read back is a handful of fields.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client, config

JSON = dict[str, Any]

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# RFC 6902: its "test" operation makes a write conditional on what the object holds.
JSON_PATCH = "application/json-patch+json"


def load_api_client(
    kubeconfig: str | None, *, context: str | None = None, connections: int | None = None
) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or the pod's service account when None.

    urllib3's own retries are turned off: the publishers retry with backoff
    and jitter themselves, and immediate retries only multiply the load on an
    API server that is already failing.

    ``connections`` is the most connections kept open for reuse (the client's
    default is a handful). A process that sends from many threads at once, and
    whose watches each hold a connection, needs one per thread: a connection
    that does not fit back into the pool is closed, and the next request pays
    for a new TLS handshake.
    """
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]  # the client ships no annotations here
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = 0
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)
