"""Reservations on the PodGroup, so that room held for a job survives the cycle and the leader.

The engine decides which room is held for which job
(:mod:`scheduler.engine.reservations`); this module keeps that decision in
the cluster, in the PodGroup's ``status.reservations``::

    status:
      reservations:
      - node: gpu-node-17
        gpus: [6, 7]             # device indices
        gpuMemoryMiB: [20480]    # only for a slice: MiB per GPU
        cpu: 8000                # millicores
        memoryMiB: 65536
        expires: "2026-12-01T14:05:00Z"

Status, not an annotation: the scheduler may already patch
``podgroups/status`` and nothing else of a PodGroup, so no new permission
is needed, and a user editing the PodGroup's spec cannot forge room for
their job. Every cycle reads the reservations back from the watched
PodGroups, so a replica that becomes leader continues with exactly the room
the last one held. A malformed entry is logged once and left out; it never
stops the cycle, and the room it named is then free for anyone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.logonce import WarnOnce
from scheduler.engine.model import Reservation

log = get_logger(__name__)
warn = WarnOnce(__name__)

STATUS_FIELD = contract.PODGROUP_STATUS_RESERVATIONS
GroupKey = tuple[str, str]  # (namespace, PodGroup name)


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode(reservations: Iterable[Reservation]) -> list[JSON]:
    """The ``status.reservations`` list for one group's reservations, in a stable order."""
    out: list[JSON] = []
    for res in sorted(reservations, key=lambda r: (r.node, r.gpu_indices)):
        entry: JSON = {"node": res.node, "gpus": list(res.gpu_indices)}
        if res.gpu_memory_mib is not None:
            entry["gpuMemoryMiB"] = list(res.gpu_memory_mib)
        entry["cpu"] = res.cpu_milli
        entry["memoryMiB"] = res.memory_mib
        # Whole seconds, rounded up: the written time is never earlier than decided.
        entry["expires"] = _time(float(-(-res.expires // 1)))
        out.append(entry)
    return out


def _ints(value: Any, what: str, *, least: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} must be a list of integers")
    if any(v < least for v in value):
        raise ValueError(f"{what} must be at least {least}")
    return tuple(value)


def _count(entry: Mapping[str, Any], key: str) -> int:
    value = entry.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    return value


def decode_entry(job: str, entry: Any) -> Reservation:
    """One entry of ``status.reservations``; ValueError says what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError("an entry must be an object")
    node = entry.get("node")
    if not isinstance(node, str) or not node:
        raise ValueError("node must be a node name")
    gpus = _ints(entry.get("gpus", []), "gpus", least=0)
    if len(set(gpus)) != len(gpus):
        raise ValueError("gpus lists a GPU twice")
    mib_raw = entry.get("gpuMemoryMiB")
    mib = None if mib_raw is None else _ints(mib_raw, "gpuMemoryMiB", least=1)
    if mib is not None and len(mib) != len(gpus):
        raise ValueError("gpuMemoryMiB needs one size per GPU")
    expires_raw = entry.get("expires")
    if not isinstance(expires_raw, str):
        raise ValueError("expires must be an RFC 3339 time")
    try:
        expires = datetime.fromisoformat(expires_raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expires {expires_raw!r} is not an RFC 3339 time") from None
    if expires.tzinfo is None:
        raise ValueError("expires must carry a time zone")
    return Reservation(
        job=job,
        node=node,
        gpu_indices=gpus,
        gpu_memory_mib=mib,
        cpu_milli=_count(entry, "cpu"),
        memory_mib=_count(entry, "memoryMiB"),
        expires=expires.timestamp(),
    )


def _listed(obj: Mapping[str, Any]) -> Any:
    status = obj.get("status")
    return status.get(STATUS_FIELD) if isinstance(status, dict) else None


def lists_reservations(obj: Mapping[str, Any]) -> bool:
    """Whether a PodGroup's status lists reservations (well-formed or not): the writer may have to clear them."""
    return bool(_listed(obj))


def reservations_of(key: GroupKey, obj: Mapping[str, Any]) -> tuple[Reservation, ...]:
    """The well-formed reservations one PodGroup lists (malformed entries are logged and left out)."""
    listed = _listed(obj)
    if listed is None:
        return ()
    namespace, name = key
    job = f"{namespace}/{name}"
    if not isinstance(listed, list):
        warn.warning("reservations_invalid", ("reservations", job), podgroup=job, problem="not a list")
        return ()
    out: list[Reservation] = []
    for i, entry in enumerate(listed):
        try:
            out.append(decode_entry(job, entry))
        except ValueError as err:
            warn.warning(
                "reservation_invalid", ("reservation", job, i, str(err)), podgroup=job, entry=i, problem=str(err)
            )
    return tuple(out)


def reservations_from(podgroups: Mapping[GroupKey, Mapping[str, Any]]) -> tuple[Reservation, ...]:
    """Every well-formed reservation of the watched PodGroups (the engine drops expired ones)."""
    return tuple(res for key, obj in sorted(podgroups.items()) for res in reservations_of(key, obj))


def reservations_by_group(podgroups: Mapping[GroupKey, Mapping[str, Any]]) -> dict[GroupKey, tuple[Reservation, ...]]:
    """:func:`reservations_from` by group, leaving out the groups that list none."""
    found = ((key, reservations_of(key, obj)) for key, obj in podgroups.items())
    return {key: listed for key, listed in found if listed}


@dataclass(slots=True)
class _Sent:
    """A write the watch has not shown yet: what was sent, what it lists, and the PodGroup entry the view held then."""

    body: list[JSON]
    seen: Mapping[str, Any] | None
    reservations: tuple[Reservation, ...]
    # The resourceVersion the API server gave the write, when it reads as a
    # number (etcd's revision): entries older than it do not show the write.
    version: int | None = None

    def shown_in(self, obj: Mapping[str, Any] | None) -> bool:
        """Whether the watched entry ``obj`` shows this write, or something newer, or the group gone.

        A newer entry is not enough: the echo of another write to the same
        status (the status writer's conditions) can arrive after this write
        went out and still predate it. Where versions are not numbers,
        any entry other than the one written over counts as newer.
        """
        if obj is self.seen:
            return False
        if obj is None or self.version is None:
            return True
        version = _version(obj)
        return version is None or version >= self.version


def _version(obj: Mapping[str, Any] | None) -> int | None:
    meta = obj.get("metadata") if obj is not None else None
    value = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


# What one reservation patch came to when it wrote nothing (ReservationWriter._patch).
_GONE, _FAILED = object(), object()
# Reservation patches in flight at once.
RESERVATION_WRITERS = 8


class ReservationWriter:
    """Writes each PodGroup's reservations when they differ from what it holds.

    What the watched PodGroup shows is the truth (a new leader reads it),
    except right after a write: until the view hands over a newer entry of
    that PodGroup (entries are replaced, never changed in place), what was
    sent is what the API server holds, so an unchanged reservation is not
    patched again every cycle, and a change back to what the stale entry
    shows is still sent. A watch that lags (an API outage, a slow watch)
    must never make the writer believe the server holds what the stale
    entry shows: a leader that did would keep a lapsed reservation on the
    PodGroup, cycle after cycle, until a new leader read it afresh.
    """

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._sent: dict[GroupKey, _Sent] = {}
        self._executor: ThreadPoolExecutor | None = None

    def write(
        self,
        reservations: Iterable[Reservation],
        podgroups: Mapping[GroupKey, Mapping[str, Any]],
        listing: Collection[GroupKey] | None = None,
    ) -> int:
        """Bring every group's ``status.reservations`` to ``reservations``; returns the patches sent.

        ``listing``, when the caller keeps it, names the PodGroups of
        ``podgroups`` whose status lists reservations (:func:`lists_reservations`);
        without it every PodGroup is read for them.
        """
        wanted: dict[GroupKey, list[Reservation]] = {}
        for res in reservations:
            namespace, _, name = res.job.partition("/")
            wanted.setdefault((namespace, name), []).append(res)
        groups = set(wanted)
        if listing is None:
            groups.update(key for key, obj in podgroups.items() if _listed(obj))
        else:
            groups.update(listing)
        groups.update(key for key, sent in self._sent.items() if sent.body)
        todo: list[tuple[GroupKey, list[JSON], Mapping[str, Any] | None]] = []
        for key in sorted(groups):
            body = encode(wanted.get(key, ()))
            obj = podgroups.get(key)
            if obj is None and not body:
                self._sent.pop(key, None)  # gone (or never created): nothing to hold
                continue
            held = self._held(key, obj)
            if body != held:
                todo.append((key, body, obj))
        # One round trip each, on the cycle's thread: under a deep backlog a
        # cycle changes tens of reservations, and one after the other they
        # were a quarter of its time. Sent at once, recorded here after.
        if len(todo) > 1:
            answers = list(self._pool().map(lambda item: self._patch(item[0], item[1]), todo))
        else:
            answers = [self._patch(key, body) for key, body, _ in todo]
        sent_now = 0
        for (key, body, obj), answer in zip(todo, answers, strict=True):
            if answer is _GONE:
                self._sent.pop(key, None)
            elif answer is not _FAILED:
                job = f"{key[0]}/{key[1]}"
                written = tuple(decode_entry(job, entry) for entry in body)
                self._sent[key] = _Sent(body, obj, written, _version(answer if isinstance(answer, dict) else None))
                sent_now += 1
        for key in [k for k in self._sent if k not in groups]:
            del self._sent[key]
        return sent_now

    def overlay(
        self,
        shown: Mapping[GroupKey, tuple[Reservation, ...]],
        podgroups: Mapping[GroupKey, Mapping[str, Any]],
    ) -> tuple[Reservation, ...]:
        """``shown`` (each watched PodGroup's reservations) with this writer's writes the view does not show yet.

        The next cycle often starts before the watch has brought back the
        cycle's own reservation patches. Read from the view alone, room
        just reserved for a job looked free and went to another job (the
        reservation then lapsed, and the evictions that made the room were
        for nothing), and room a bind had just taken was held again. Under
        a deep backlog that turned most reclaims into waste.
        """
        merged = dict(shown)
        for key, sent in self._sent.items():
            if sent.shown_in(podgroups.get(key)):
                continue  # the view has caught up: its word stands
            if sent.reservations:
                merged[key] = sent.reservations
            else:
                merged.pop(key, None)
        return tuple(res for key in sorted(merged) for res in merged[key])

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=RESERVATION_WRITERS, thread_name_prefix="reservations")
        return self._executor

    def close(self) -> None:
        """Stop the writer's threads (a later write starts them again)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _held(self, key: GroupKey, obj: Mapping[str, Any] | None) -> list[JSON]:
        """What the API server holds for ``key``, as far as this writer knows."""
        sent = self._sent.get(key)
        if sent is not None and not sent.shown_in(obj):
            return sent.body  # the view has not caught up with this write
        self._sent.pop(key, None)  # the view shows it or newer: the server's word from now on
        shown: list[JSON] = (_listed(obj) if obj is not None else None) or []
        return shown

    def _patch(self, key: GroupKey, body: list[JSON]) -> object:
        """Send ``body``: the PodGroup as written, _GONE (it is not there) or _FAILED (the next cycle tries again)."""
        namespace, name = key
        try:
            reply = self._api.patch_podgroup_status(namespace, name, {"status": {STATUS_FIELD: body or None}})
        except ApiError as err:
            # Nothing is recorded: the next cycle compares with the view again and sends again.
            warn.warning(
                "reservation_write_failed",
                ("reservation-write", key, err.status),
                podgroup=f"{namespace}/{name}",
                status=err.status,
                error=err.detail,
            )
            return _FAILED
        if reply is None:
            log.debug("reservation_group_gone", podgroup=f"{namespace}/{name}")
            return _GONE
        log.info("reservations_written", podgroup=f"{namespace}/{name}", count=len(body))
        return reply
