"""Kubernetes Events on the Node: faults appearing and clearing, application XIDs.

Conditions hold the current state; Events tell the story (``kubectl describe
node`` lists them, and event exporters ship them to people). The rules emit
one :class:`~agent.model.HealthEvent` per transition -- Warning when a fault
appears, Normal when it clears -- and one Warning per application XID with
what it means for the pod; this module writes them as core/v1 Events.

Repeated identical events (the same XID from a crash-looping job) aggregate
into one Event whose ``count`` and ``lastTimestamp`` grow, as the kubelet's
event correlator does, instead of one object per occurrence. The Event's name
is derived from what makes it identical (type, reason, message, entity), so
a restarted agent finds and continues the existing Event rather than
duplicating it.

Events queue in memory while the API server is unreachable (bounded: the
oldest distinct events go first, and that is logged) and are written when it
answers again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from threading import Lock

from agent.model import EntityKind, HealthEvent
from agent.publish.conditions import format_time, now_utc
from agent.publish.settings import DEFAULT_EVENTS_NAMESPACE
from gpuwarden.contract import AGENT_COMPONENT
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

MAX_MESSAGE = 1024
# Distinct events kept while the API server is away. Each is small; beyond
# this a sustained outage with a flood of distinct events loses the oldest.
MAX_QUEUED = 512
# Distinct events whose Event name and count are remembered for aggregation.
MAX_REMEMBERED = 1024
# Statuses that say the Event itself is unacceptable: retrying cannot help.
_INVALID = frozenset({400, 422})


def event_message(event: HealthEvent) -> str:
    who = event.entity.describe()
    text = " ".join(event.message.split()) or event.reason
    if event.entity.kind is not EntityKind.NODE and who not in text:
        text = f"{who}: {text}"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def aggregation_key(event: HealthEvent) -> str:
    """What makes two events "the same": type, reason (``Xid13``, ``IbPortDown``) and entity.

    Not the message: one XID reads differently from NVML and from the kernel
    log, whichever reported it first, and two wordings of one occurrence must
    still count as one Event. The Event keeps the first occurrence's message.
    """
    return "\x1f".join((event.type.value, event.reason, event.entity.key))


def event_name(node: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    # Object names are at most 253 characters; node names may use them all.
    return f"{node[:236]}.{digest}"


@dataclass(slots=True)
class _Pending:
    event: HealthEvent
    occurrences: int
    first: datetime
    last: datetime


@dataclass(slots=True)
class _Known:
    name: str
    count: int


class EventsPublisher:
    """Writes queued HealthEvents as aggregated core/v1 Events on the Node.

    :meth:`enqueue` is thread-safe (the monitor thread calls it for every
    report, so events are not lost when the publishing thread coalesces
    reports). :meth:`flush` normally runs on the publishing thread, but the
    daemon also flushes once at shutdown from the main thread, possibly
    while the publishing thread is still inside a request: flushes are
    serialised by their own lock, so two writers never send the same queued
    event (which would double its count) nor race on the remembered Event
    names. That lock is not the queue's: enqueue never waits for a request.
    """

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        *,
        namespace: str = DEFAULT_EVENTS_NAMESPACE,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._api = api
        self._node = node_name
        self._namespace = namespace
        self._clock = clock
        self._node_uid: str | None = None
        self._lock = Lock()
        self._writer = Lock()
        self._queue: OrderedDict[str, _Pending] = OrderedDict()
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._dropped = 0

    def set_node_uid(self, uid: str | None) -> None:
        if uid:
            self._node_uid = uid

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def enqueue(self, events: Iterable[HealthEvent]) -> None:
        with self._lock:
            for event in events:
                key = aggregation_key(event)
                when = event.time.replace(microsecond=0)
                queued = self._queue.get(key)
                if queued is not None:
                    queued.occurrences += 1
                    queued.last = max(queued.last, when)
                    continue
                self._queue[key] = _Pending(event, 1, when, when)
                if len(self._queue) > MAX_QUEUED:
                    self._queue.popitem(last=False)
                    self._dropped += 1
            dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning("events_dropped", node=self._node, dropped=dropped, queue_limit=MAX_QUEUED)

    def flush(self, *, wait_s: float | None = None) -> int:
        """Write every queued event; returns how many requests were sent.

        Stops at the first failure and leaves that event and the rest queued
        (raising the :class:`ApiError`), so order is kept and nothing is lost
        to an outage. An Event the API server rejects as invalid (400, 422)
        would be rejected forever: it is logged with the reason and dropped,
        so it cannot hold up the ones behind it.

        One flush at a time: a second caller waits for the running one, at
        most ``wait_s`` seconds (None: as long as it takes), and returns 0
        without writing if it is still running then -- the shutdown path
        must not hang behind a publisher stuck on a dead API server.
        """
        if not self._writer.acquire(timeout=-1 if wait_s is None else max(0.0, wait_s)):
            return 0
        try:
            return self._flush_queue()
        finally:
            self._writer.release()

    def _flush_queue(self) -> int:
        """The body of :meth:`flush`; the caller holds the writer lock."""
        sent = 0
        while True:
            with self._lock:
                if not self._queue:
                    return sent
                key, item = next(iter(self._queue.items()))
                # enqueue() may add occurrences while the request is out.
                batch = _Pending(item.event, item.occurrences, item.first, item.last)
            try:
                sent += self._write(key, batch)
            except ApiError as exc:
                if exc.status not in _INVALID:
                    raise
                log.error(
                    "event_rejected",
                    node=self._node,
                    reason=batch.event.reason,
                    message=event_message(batch.event),
                    status=exc.status,
                    error=exc.detail,
                )
                sent += 1
            with self._lock:
                if self._queue.get(key) is item:
                    item.occurrences -= batch.occurrences
                    if item.occurrences <= 0:
                        del self._queue[key]
                    else:
                        item.first = batch.last

    def _write(self, key: str, item: _Pending) -> int:
        known = self._known.get(key)
        if known is not None:
            try:
                self._patch_count(known, known.count + item.occurrences, item.last)
                self._known.move_to_end(key)
                return 1
            except ApiError as exc:
                if exc.status != 404:
                    raise
                # The Event expired (events live an hour by default): start anew.
                del self._known[key]
        name = event_name(self._node, key)
        body = self._event_body(name, item)
        try:
            self._api.create_event(self._namespace, body)
            self._remember(key, _Known(name, item.occurrences))
            return 1
        except ApiError as exc:
            if exc.status != 409:
                raise
        # It exists: written by a previous run of this agent. Continue its count.
        existing = self._api.get_event(self._namespace, name)
        if existing is None:
            self._api.create_event(self._namespace, body)
            self._remember(key, _Known(name, item.occurrences))
            return 3
        previous = existing.get("count")
        known = _Known(name, previous if isinstance(previous, int) and previous > 0 else 1)
        self._patch_count(known, known.count + item.occurrences, item.last)
        self._remember(key, known)
        return 3

    def _patch_count(self, known: _Known, count: int, last: datetime) -> None:
        self._api.patch_event(
            self._namespace,
            known.name,
            {"count": count, "lastTimestamp": format_time(last)},
        )
        known.count = count

    def _remember(self, key: str, known: _Known) -> None:
        self._known[key] = known
        self._known.move_to_end(key)
        while len(self._known) > MAX_REMEMBERED:
            self._known.popitem(last=False)

    def _event_body(self, name: str, item: _Pending) -> JSON:
        event = item.event
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self._namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self._node,
                # The kubelet uses the node name as the uid of node Events;
                # the real uid is better when known.
                "uid": self._node_uid or self._node,
            },
            "type": event.type.value,
            "reason": event.reason,
            "message": event_message(event),
            "source": {"component": AGENT_COMPONENT, "host": self._node},
            "reportingComponent": AGENT_COMPONENT,
            "reportingInstance": self._node,
            "firstTimestamp": format_time(item.first),
            "lastTimestamp": format_time(item.last),
            "count": item.occurrences,
        }
