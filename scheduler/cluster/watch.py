"""List-and-watch over raw JSON: one :class:`Reflector` per watched collection.

The scheduler keeps 150,000 pods current. The client's generated models cost
milliseconds per pod to build and are never needed (the cache keeps a few
fields), so lists and watch streams are read as bytes and decoded with
orjson; ``kubernetes.watch.Watch`` is not used because it decodes to models.
Decoding is most of an initial sync (679 MiB of JSON for 150,000 pods):
about 5.8 s with the standard library's decoder, 4 s with orjson, for the
same values out.

The protocol is the API server's: list (in pages) to get a consistent state
and its resourceVersion, then watch from that resourceVersion with bookmarks,
which keep the resourceVersion fresh on quiet collections. A watch that ends
is re-opened from the last resourceVersion seen; one whose resourceVersion is
too old (410 Gone, as an HTTP status or as an ERROR event) is replaced by a
new list, and the objects that disappeared meanwhile are reported deleted, so
the consumer never keeps a pod that no longer exists. An API server that goes
away is retried with backoff and logged once per outage; a collection whose
API is not served (a CRD not installed yet, 404) is retried every few seconds
and counts as empty.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube import JSON, ApiError, Backoff, OutageLog, RequestStats
from gpuwarden.kube.errors import status_message
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

HTTP_NOT_FOUND = 404
HTTP_FORBIDDEN = 403
HTTP_GONE = 410


class EventType(StrEnum):
    """What happened to one object, as the consumer is told."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change to one object.

    ``obj`` is the object as the API server sent it. For a deletion found by
    a relist (the object vanished while no watch was open) the last state is
    unknown and ``obj`` holds only ``metadata.name`` and ``metadata.namespace``;
    ``final_state_unknown`` says so.
    """

    type: EventType
    key: str
    obj: JSON
    final_state_unknown: bool = False


class RawResponse(Protocol):
    """The part of urllib3's HTTPResponse a reflector reads."""

    def stream(self, amt: int | None = ..., decode_content: bool | None = ...) -> Iterator[bytes]: ...

    def read(self, amt: int | None = ..., decode_content: bool | None = ...) -> bytes: ...

    def shutdown(self) -> None: ...

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


# A generated list function of the client (``CoreV1Api.list_pod_for_all_namespaces``,
# ``CustomObjectsApi.list_cluster_custom_object`` bound to its group/version/plural,
# ...), called with ``_preload_content=False`` so it returns the raw response
# (its annotations name the model it would otherwise build, hence Any).
ListFunction = Callable[..., Any]


def object_key(obj: JSON) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones (client-go's key)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def _tombstone(key: str) -> JSON:
    namespace, _, name = key.rpartition("/")
    meta: JSON = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


@dataclass(frozen=True)
class ReflectorSettings:
    """Timing of one reflector; the defaults suit a production API server.

    ``watch_timeout_s`` is asked of the server and randomised up to twice as
    long (as client-go does) so that many watches do not all end at once.
    ``read_timeout_s`` bounds how long a stream may be silent before it is
    re-opened; bookmarks arrive about once a minute on a healthy server.
    """

    page_size: int = 500
    watch_timeout_s: int = 300
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    list_timeout_s: float = 60.0
    missing_retry_s: float = 5.0
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 30.0


class _GoneError(Exception):
    """The resourceVersion (or a list's continue token) is too old: list again."""


class _MissingError(Exception):
    """The collection is not served (404: its CRD or API version is not installed), or, optional, refused (403)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Reflector:
    """Keeps one consumer current with one collection, in its own thread.

    ``on_event`` is called from the reflector's thread for every change, in
    the order the API server reports them; ``on_synced`` after each complete
    list has been delivered (the first one makes :attr:`synced` true). The
    reflector remembers each object's key and resourceVersion, nothing more,
    so that a relist can tell added, changed, unchanged and vanished objects
    apart.
    """

    def __init__(
        self,
        name: str,
        list_fn: ListFunction,
        on_event: Callable[[WatchEvent], None],
        *,
        on_synced: Callable[[], None] | None = None,
        settings: ReflectorSettings | None = None,
        stats: RequestStats | None = None,
        optional: bool = False,
    ) -> None:
        self.name = name
        # An optional collection (what no cycle needs): a 403 makes it empty,
        # like one not served, instead of holding the sync (and every cycle)
        # until someone grants the list; and neither answer counts as an API
        # error, since an older API server or older RBAC gives it for good
        # (the scheduler's API-error alert would never clear).
        self._optional = optional
        # The process's request counts (gpuwarden_scheduler_api_*): a watch
        # that cannot list or open is an API error like a failed bind.
        self._stats = stats
        self._list_fn = list_fn
        self._on_event = on_event
        self._on_synced = on_synced
        self.settings = settings or ReflectorSettings()
        self._known: dict[str, str] = {}
        self._resource_version = ""
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._response: RawResponse | None = None
        self._thread: threading.Thread | None = None
        self._backoff = Backoff(self.settings.backoff_base_s, self.settings.backoff_cap_s)
        self.outages = OutageLog()
        self._missing_logged = False
        # Counters for tests and metrics: complete lists done, watches opened.
        self.lists = 0
        self.watches = 0
        self.missing = False

    # -- life cycle -------------------------------------------------------

    def start(self) -> Reflector:
        if self._thread is not None:
            raise RuntimeError(f"reflector {self.name} already started")
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; an open list or watch is cut at once, not waited out."""
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            _shutdown(response)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def resource_version(self) -> str:
        return self._resource_version

    # -- the loop ---------------------------------------------------------

    def _run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self.list_once()
                    need_list = False
                if self.watch_once():
                    self._recovered()
                else:
                    # Ended at once with nothing said: do not hammer the server.
                    self._stop.wait(self._backoff.next_delay())
            except _GoneError:
                log.info("watch_resource_version_expired", resource=self.name, resource_version=self._resource_version)
                need_list = True
            except _MissingError as err:
                self._mark_missing(err.status)
                need_list = True
                self._stop.wait(self.settings.missing_retry_s)
            except ApiError as err:
                if self._stop.is_set():
                    return
                self.outages.failed(err)
                self._stop.wait(self._backoff.next_delay())
            except Exception:
                # A consumer bug must not end the watch silently for good.
                if self._stop.is_set():
                    return
                log.exception("reflector_failed", resource=self.name)
                need_list = True
                self._stop.wait(self._backoff.next_delay())

    def _recovered(self) -> None:
        self._backoff.reset()
        self.outages.recovered()

    def _open(self, operation: str, timeout: float | tuple[float, float], **params: Any) -> RawResponse:
        try:
            response: RawResponse = self._list_fn(_preload_content=False, _request_timeout=timeout, **params)
        except ApiException as exc:
            # 410 is the watch protocol asking for a relist, not a failure.
            absent = exc.status == HTTP_NOT_FOUND or (exc.status == HTTP_FORBIDDEN and self._optional)
            self._record(operation, ok=exc.status == HTTP_GONE or (absent and self._optional))
            if exc.status == HTTP_GONE:
                raise _GoneError from exc
            if absent:
                raise _MissingError(exc.status) from exc
            raise ApiError(operation, exc.status, status_message(exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._record(operation, ok=False)
            raise ApiError(operation, None, f"{type(exc).__name__}: {exc}") from exc
        self._record(operation, ok=True)
        # The API server answers: the outage is over now, not when this
        # stream ends (a watch lasts up to a minute; the stream that shows
        # the first changes after a restart would have kept it open so long).
        self.outages.recovered()
        with self._lock:
            self._response = response
        if self._stop.is_set():  # stop() came between the request and the line above
            _shutdown(response)
        return response

    def _record(self, operation: str, *, ok: bool) -> None:
        if self._stats is not None:
            self._stats.record(operation, ok, progress=False)

    def _close(self, response: RawResponse, *, drained: bool) -> None:
        """Give the connection back; one with unread bytes (a watch cut short) is closed first."""
        with self._lock:
            self._response = None
        try:
            if not drained:
                response.close()
            response.release_conn()
        except Exception:  # a connection cut by stop() may fail to go back to the pool
            response.close()

    def list_once(self) -> None:
        """List every page and deliver the differences against what is known, in the caller's thread.

        Pages are delivered as they come, so memory holds one page of raw
        objects, not 150,000 of them. A consumer may therefore see a relist
        half done; each object it sees is as the list's snapshot has it, and
        what vanished is reported once the last page is in.
        """
        seen: set[str] = set()
        token = ""
        resource_version = ""
        while True:
            params: dict[str, Any] = {"limit": self.settings.page_size}
            if token:
                params["_continue"] = token
            response = self._open(f"list_{self.name}", self.settings.list_timeout_s, **params)
            try:
                raw = response.read()
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                self._record(f"list_{self.name}", ok=False)
                raise ApiError(f"list_{self.name}", None, f"{type(exc).__name__}: {exc}") from exc
            finally:
                self._close(response, drained=True)
            if self._stop.is_set():
                return
            try:
                page = orjson.loads(raw)
            except ValueError as exc:
                raise ApiError(f"list_{self.name}", None, f"response is not JSON: {exc}") from exc
            del raw
            self._deliver_page(page.get("items") or (), seen)
            meta = page.get("metadata") or {}
            resource_version = str(meta.get("resourceVersion", ""))
            token = str(meta.get("continue") or "")
            if not token:
                break
        if self.missing:
            log.info("watched_resource_served", resource=self.name)
        self.missing = False
        self._missing_logged = False
        self._finish_list(seen, resource_version)
        self._recovered()

    def _deliver_page(self, items: Any, seen: set[str]) -> None:
        known = self._known
        on_event = self._on_event
        for obj in items:
            key = object_key(obj)
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            seen.add(key)
            before = known.get(key)
            known[key] = rv
            if before is None:
                on_event(WatchEvent(EventType.ADDED, key, obj))
            elif before != rv:
                on_event(WatchEvent(EventType.MODIFIED, key, obj))

    def _finish_list(self, seen: set[str], resource_version: str) -> None:
        """Report what the list no longer has, take its resourceVersion, and count as synced."""
        for key in [k for k in self._known if k not in seen]:
            del self._known[key]
            self._on_event(WatchEvent(EventType.DELETED, key, _tombstone(key), final_state_unknown=True))
        self._resource_version = resource_version
        self.lists += 1
        self._synced.set()
        if self._on_synced is not None:
            self._on_synced()

    def _mark_missing(self, status: int) -> None:
        """The collection is not served (or, optional, refused): it is empty, and said so once until it appears."""
        if not self._missing_logged:
            event = "watched_resource_forbidden" if status == HTTP_FORBIDDEN else "watched_resource_not_served"
            log.warning(event, resource=self.name, optional=self._optional, retry_s=self.settings.missing_retry_s)
            self._missing_logged = True
        self.missing = True
        self._finish_list(set(), "")
        self._recovered()

    def watch_once(self) -> bool:
        """Follow one watch stream until it ends, in the caller's thread; raise ``_GoneError`` to relist.

        Returns whether the stream was worth having: it carried an event or
        lasted a second. A stream that ends at once, again and again, would
        otherwise turn into a busy loop against the API server.
        """
        opened = time.monotonic()
        lines = 0
        timeout_s = int(self.settings.watch_timeout_s * (1 + random.random()))
        response = self._open(
            f"watch_{self.name}",
            (self.settings.connect_timeout_s, self.settings.read_timeout_s),
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
        )
        self.watches += 1
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    return True
                lines += 1
                self._handle(orjson.loads(line))
        except urllib3.exceptions.ReadTimeoutError:
            return True  # a silent stream: open a new one from the same resourceVersion
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._stop.is_set():
                return True
            raise ApiError(f"watch_{self.name}", None, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._close(response, drained=False)
        return lines > 0 or time.monotonic() - opened >= 1.0

    def _handle(self, event: JSON) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == HTTP_GONE:
                raise _GoneError
            raise ApiError(f"watch_{self.name}", code if isinstance(code, int) else None, str(obj.get("message")))
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind == "BOOKMARK":
            self._resource_version = rv
            return
        key = object_key(obj)
        if kind == "DELETED":
            self._known.pop(key, None)
            self._on_event(WatchEvent(EventType.DELETED, key, obj))
        elif kind in ("ADDED", "MODIFIED"):
            # Judged against what is known, not the server's word: after a
            # re-opened watch an ADDED may repeat an object already seen.
            event_type = EventType.MODIFIED if key in self._known else EventType.ADDED
            self._known[key] = rv
            self._on_event(WatchEvent(event_type, key, obj))
        else:
            log.warning("watch_event_unknown", resource=self.name, type=kind)
            return
        self._resource_version = rv


def _lines(response: RawResponse) -> Iterator[bytes]:
    """The newline-delimited JSON documents of a watch stream, as they arrive."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        if not chunk:
            continue
        pending += chunk
        if b"\n" not in chunk:
            continue
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _shutdown(response: RawResponse) -> None:
    """Cut a response another thread may be blocked reading."""
    try:
        response.shutdown()
    except Exception:
        response.close()
