"""Binds sent behind the cycle: the scheduling thread does not wait for every answer.

A bind is one round trip to the API server. With the cycle waiting for all
of them, a cycle that placed a gang or a fill waited for its slowest bind,
and pods that arrived meanwhile waited behind it. kube-scheduler splits
the two: its scheduling cycle assumes the pod bound and goes on to the
next pod, and the binding cycle runs in a goroutine of its own.

So the cycle waits for none of its binds onto free room
(:meth:`BindsInFlight.send`). It writes the first one's request itself and
hands the rest to the binder's pool: a Python thread is not a goroutine,
and waking a pool thread on two busy cores put one to two milliseconds
between a lone arrival and its bind (bind latency p50 6 ms against 8 ms
beside kube-scheduler's 5 ms, `benchmarks/scheduler_soak.py --mode
contender`), while a cycle that binds one pod is the common one under
steady arrivals. Only the first's answer is read on the pool
(:meth:`.Binder.start`): the thread that reads it is woken while the API
server works on the bind, and the cycle goes on meanwhile, so a pod that
arrived during the cycle is not kept waiting a round trip behind it (when
the cycle waited for its first bind, that round trip was two thirds of a
cycle). The runner shows the next cycles each sent pod as bound
(:class:`~.assumed.AssumedBinds`) until the watch does, or until its answer
says it failed, when the pod is shown pending again and placed anew. The
answers are collected here and taken by the next cycle (:meth:`answered`):
the cycle's result reports them, the metrics count them, and the runner
forgets the failed ones, so that the cycle after places their pods again.
A failed answer does not wake the loop: a bind that fails for good (a
slice whose ConfigMap name someone else holds) would otherwise be tried
again as fast as the API server answers; it is tried again at the pace a
failed bind always was, the next cycle's, at least every ``--period``.

The cycle's bookkeeping (PodGroup creates, status) still goes out after
its binds are answered, behind the cycles (``WriteBatch.after``), as it did
when the cycle waited for them: it never comes between a bind and the API
server.

A bind refused at the lease fence is not an answer: :meth:`answered`
raises it, which ends the cycle, and the runner starts over (see
:mod:`.fence`). Pipelined binds, which wait for evictions, stay on the
cycle's thread (:meth:`~.cycle.SchedulingCycle._execute`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from gpuwarden.logconfig import get_logger
from scheduler.cluster.bind import Binder, BindOutcome, BindResult
from scheduler.cluster.fence import LeaseLostError
from scheduler.engine.model import Bind, Node

log = get_logger(__name__)


class BindsInFlight:
    """The binds sent and not yet answered, and the answers not yet taken; thread-safe."""

    def __init__(self, binder: Binder) -> None:
        self._binder = binder
        self._lock = threading.Lock()
        self._sent = 0
        self._answers: list[BindResult] = []
        self._fenced: LeaseLostError | None = None

    def __len__(self) -> int:
        """How many binds are sent and not answered."""
        with self._lock:
            return self._sent

    def send(self, binds: Sequence[Bind], nodes: Mapping[str, Node]) -> tuple[Future[BindResult], ...]:
        """Send ``binds`` (none pipelined) without waiting; their answers come through :meth:`answered`.

        The first is written from the caller's thread (:meth:`.Binder.start`),
        the rest from the pool. The futures returned are for what must not go
        out before these binds (the cycle's bookkeeping, see
        :class:`~.writebehind.WriteBatch`). Raises what the write guard
        raises for the first (the lease fence), before anything is sent.
        """
        futures: list[Future[BindResult]] = []
        for i, bind in enumerate(binds):
            with self._lock:
                self._sent += 1
            try:
                node = nodes.get(bind.node)
                future = self._binder.start(bind, node) if i == 0 else self._binder.submit(bind, node)
            except BaseException:
                with self._lock:
                    self._sent -= 1
                raise
            future.add_done_callback(functools.partial(self._answer, bind))
            futures.append(future)
        return tuple(futures)

    def _answer(self, bind: Bind, done: Future[BindResult]) -> None:
        error = done.exception()
        result: BindResult | None = None
        fenced: LeaseLostError | None = None
        if isinstance(error, LeaseLostError):
            fenced = error
        elif error is not None:
            # A fault of ours in one bind (its outcome unknown to the engine)
            # must not end the loop: the pod is shown pending again, and a
            # bind that did go out is seen by the watch.
            log.error("bind_raised", namespace=bind.namespace, pod=bind.pod, node=bind.node, error=repr(error))
            result = BindResult(bind, BindOutcome.FAILED, f"bind raised: {error!r}")
        else:
            result = done.result()
        with self._lock:
            self._sent -= 1
            if fenced is not None:
                self._fenced = self._fenced or fenced
            elif result is not None:
                self._answers.append(result)

    def answered(self) -> list[BindResult]:
        """The answers that came since the last call, in the order they came.

        Raises the :class:`~.fence.LeaseLostError` of a bind refused at the
        fence: the cycle that takes it ends, and the runner starts over.
        """
        with self._lock:
            answers, self._answers = self._answers, []
            fenced, self._fenced = self._fenced, None
        if fenced is not None:
            raise fenced
        return answers
