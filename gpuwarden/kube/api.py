"""Kubernetes API access: every call goes through :class:`KubeApi`.

There is one place that sets the patch content type (the client would
otherwise send a JSON patch), one request timeout (a hung API server must not
hang the process), one counter of requests and errors (the request budget and
the ``gpuwarden_api_errors_total`` metric), one field manager (whose writes
these are, in managedFields), and one translation of the client's exceptions
into :class:`~gpuwarden.kube.errors.ApiError`.

And one gate for writes: a ``write_guard`` is called with the operation's
name before every request that changes something, and may raise to stop it
(the scheduler's lease fence, :mod:`scheduler.cluster.fence`). Reads, and the
reviews that only ask the API server a question, pass without it.
"""

from __future__ import annotations

import functools
import http.client
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTClientObject

from gpuwarden import contract
from gpuwarden.kube.client import JSON, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from gpuwarden.kube.errors import ApiError, status_message
from gpuwarden.kube.stats import RequestStats

# How long the bearer token read for a POST is used before it is read again
# through the client (whose refresh hook re-reads a rotated token): a
# ServiceAccount token stays valid long after its file is rotated.
_TOKEN_READ_S = 1.0


# The scheduling objects' URL prefix; PodGroups are namespaced, Queues not.
_SCHEDULING_PREFIX = f"/apis/{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}"


def _podgroups_path(namespace: str) -> str:
    return f"{_SCHEDULING_PREFIX}/namespaces/{_segment(namespace)}/{contract.PODGROUP_PLURAL}"


def _segment(name: str) -> str:
    """One path segment of a URL (object names are DNS labels; the quoting is for whatever else arrives)."""
    return urllib.parse.quote(name, safe="")


class KubeApi:
    """The endpoints gpuwarden uses, JSON in and JSON out.

    404 on a read returns None (the object not existing is an answer, not an
    error); every other failure raises :class:`ApiError` and is counted.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        field_manager: str,
        timeout_s: float = 10.0,
        stats: RequestStats | None = None,
        progress: bool = True,
        write_guard: Callable[[str], None] | None = None,
    ) -> None:
        self._client = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._timeout = timeout_s
        self.field_manager = field_manager
        self.stats = stats if stats is not None else RequestStats()
        # False for background requests (see RequestStats.last_finished).
        self._progress = progress
        self._guard = write_guard
        # The POST path's pool, URL prefix and fixed headers, and its headers
        # with the token as last read (see _send_json); each replaced whole,
        # so the threads that bind need no lock.
        self._post: tuple[Any, str, dict[str, str]] | None = None
        self._post_auth: tuple[float, dict[str, str]] | None = None

    # -- plumbing -----------------------------------------------------------

    def _call(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        return self._request(operation, fn, args, kwargs, absent_ok=False) or {}

    def _read(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON | None:
        return self._request(operation, fn, args, kwargs, absent_ok=True)

    def check_write(self, operation: str) -> None:
        """Ask the write guard about an action outside the API (a webhook call) that acts like a write."""
        if self._guard is not None:
            self._guard(operation)

    def _write(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """A request that changes something: the write guard may stop it before it leaves."""
        self.check_write(operation)
        return self._call(operation, fn, *args, **kwargs)

    def _send_json(
        self,
        method: str,
        content_type: str | None,
        path: str,
        body: JSON,
        *,
        _preload_content: bool = False,
        _request_timeout: float | None = None,
        **query: str,
    ) -> Any:
        """Send ``body`` to ``path`` through the client's own connection pool and credentials, not its generated method.

        The generated method validates its arguments (pydantic) and walks
        the body to serialise it; the rest client then parses the URL and
        picks the pool again for every request. A bind's request cost about
        half a millisecond of CPU that way, on the scheduling loop's thread,
        and a PodGroup created and its status patched for every pod that
        runs made it a quarter of the process's CPU under steady arrivals.
        Here the pool the rest client uses for this host is taken once (its
        TLS settings, retries and proxy are the client's), the fixed headers
        are built once, and the bearer token is read as the client reads it
        (its refresh hook runs), at most once a second. A reply of 400 or
        more raises the client's own :class:`ApiException`, so
        :meth:`_request` reads both paths alike. Called as the generated
        methods are (``_preload_content``: the reply is always read raw).
        """
        del _preload_content
        return self._send_now(method, path, body, content_type=content_type, timeout=_request_timeout, query=query)

    # A POST of JSON (binds, evictions, creates) and a JSON merge patch (status and spec patches).
    _post_json = functools.partialmethod(_send_json, "POST", None)
    _merge_patch_json = functools.partialmethod(_send_json, "PATCH", MERGE_PATCH)

    def _send_now(
        self,
        method: str,
        path: str,
        body: JSON,
        *,
        content_type: str | None,
        timeout: float | None,
        query: dict[str, str],
    ) -> Any:
        """The round trip of :meth:`_send_json` (``content_type`` None: JSON)."""
        target = path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        if type(self._client.rest_client) is not RESTClientObject:
            return self._send_through_client(method, target, body, content_type, timeout)
        limit = urllib3.Timeout(total=timeout) if timeout else None
        payload = orjson.dumps(body)
        for attempt in (1, 2):
            pool, prefix, headers = self._poster()
            if content_type is not None:
                headers = {**headers, "Content-Type": content_type}
            url = prefix + target
            try:
                reply = pool.urlopen(method, url, body=payload, headers=headers, timeout=limit, preload_content=False)
            except urllib3.exceptions.ClosedPoolError:
                # The client's pool manager let this pool go (it keeps a
                # few hosts' pools); nothing was sent: take its current one.
                self._post = None
                if attempt == 2:
                    raise
                continue
            if not 200 <= reply.status < 300:
                try:
                    raise ApiException(http_resp=reply)  # reads the reply: the API server's own words
                finally:
                    reply.release_conn()
            return reply
        raise AssertionError("unreachable")

    def _post_sent(self, path: str, body: JSON, query: dict[str, str]) -> Callable[..., Any]:
        """Write a POST to the API server now, on this thread; the call returned reads the reply, on any thread.

        The request goes out on a connection taken from the rest client's pool
        (the same pool, TLS settings and headers as :meth:`_send_json`), which
        stays out of the pool until the reply is read: no other request can
        write to it meanwhile. The reply reads as :meth:`_send_json`'s does
        (400 or more raises the client's :class:`ApiException`); an error
        while writing is raised by the call, not here, so the caller has one
        place that sees every failure. A client that changes requests in its
        own rest client, or one behind a proxy, makes the whole round trip
        here instead.
        """
        if type(self._client.rest_client) is not RESTClientObject or self._client.configuration.proxy:
            try:
                answered = self._send_now("POST", path, body, content_type=None, timeout=self._timeout, query=query)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                return _raiser(exc)
            return lambda **_: answered
        payload = orjson.dumps(body)
        try:
            for attempt in (1, 2):
                pool, prefix, headers = self._poster()
                try:
                    # Private to urllib3, as is what urlopen does with it: a
                    # pooled connection (a dropped one reconnected) or a new one.
                    conn = pool._get_conn()
                except urllib3.exceptions.ClosedPoolError:
                    self._post = None  # see _send_now
                    if attempt == 2:
                        raise
                    continue
                break
            url = prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
            try:
                conn.timeout = self._timeout  # connecting, writing, then (getresponse) reading
                _request_in_one_write(conn, "POST", url, payload, headers)
            except BaseException:
                conn.close()
                pool._put_conn(None)  # its place in the pool, empty
                raise
        except http.client.HTTPException as exc:
            return _raiser(urllib3.exceptions.ProtocolError(f"writing the request: {exc!r}", exc))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return _raiser(exc)
        read = False

        def reply(**_: Any) -> Any:
            nonlocal read
            if read:
                raise RuntimeError("a sent POST's reply is read once")
            read = True
            try:
                answer = conn.getresponse()  # the body too: the connection is free once this returns
            except BaseException as exc:
                conn.close()
                pool._put_conn(None)
                if isinstance(exc, http.client.HTTPException):
                    raise urllib3.exceptions.ProtocolError(f"reading the reply: {exc!r}", exc) from exc
                raise
            pool._put_conn(conn)  # closed by http.client if the server said so
            if not 200 <= answer.status < 300:
                raise ApiException(http_resp=answer)
            return answer

        return reply

    def open_connections(self, count: int) -> int:
        """Open up to ``count`` of the rest client's pooled connections now; returns how many of them are open.

        A new leader's first binds come several at once, each on a
        connection of its own, and each such connection paid for its TLS
        handshake before the request went out: 17 ms for the first bind of
        a term on the busy two-core control plane of the soak benchmark,
        against a fraction of a millisecond on a connection already open.
        Called when the lease is won (off the scheduling thread), this moves
        that cost before the term's first binds. Each new connection
        carries one ``GET /version`` (readable by anyone): a connection that
        has only shaken hands holds the server's TLS session tickets unread,
        and the pool takes any connection with something to read for one
        the server dropped, and opens it again. Nothing is written. Through
        a proxy or a rest client of its own, requests do not take this
        pool: nothing is done.
        """
        if type(self._client.rest_client) is not RESTClientObject or self._client.configuration.proxy:
            return 0
        pool, prefix, headers = self._poster()
        reading = {k: v for k, v in headers.items() if k.lower() != "content-type"}  # the token's header too
        # Taken all at once (private to urllib3, as in _post_sent: a pooled
        # connection, one the server dropped coming back closed, or a new
        # one), so that each is a different one; those open already go back
        # at once, and each new one as soon as it is open. A pool held until
        # every handshake was done left the term's first binds none to
        # take for about a second on the soak's busy control plane, and
        # each of them opened a connection of its own (9-67 ms).
        taken: list[Any] = []
        try:
            for _ in range(count):
                taken.append(pool._get_conn())
        except urllib3.exceptions.HTTPError:
            pass  # the pool was closed (the client with it): nothing to open
        fresh = [conn for conn in taken if conn.sock is None]
        for conn in taken:
            if conn.sock is not None:
                pool._put_conn(conn)
        open_now = len(taken) - len(fresh)
        try:
            while fresh:
                conn = fresh[0]
                try:
                    conn.timeout = self._timeout
                    conn.request("GET", f"{prefix}/version", headers=reading)
                    conn.getresponse().read()
                except (http.client.HTTPException, urllib3.exceptions.HTTPError, OSError):
                    conn.close()  # the API server is not there now: the writes will say so, and connect then
                    break
                pool._put_conn(fresh.pop(0))
                open_now += 1
        finally:
            for conn in fresh:
                pool._put_conn(conn)
        return open_now

    def _send_through_client(
        self, method: str, target: str, body: JSON, content_type: str | None, timeout: float | None
    ) -> Any:
        """The same request (``target``: path and query) through the rest client's ``request``, which may change it."""
        api = self._client
        config = api.configuration
        _, _, headers = self._poster()
        if content_type is not None:
            headers = {**headers, "Content-Type": content_type}
        url = f"{config.host}{target}"
        request: Callable[..., Any] = api.rest_client.request
        reply = request(method, url, headers=dict(headers), body=body, _request_timeout=timeout)
        if not 200 <= reply.status < 300:
            raise ApiException(http_resp=reply.response)
        return reply.response

    def _poster(self) -> tuple[Any, str, dict[str, str]]:
        """The rest client's pool for the API server, the URL path's prefix, a JSON POST's headers with the token."""
        api = self._client
        config = api.configuration
        post = self._post
        if post is None:
            # Through a proxy the pool manager itself must write the request
            # line (an absolute URL): its own pool for the host does that.
            manager = api.rest_client.pool_manager
            url = urllib3.util.parse_url(config.host)
            prefix = config.host.rstrip("/") if config.proxy else (url.path or "").rstrip("/")
            base = {
                **api.default_headers,
                "Accept": "application/json",
                "Content-Type": "application/json",
                "User-Agent": api.user_agent,
            }
            post = self._post = (manager if config.proxy else manager.connection_from_url(config.host), prefix, base)
        now = time.monotonic()
        auth = self._post_auth
        if auth is None or now - auth[0] >= _TOKEN_READ_S:
            headers = dict(post[2])
            bearer = config.auth_settings().get("BearerToken")
            if bearer and bearer.get("in") == "header" and bearer.get("value"):
                headers[bearer["key"]] = bearer["value"]
            auth = self._post_auth = (now, headers)
        return post[0], post[1], auth[1]

    def _merge_patch(self, operation: str, fn: Callable[..., Any], *args: Any) -> JSON:
        """A JSON merge patch written as this process (custom objects and their status)."""
        return self._write(operation, fn, *args, field_manager=self.field_manager, _content_type=MERGE_PATCH)

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
                self.stats.record(operation, ok=True, progress=self._progress)
                return None
            self.stats.record(operation, ok=False, progress=self._progress)
            raise ApiError(operation, exc.status, status_message(exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self.stats.record(operation, ok=False, progress=self._progress)
            raise ApiError(operation, None, f"{type(exc).__name__}: {exc}") from exc
        self.stats.record(operation, ok=True, progress=self._progress)
        try:
            decoded = orjson.loads(raw)
        except ValueError as exc:
            raise ApiError(operation, None, f"response is not JSON: {exc}") from exc
        if not isinstance(decoded, dict):
            raise ApiError(operation, None, f"response is a {type(decoded).__name__}, not an object")
        return decoded

    # -- Node ---------------------------------------------------------------

    def get_node(self, name: str) -> JSON | None:
        return self._read("get_node", self._core.read_node, name)

    def get_own_node(self, name: str) -> JSON:
        """The Node this process runs for: its absence is an error, counted as one.

        For a node agent a missing Node is a misconfiguration (a node name
        that is the hostname, not the Node's name), so it must show in the
        error count that alerts fire on, not pass as an ordinary answer.
        """
        return self._call("get_node", self._core.read_node, name)

    def patch_node_status(self, name: str, patch: JSON) -> JSON:
        """Strategic-merge patch of nodes/status: conditions merge by type."""
        return self._write(
            "patch_node_status",
            self._core.patch_node_status,
            name,
            patch,
            field_manager=self.field_manager,
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    def patch_node(self, name: str, patch: JSON) -> JSON:
        """Merge patch of a Node (labels and annotations merge, null removes;
        spec.taints is replaced whole, so the caller sends the full list)."""
        return self._merge_patch("patch_node", self._core.patch_node, name, patch)

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
        return self._write(
            "create_gpunode",
            self._custom.create_cluster_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            body,
            field_manager=self.field_manager,
        )

    def patch_gpunode(self, name: str, patch: JSON) -> JSON:
        return self._merge_patch(
            "patch_gpunode",
            self._custom.patch_cluster_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            name,
            patch,
        )

    def patch_gpunode_status(self, name: str, patch: JSON) -> JSON:
        return self._merge_patch(
            "patch_gpunode_status",
            self._custom.patch_cluster_custom_object_status,
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            name,
            patch,
        )

    # -- DeviceTaintRule (resource.k8s.io) ------------------------------------

    def create_device_taint_rule(self, body: JSON) -> JSON:
        return self._write(
            "create_device_taint_rule",
            self._custom.create_cluster_custom_object,
            contract.DRA_API_GROUP,
            contract.DRA_API_VERSION,
            contract.DEVICETAINTRULE_PLURAL,
            body,
            field_manager=self.field_manager,
        )

    def replace_device_taint_rule(self, name: str, body: JSON) -> JSON:
        """Replace a rule whole; ``body`` names the ``resourceVersion`` it was decided from (409 if it moved)."""
        return self._write(
            "replace_device_taint_rule",
            self._custom.replace_cluster_custom_object,
            contract.DRA_API_GROUP,
            contract.DRA_API_VERSION,
            contract.DEVICETAINTRULE_PLURAL,
            name,
            body,
            field_manager=self.field_manager,
        )

    def delete_device_taint_rule(self, name: str, uid: str) -> JSON | None:
        """Delete a rule, only if it is still the one named by ``uid``; None if it is gone already."""
        self.check_write("delete_device_taint_rule")
        return self._request(
            "delete_device_taint_rule",
            self._custom.delete_cluster_custom_object,
            (contract.DRA_API_GROUP, contract.DRA_API_VERSION, contract.DEVICETAINTRULE_PLURAL, name),
            {"body": {"preconditions": {"uid": uid}}} if uid else {},
            absent_ok=True,
        )

    # -- ResourceClaim (resource.k8s.io) ---------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> JSON | None:
        return self._read(
            "get_resource_claim",
            self._custom.get_namespaced_custom_object,
            contract.DRA_API_GROUP,
            contract.DRA_API_VERSION,
            namespace,
            contract.RESOURCECLAIM_PLURAL,
            name,
        )

    def create_resource_claim(self, namespace: str, body: JSON) -> JSON:
        """Create a claim (a pod's extended resources served through DRA, KEP-5004)."""
        return self._write(
            "create_resource_claim",
            self._custom.create_namespaced_custom_object,
            contract.DRA_API_GROUP,
            contract.DRA_API_VERSION,
            namespace,
            contract.RESOURCECLAIM_PLURAL,
            body,
            field_manager=self.field_manager,
        )

    def delete_resource_claim(self, namespace: str, name: str, uid: str) -> JSON | None:
        """Delete a claim, only if it is still the one named by ``uid``; None if it is gone already."""
        self.check_write("delete_resource_claim")
        return self._request(
            "delete_resource_claim",
            self._custom.delete_namespaced_custom_object,
            (contract.DRA_API_GROUP, contract.DRA_API_VERSION, namespace, contract.RESOURCECLAIM_PLURAL, name),
            {"body": {"preconditions": {"uid": uid}}} if uid else {},
            absent_ok=True,
        )

    def replace_resource_claim(self, namespace: str, name: str, body: JSON) -> JSON:
        """Replace a claim's object (its finalizers); ``body`` names the ``resourceVersion`` read (409 if it moved)."""
        return self._write(
            "replace_resource_claim",
            self._custom.replace_namespaced_custom_object,
            contract.DRA_API_GROUP,
            contract.DRA_API_VERSION,
            namespace,
            contract.RESOURCECLAIM_PLURAL,
            name,
            body,
            field_manager=self.field_manager,
        )

    def replace_resource_claim_status(self, namespace: str, name: str, body: JSON) -> JSON:
        """Replace a claim's status (allocation, reservedFor); 409 if it moved since ``body``'s resourceVersion."""
        return self._write(
            "replace_resource_claim_status",
            self._custom.replace_namespaced_custom_object_status,
            contract.DRA_API_GROUP,
            contract.DRA_API_VERSION,
            namespace,
            contract.RESOURCECLAIM_PLURAL,
            name,
            body,
            field_manager=self.field_manager,
        )

    # -- Pod ----------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        return self._read("get_pod", self._core.read_namespaced_pod, name, namespace)

    def list_pods_on_node(self, node: str, *, running_only: bool = False) -> list[JSON]:
        """Every pod bound to ``node``, in all namespaces (one request, a field selector).

        ``running_only`` leaves out the pods that ended (Succeeded, Failed):
        the finished pods of Jobs stay on their nodes, by the hundred, and
        hold nothing.
        """
        selector = f"spec.nodeName={node}"
        if running_only:
            selector += ",status.phase!=Succeeded,status.phase!=Failed"
        reply = self._call("list_pods_on_node", self._core.list_pod_for_all_namespaces, field_selector=selector)
        items = reply.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def patch_pod(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Merge patch of a pod (annotations: a null value removes the key)."""
        return self._merge_patch(
            "patch_pod",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            patch,
        )

    def patch_pod_status(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Strategic merge patch of a pod's status: one condition is merged by its type, the rest kept."""
        return self._write(
            "patch_pod_status",
            self._core.patch_namespaced_pod_status,
            name,
            namespace,
            patch,
            field_manager=self.field_manager,
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    def delete_pod(self, namespace: str, name: str, uid: str) -> JSON:
        """Delete one pod, only if it is still the one named by ``uid`` (a precondition).

        Only for what the Eviction API cannot do by design: a drain whose
        namespace policy says delete-after-timeout.
        """
        return self._write(
            "delete_pod",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            body={"preconditions": {"uid": uid}} if uid else None,
        )

    def create_pod_binding(self, namespace: str, name: str, body: JSON) -> JSON:
        """POST pods/binding: sets spec.nodeName, once; the reply is a Status.

        The generated client would try to parse that Status as a Binding and
        fail on the missing ``target`` after the bind was applied; ``_request``
        reads the raw reply, so the HTTP status alone decides.
        """
        return self._write(
            "create_pod_binding",
            self._post_json,
            f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}/binding",
            body,
            fieldManager=self.field_manager,
        )

    def send_pod_binding(self, namespace: str, name: str, body: JSON) -> Callable[[], JSON]:
        """:meth:`create_pod_binding` in two halves: the request is written now, the call returned waits for the answer.

        The scheduling loop sends a cycle's bind from its own thread, so that
        no thread hand-off comes between a pod's placement and its bind, and
        leaves the answer to a pool thread, so that the loop does not wait a
        round trip (most of it the API server's) before the next cycle.
        The write guard runs here, before anything is sent; the call returned
        (once, from any thread) answers or raises exactly as
        :meth:`create_pod_binding` would, and is what the request counts.
        """
        operation = "create_pod_binding"
        self.check_write(operation)
        reply = self._post_sent(
            f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}/binding",
            body,
            {"fieldManager": self.field_manager},
        )
        return functools.partial(self._call, operation, reply)

    def create_pod_eviction(self, namespace: str, name: str, body: JSON) -> JSON:
        """POST pods/eviction (policy/v1): the API server checks PodDisruptionBudgets (429 when one refuses)."""
        return self._write(
            "create_pod_eviction",
            self._post_json,
            f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}/eviction",
            body,
            fieldManager=self.field_manager,
        )

    # -- Queue and PodGroup -------------------------------------------------

    def patch_queue_status(self, name: str, patch: JSON) -> JSON:
        """Merge patch of a Queue's status subresource (Queues are cluster-scoped)."""
        return self._write(
            "patch_queue_status",
            self._merge_patch_json,
            f"{_SCHEDULING_PREFIX}/{contract.QUEUE_PLURAL}/{_segment(name)}/status",
            patch,
            fieldManager=self.field_manager,
        )

    def patch_podgroup_status(self, namespace: str, name: str, patch: JSON) -> JSON | None:
        """Merge patch of a PodGroup's status subresource; None when the PodGroup is gone.

        A 404 is an answer here, not a failure: the status of a group whose
        PodGroup was deleted with its workload (the garbage collector is
        quicker than the scheduler's view) has nowhere to go. Counted as an
        error, each evicted bare pod showed up as one in the API error rate.
        """
        self.check_write("patch_podgroup_status")
        return self._request(
            "patch_podgroup_status",
            self._merge_patch_json,
            (f"{_podgroups_path(namespace)}/{_segment(name)}/status", patch),
            {"fieldManager": self.field_manager},
            absent_ok=True,
        )

    def create_podgroup(self, namespace: str, body: JSON) -> JSON:
        return self._write(
            "create_podgroup", self._post_json, _podgroups_path(namespace), body, fieldManager=self.field_manager
        )

    def patch_podgroup(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Merge patch of a PodGroup (a derived group's spec, following its owner)."""
        return self._write(
            "patch_podgroup",
            self._merge_patch_json,
            f"{_podgroups_path(namespace)}/{_segment(name)}",
            patch,
            fieldManager=self.field_manager,
        )

    # -- Any namespaced object of an API group (a pod's owners) ---------------

    def get_namespaced_object(self, group: str, version: str, plural: str, namespace: str, name: str) -> JSON | None:
        """An object of any non-core API group (apps, batch, or a CRD's): owners are read this way,
        so a cluster without the Kubeflow or Ray CRDs answers 404 instead of failing an import."""
        return self._read(
            f"get_{plural}",
            self._custom.get_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
        )

    # -- Events -------------------------------------------------------------

    def create_event(self, namespace: str, body: JSON) -> JSON:
        return self._write("create_event", self._core.create_namespaced_event, namespace, body)

    def get_event(self, namespace: str, name: str) -> JSON | None:
        return self._read("get_event", self._core.read_namespaced_event, name, namespace)

    def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        return self._write(
            "patch_event",
            self._core.patch_namespaced_event,
            name,
            namespace,
            patch,
            _content_type=MERGE_PATCH,
        )

    # -- Listings (read-only views such as the kubectl plugin) -------------------

    def _items(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[JSON]:
        reply = self._call(operation, fn, *args, **kwargs)
        return [item for item in reply.get("items") or [] if isinstance(item, dict)]

    def list_nodes(self) -> list[JSON]:
        return self._items("list_nodes", self._core.list_node)

    def list_cluster_objects(self, group: str, version: str, plural: str, field_selector: str = "") -> list[JSON]:
        """Every object of a cluster-scoped custom resource (GPUNodes, Queues), or those ``field_selector`` picks.

        A missing CRD answers 404 ``page not found`` (see
        :func:`gpuwarden.kube.errors.resource_missing`), not an empty list.
        """
        selected = {"field_selector": field_selector} if field_selector else {}
        return self._items(
            f"list_{plural}", self._custom.list_cluster_custom_object, group, version, plural, **selected
        )

    def list_namespaced_objects(self, group: str, version: str, plural: str, namespace: str) -> list[JSON]:
        return self._items(
            f"list_{plural}", self._custom.list_namespaced_custom_object, group, version, namespace, plural
        )

    def list_events(self, namespace: str, field_selector: str) -> list[JSON]:
        """Core Events of one namespace that match ``field_selector`` (e.g. ``involvedObject.name=x``)."""
        return self._items("list_events", self._core.list_namespaced_event, namespace, field_selector=field_selector)

    # -- Delegated authentication and authorization (the /metrics endpoint) -----

    @functools.cached_property
    def _authentication(self) -> client.AuthenticationV1Api:
        return client.AuthenticationV1Api(self._core.api_client)

    @functools.cached_property
    def _authorization(self) -> client.AuthorizationV1Api:
        return client.AuthorizationV1Api(self._core.api_client)

    def create_token_review(self, body: JSON) -> JSON:
        """POST a TokenReview (authentication.k8s.io/v1): who a bearer token belongs to, if anyone."""
        return self._call("create_token_review", self._authentication.create_token_review, body)

    def create_subject_access_review(self, body: JSON) -> JSON:
        """POST a SubjectAccessReview (authorization.k8s.io/v1): whether a user may do one thing."""
        return self._call("create_subject_access_review", self._authorization.create_subject_access_review, body)

    # -- GPU slices: the ConfigMap a slice pod's containers read -----------------

    def create_config_map(self, namespace: str, body: JSON) -> JSON:
        """Create a ConfigMap; HTTP 409 (AlreadyExists) when one of that name is there."""
        return self._write(
            "create_config_map",
            self._core.create_namespaced_config_map,
            namespace,
            body,
            field_manager=self.field_manager,
        )

    def json_patch_config_map(self, namespace: str, name: str, operations: list[JSON]) -> JSON:
        """RFC 6902 patch of a ConfigMap: a failed ``test`` operation refuses the whole patch (422)."""
        return self._write(
            "patch_config_map",
            self._core.patch_namespaced_config_map,
            name,
            namespace,
            operations,
            field_manager=self.field_manager,
            _content_type=JSON_PATCH,
        )

    # -- The admission webhook's certificate: one Secret and one webhook configuration ----

    @functools.cached_property
    def _admission(self) -> client.AdmissionregistrationV1Api:
        return client.AdmissionregistrationV1Api(self._core.api_client)

    def get_secret(self, namespace: str, name: str) -> JSON | None:
        return self._read("get_secret", self._core.read_namespaced_secret, name, namespace)

    def create_secret(self, namespace: str, body: JSON) -> JSON:
        """Create a Secret; HTTP 409 when another replica created it first."""
        return self._write(
            "create_secret", self._core.create_namespaced_secret, namespace, body, field_manager=self.field_manager
        )

    def replace_secret(self, namespace: str, name: str, body: JSON) -> JSON:
        """Replace a Secret; ``body`` carries the resourceVersion it was read at, so 409 means someone wrote first."""
        return self._write(
            "replace_secret",
            self._core.replace_namespaced_secret,
            name,
            namespace,
            body,
            field_manager=self.field_manager,
        )

    def get_mutating_webhook_configuration(self, name: str) -> JSON | None:
        return self._read(
            "get_mutating_webhook_configuration", self._admission.read_mutating_webhook_configuration, name
        )

    def patch_mutating_webhook_configuration(self, name: str, patch: JSON) -> JSON:
        """Strategic-merge patch: ``webhooks`` merge by name, so only the fields sent change."""
        return self._write(
            "patch_mutating_webhook_configuration",
            self._admission.patch_mutating_webhook_configuration,
            name,
            patch,
            field_manager=self.field_manager,
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    # -- Lease (leader election) ------------------------------------------------
    # Kept together at the end of the class: the scheduler's leader election
    # is their only user.

    @functools.cached_property
    def _coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self._core.api_client)

    def get_lease(self, namespace: str, name: str) -> JSON | None:
        return self._read("get_lease", self._coordination.read_namespaced_lease, name, namespace)

    def create_lease(self, namespace: str, body: JSON) -> JSON:
        """Create a Lease; HTTP 409 (AlreadyExists) means another candidate created it first."""
        return self._write(
            "create_lease",
            self._coordination.create_namespaced_lease,
            namespace,
            body,
            field_manager=self.field_manager,
        )

    def replace_lease(self, namespace: str, name: str, body: JSON) -> JSON:
        """Replace a Lease; ``body`` carries the resourceVersion it was read at, so 409 means someone wrote first."""
        return self._write(
            "replace_lease",
            self._coordination.replace_namespaced_lease,
            name,
            namespace,
            body,
            field_manager=self.field_manager,
        )


def _request_in_one_write(conn: Any, method: str, url: str, payload: bytes, headers: Mapping[str, str]) -> None:
    """``conn.request`` with its head and body written to the socket together, in one ``sendall``.

    urllib3 (as http.client) writes a request's head and its body in two
    calls. Each one gives up the GIL, and on two busy cores the thread then
    waits to get it back before it can write the body: the API server,
    which cannot act before the body is there, waited with it (up to the
    switch interval, a bind's whole scheduling cost again). The connection
    still builds and validates the request (``request``, so a reply is read
    as any other); only its writes are gathered, and sent (connecting
    first, if the pooled connection was closed) in one.
    """
    parts: list[bytes] = []
    conn.send = parts.append  # this one request's writes, gathered; the class's send is back below
    try:
        conn.request(method, url, body=payload, headers=headers)
    finally:
        del conn.send
    conn.send(b"".join(parts))


def _raiser(error: BaseException) -> Callable[..., Any]:
    """A call that raises ``error`` (a POST that failed while it was written, read as its reply)."""

    def raise_it(**_: Any) -> Any:
        raise error

    return raise_it
