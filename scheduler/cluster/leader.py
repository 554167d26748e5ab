"""Leader election over a coordination.k8s.io/v1 Lease, with client-go's semantics.

Several scheduler replicas run for availability; only one may bind and evict,
or two would place work on the same GPUs. Candidates share one Lease: the
holder renews it every retry period, the others wait for it to expire.

The rules, as client-go's leaderelection package has them:

- A lease is free when it does not exist or names no holder, and expired
  when its record has not changed for ``lease_duration_s`` by the
  candidate's own clock. The local clock is used, not the renewTime written
  in the lease, so that clock skew between machines cannot make a candidate
  take a lease that is still being renewed.
- Every write carries the resourceVersion it read; a 409 means another
  candidate wrote first and this one lost the round.
- The leader gives leadership up when it has not renewed for
  ``renew_deadline_s``. That is shorter than the lease duration, so it steps
  down before any other candidate can consider the lease expired: there are
  never two leaders, even when the leader is cut off from the API server.
  :meth:`LeaderElector.is_leader` checks the deadline itself, so a renew
  request that hangs cannot stretch leadership.
- On a clean stop the leader releases the lease (no holder, a one-second
  duration) so that another candidate takes over at once rather than after
  a whole lease duration.

Acting on leadership is fenced more tightly than holding it
(:meth:`LeaderElector.holds`): a write may leave the process only while
the time since the last successful renew, by this process's monotonic clock,
is below both the renew deadline and the lease duration shortened for a
clock that runs up to ``max_clock_drift`` fast elsewhere, less a margin for
the write itself. A process paused (SIGSTOP, a long GC, a frozen VM) for
longer than that finds on waking that it no longer holds the lease, even
before its campaign thread runs again. Each term (one stretch of holding
the lease) has a number, so work begun in one term is never finished in the
next: see :mod:`scheduler.cluster.fence`.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi, OutageLog, RequestStats
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

HTTP_CONFLICT = 409
# client-go waits up to this factor of the retry period between attempts, so
# that candidates started together do not keep colliding.
JITTER_FACTOR = 1.2


def default_identity() -> str:
    """The pod's name (or the host's) and a random suffix: a restarted pod is a new candidate."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{secrets.token_hex(4)}"


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the lease lives and how fast it moves; client-go's defaults."""

    namespace: str
    name: str = contract.SCHEDULER_COMPONENT
    identity: str = field(default_factory=default_identity)
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    release_on_stop: bool = True
    # One request's timeout; by default half the margin between the renew
    # deadline and the lease duration.
    request_timeout_s: float | None = None
    # How much faster than ours another candidate's clock may run: it may
    # take the lease after lease_duration_s / (1 + drift) of our seconds.
    max_clock_drift: float = 0.05
    # Time a write may take to reach the API server after it was allowed.
    write_margin_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError("lease_duration_s must be greater than renew_deadline_s")
        if not self.renew_deadline_s > JITTER_FACTOR * self.retry_period_s:
            raise ValueError(f"renew_deadline_s must be greater than {JITTER_FACTOR} x retry_period_s")
        if self.retry_period_s <= 0:
            raise ValueError("retry_period_s must be positive")
        if not self.identity:
            raise ValueError("identity must not be empty")
        if not 0 <= self.max_clock_drift < 1:
            raise ValueError("max_clock_drift must be in [0, 1)")
        if self.write_margin_s < 0:
            raise ValueError("write_margin_s must not be negative")
        if self.fence_s <= 0:
            raise ValueError("lease_duration_s is too short for the clock drift and write margin")

    @property
    def fence_s(self) -> float:
        """Seconds after a successful renew during which this process may still write.

        The smaller of the renew deadline (after which it gives the lease up)
        and the earliest moment another candidate could take it over, by a
        clock that runs ``max_clock_drift`` fast, less ``write_margin_s``.
        """
        takeover = self.lease_duration_s / (1 + self.max_clock_drift) - self.write_margin_s
        return min(self.renew_deadline_s, takeover)

    @property
    def timeout_s(self) -> float:
        if self.request_timeout_s is not None:
            return self.request_timeout_s
        return (self.lease_duration_s - self.renew_deadline_s) / 2


def _micro_time(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for one lease, campaigning in its own thread.

    ``on_started_leading`` and ``on_stopped_leading`` are called from that
    thread and must return quickly; the scheduling loop should gate each
    write on :meth:`is_leader`, which is exact, while the callbacks may come
    up to two request timeouts after the fact. After losing the lease the
    candidate campaigns again.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        config: LeaderElectionConfig,
        *,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        stats: RequestStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.config = config
        self.identity = config.identity
        self._api = KubeApi(
            api_client,
            field_manager=contract.SCHEDULER_COMPONENT,
            timeout_s=config.timeout_s,
            stats=stats,
            progress=False,
        )
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False
        self._last_renew = 0.0
        # The lease as last read or written, and when (local clock) its spec last changed.
        self._observed: JSON | None = None
        self._observed_spec: JSON | None = None
        self._observed_at = 0.0
        self._release_on_stop = config.release_on_stop
        self.outages = OutageLog()
        # How many times this candidate became leader.
        self.terms = 0

    # -- life cycle -------------------------------------------------------

    def start(self) -> LeaderElector:
        if self._thread is not None:
            raise RuntimeError("elector already started")
        self._thread = threading.Thread(target=self._run, name=f"leader-{self.identity}", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, release: bool | None = None, timeout: float | None = None) -> None:
        """Stop campaigning; a leader releases the lease unless ``release`` (or the config) says not to."""
        if release is not None:
            self._release_on_stop = release
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else 2 * self.config.timeout_s + 5)

    def is_leader(self) -> bool:
        """Whether this candidate holds the lease now: renewed within the renew deadline."""
        with self._lock:
            return self._leading and self._clock() - self._last_renew < self.config.renew_deadline_s

    def holds(self, term: int) -> bool:
        """Whether a write of term ``term`` may leave the process now (see the module docstring).

        True only while this candidate leads in that same term and its last
        renew is younger than :attr:`LeaderElectionConfig.fence_s`.
        """
        with self._lock:
            return self._leading and self.terms == term and self._clock() - self._last_renew < self.config.fence_s

    def term_token(self) -> str:
        """``<identity>#<leaseTransitions>``: this term as the Lease names it (the fence's admission policy checks it).

        The transition count changes with every change of holder and never on
        a renew, so it is the same for the whole term.
        """
        with self._lock:
            spec = self._observed_spec or {}
        transitions = spec.get("leaseTransitions")
        return f"{self.identity}#{transitions if isinstance(transitions, int) else 0}"

    def term(self) -> int | None:
        """The number of the term this candidate leads in now; None while it does not lead."""
        with self._lock:
            leading = self._leading and self._clock() - self._last_renew < self.config.fence_s
            return self.terms if leading else None

    @property
    def leader(self) -> str:
        """The holder named by the lease as last seen ("" when none)."""
        with self._lock:
            spec = self._observed_spec or {}
        return str(spec.get("holderIdentity") or "")

    # -- the campaign -----------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._attempt():
                self._stop.wait(self.config.retry_period_s * (1 + random.random() * (JITTER_FACTOR - 1)))
                continue
            self._lead()
        if self._release_on_stop:
            self._release()

    def _lead(self) -> None:
        with self._lock:
            self._leading = True
            self.terms += 1
        log.info("leader_elected", lease=self.config.name, namespace=self.config.namespace, identity=self.identity)
        if self._on_started is not None:
            self._on_started()
        while not self._stop.wait(self.config.retry_period_s):
            with self._lock:
                deadline = self._last_renew + self.config.renew_deadline_s
            if self._clock() < deadline and self._attempt():
                continue
            holder = self.leader
            if holder and holder != self.identity:
                # Someone else holds it (the lease was deleted and taken, or
                # taken over): stop now, not at the renew deadline.
                log.warning("leader_lost", lease=self.config.name, identity=self.identity, holder=holder)
                break
            if self._clock() >= deadline:
                log.warning(
                    "leader_lost",
                    lease=self.config.name,
                    identity=self.identity,
                    holder=self.leader,
                    renew_deadline_s=self.config.renew_deadline_s,
                )
                break
        with self._lock:
            self._leading = False
        if self._on_stopped is not None:
            self._on_stopped()

    def _attempt(self) -> bool:
        """One try to acquire or renew; True when this candidate holds the lease afterwards."""
        started = self._clock()
        try:
            held = self._try_acquire_or_renew()
        except ApiError as err:
            if err.status == HTTP_CONFLICT:
                return False  # another candidate wrote first
            self.outages.failed(err)
            return False
        self.outages.recovered()
        if held:
            with self._lock:
                self._last_renew = started
        return held

    def _observe(self, lease: JSON) -> None:
        spec = lease.get("spec") or {}
        with self._lock:
            self._observed = lease
            if spec != self._observed_spec:
                self._observed_spec = spec
                self._observed_at = self._clock()

    def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now = _micro_time(self._wall())
        duration = max(1, round(cfg.lease_duration_s))
        current = self._api.get_lease(cfg.namespace, cfg.name)
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            self._observe(self._api.create_lease(cfg.namespace, body))
            return True
        self._observe(current)
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity:
            with self._lock:
                valid = self._observed_at + cfg.lease_duration_s > self._clock()
            if valid:
                return False
        renewing = holder == self.identity
        new_spec = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": duration,
            "renewTime": now,
            "acquireTime": spec.get("acquireTime", now) if renewing else now,
            # Taking over, from a holder or from a released lease, is a transition.
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if renewing else 1),
        }
        body = {**current, "spec": new_spec}
        self._observe(self._api.replace_lease(cfg.namespace, cfg.name, body))
        return True

    def _release(self) -> None:
        """Hand the lease back if this candidate still holds it, so the next one need not wait it out."""
        with self._lock:
            lease = self._observed
            held = self._clock() - self._last_renew < self.config.renew_deadline_s and self.terms > 0
        spec = (lease or {}).get("spec") or {}
        if lease is None or not held or spec.get("holderIdentity") != self.identity:
            return
        now = _micro_time(self._wall())
        released = {
            **spec,
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
        }
        try:
            self._observe(self._api.replace_lease(self.config.namespace, self.config.name, {**lease, "spec": released}))
        except ApiError as err:
            # Someone else holds it already (409), or the server is away:
            # the lease then expires on its own.
            log.info("leader_release_failed", lease=self.config.name, status=err.status, error=err.detail)
            return
        log.info("leader_released", lease=self.config.name, identity=self.identity)
