"""The lease fence: no write acting on a cycle's decisions leaves a process that may have lost the lease.

Checking leadership once at the start of a cycle is not enough. A leader
paused in the middle of its binds (SIGSTOP, a long GC, a frozen VM, a node
under memory pressure) wakes after the standby has taken the lease over and
bound pods of its own, and would then finish its old cycle's binds onto the
same GPUs. So the fence is checked twice for every write:

- **In the process**, just before each request leaves it
  (:meth:`LeaseFence.check`, called by :class:`~gpuwarden.kube.KubeApi` for
  every mutating request): the write must belong to the term the cycle
  began in, and that term must still hold by the process's own monotonic
  clock, with the margins of :attr:`LeaderElectionConfig.fence_s`. A
  refused write raises :class:`LeaseLostError`, which ends the cycle; the runner
  then drops its queued work and everything it kept from earlier cycles,
  and rebuilds from the API before it leads again.
- **At the API server**, for the pause that falls between that check and
  the write: binds, evictions and slice ConfigMaps carry the identity they
  were decided under (:data:`~gpuwarden.contract.ANNOTATION_LEASE_HOLDER`),
  and the ValidatingAdmissionPolicy ``gpuwarden-scheduler-fence``
  (``manifests/scheduler/admission-policy.yaml``) refuses one whose
  identity is not the Lease's holder at that moment. Remediation's Node
  patches carry the resourceVersion they were decided from, so a stale one
  fails with 409 instead.

The second check is not redundant: a monotonic clock does not always see a
pause. A VM frozen by its hypervisor, or a suspended machine, may wake with
CLOCK_MONOTONIC where it stopped, so the process believes its last renew is
fresh; only the API server knows that another replica holds the lease now.

The server-side check guards against gpuwarden's own stale replicas, which
always say who they are; it is not a security boundary (the scheduler's
token may read the Lease).
"""

from __future__ import annotations

import threading
from typing import Protocol

from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


class LeaseLostError(Exception):
    """A write refused because this process no longer holds, or may no longer hold, the lease."""

    def __init__(self, operation: str, term: int | None) -> None:
        super().__init__(f"{operation} refused: this replica may have lost the lease (term {term})")
        self.operation = operation
        self.term = term


class Leadership(Protocol):
    """What the fence asks of leader election (:class:`~scheduler.cluster.leader.LeaderElector`)."""

    identity: str

    def holds(self, term: int) -> bool: ...

    def term(self) -> int | None: ...

    def term_token(self) -> str: ...


class LeaseFence:
    """The gate every write of the scheduling loop passes; thread-safe.

    :meth:`arm` at the start of a cycle names the term its writes belong to;
    :meth:`check` before each write lets it through only while that term
    holds. Writes from background threads (bind workers, the status writer)
    are checked the same way, so a cycle's queued work dies with its term.
    """

    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership
        self._lock = threading.Lock()
        self._term: int | None = None
        self._token: str | None = None
        self._logged: int | None = -1
        # Writes refused so far.
        self.refused = 0

    def token(self) -> str | None:
        """What fenced objects carry: ``<identity>#<leaseTransitions>`` of the armed term (None when disarmed).

        The Lease's transition count names the term, so a write decided in an
        earlier term of this same replica (lost, then taken again) does not
        pass the admission policy either.
        """
        with self._lock:
            return self._token

    def current(self) -> int | None:
        """The term this replica leads in now (None when it does not), without arming anything."""
        return self._leadership.term()

    def arm(self, term: int | None) -> None:
        """Begin a cycle in ``term`` (from :meth:`current`): the term its writes must keep."""
        token = self._leadership.term_token() if term is not None else None
        with self._lock:
            self._term = term
            self._token = token

    def disarm(self) -> None:
        """Refuse every write until the next :meth:`arm` (after losing the lease, or on stop)."""
        with self._lock:
            self._term = None
            self._token = None

    def check(self, operation: str) -> None:
        """Raise :class:`LeaseLostError` unless a write of the armed term may leave the process now."""
        with self._lock:
            term = self._term
        if term is not None and self._leadership.holds(term):
            return
        with self._lock:
            self.refused += 1
            first = self._logged != term
            self._logged = term
        if first:  # once per term: a cycle's queued writes all fail here together
            log.warning("write_fenced", operation=operation, term=term, identity=self._leadership.identity)
        raise LeaseLostError(operation, term)
