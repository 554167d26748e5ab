"""A watch on the agent's own GPUNode, so that remediation's requests arrive at once.

One object, one long-lived request: a list with ``fieldSelector
metadata.name=<node>`` gives its state and a resourceVersion, then a watch
from there (with bookmarks, so a quiet object's resourceVersion stays fresh)
reports each change as it happens. That costs the API server one open
stream per node instead of a read per poll. A stream that ends is opened
again from the last resourceVersion; one whose resourceVersion is too old
(410 Gone, as an HTTP status or as an ERROR event) is replaced by a new
list. Failures back off with jitter and are logged once per outage; nothing
here can stop the daemon: the heartbeat's read of the GPUNode and every
status patch's answer also carry the spec, so requests still arrive, only
later, while the watch is down.

The stream is read as bytes and decoded with ``json.loads``: the client's
``Watch`` class would build models for a custom object it has none for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, Backoff, OutageLog, RequestStats
from gpuwarden.kube.errors import status_message
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

HTTP_GONE = 410


class _GoneError(Exception):
    """The resourceVersion is too old: list again."""


def _documents(response: Any) -> Iterator[JSON]:
    """The newline-delimited JSON documents of a watch stream, as they arrive."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                doc = json.loads(line)
                if isinstance(doc, dict):
                    yield doc


class GpuNodeWatch:
    """Follows one GPUNode and hands every state of it to ``on_object`` (None: it is gone)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        node: str,
        on_object: Callable[[JSON | None], None],
        *,
        stats: RequestStats | None = None,
        watch_timeout_s: int = 300,
        connect_timeout_s: float = 10.0,
        backoff: Backoff | None = None,
    ) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._node = node
        self._on_object = on_object
        self._stats = stats
        self._watch_timeout_s = watch_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._backoff = backoff or Backoff(base_s=0.5, cap_s=30.0)
        self._outage = OutageLog()
        self._resource_version = ""
        self._lock = threading.Lock()
        self._response: Any = None
        self.lists = 0
        self.watches = 0

    def _record(self, operation: str, ok: bool) -> None:
        if self._stats is not None:
            # Background requests: a watch open for minutes is no sign of a stuck publisher.
            self._stats.record(operation, ok=ok, progress=False)

    def _request(self, operation: str, read_timeout_s: float, **params: Any) -> Any:
        try:
            response = self._custom.list_cluster_custom_object(
                contract.API_GROUP,
                contract.API_VERSION,
                contract.GPUNODE_PLURAL,
                field_selector=f"metadata.name={self._node}",
                _preload_content=False,
                _request_timeout=(self._connect_timeout_s, read_timeout_s),
                **params,
            )
        except ApiException as exc:
            self._record(operation, ok=exc.status == HTTP_GONE)
            if exc.status == HTTP_GONE:
                raise _GoneError from exc
            raise ApiError(operation, exc.status, status_message(exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._record(operation, ok=False)
            raise ApiError(operation, None, f"{type(exc).__name__}: {exc}") from exc
        self._record(operation, ok=True)
        return response

    def _list(self) -> None:
        response = self._request("list_gpunode", self._connect_timeout_s + 30)
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        items = [i for i in body.get("items") or [] if isinstance(i, dict)]
        self._resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self.lists += 1
        self._on_object(items[0] if items else None)

    def _watch(self, stop: threading.Event) -> None:
        """Follow one stream until it ends; raises ``_GoneError`` to relist."""
        response = self._request(
            "watch_gpunode",
            # A silent stream for longer than the server's own timeout is a dead one.
            self._watch_timeout_s + 30,
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s,
        )
        self.watches += 1
        with self._lock:
            self._response = response
        try:
            if stop.is_set():
                return
            for doc in _documents(response):
                kind = doc.get("type")
                raw = doc.get("object")
                obj: JSON = raw if isinstance(raw, dict) else {}
                if kind == "ERROR":
                    if obj.get("code") == HTTP_GONE:
                        raise _GoneError
                    raise ApiError("watch_gpunode", obj.get("code"), str(obj.get("message") or obj))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self._resource_version = str(version)
                if kind in ("ADDED", "MODIFIED"):
                    self._on_object(obj)
                elif kind == "DELETED":
                    self._on_object(None)
                self._backoff.reset()
        finally:
            with self._lock:
                self._response = None
            # Closed, not returned to the pool: an interrupted stream is only
            # shut for reading, and the API server would keep the watch open
            # (and wait for it when it stops) until it next wrote to it.
            response.close()
            response.release_conn()

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set (call :meth:`interrupt` to cut an open stream)."""
        while not stop.is_set():
            opened = time.monotonic()
            try:
                if not self._resource_version:
                    self._list()
                self._watch(stop)
                if self._outage.in_outage:
                    self._outage.recovered()
                if time.monotonic() - opened < 1.0:
                    # A stream that ends at once, again and again, must not spin.
                    stop.wait(self._backoff.next_delay())
            except _GoneError:
                self._resource_version = ""
            except ApiError as exc:
                self._outage.failed(exc)
                stop.wait(self._backoff.next_delay())
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if stop.is_set():
                    return
                # The stream broke (the API server restarted, a proxy cut it): open it again.
                self._outage.failed(ApiError("watch_gpunode", None, f"{type(exc).__name__}: {exc}"))
                stop.wait(self._backoff.next_delay())
            except Exception:
                log.exception("gpunode_watch_failed")
                stop.wait(self._backoff.next_delay())

    def interrupt(self) -> None:
        """Cut the stream being read, so that a stopping thread returns at once."""
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()
            except (AttributeError, OSError):
                response.close()
