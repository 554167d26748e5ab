"""The scheduler process's cyclic garbage collection: owned by the scheduling loop, run between cycles.

CPython collects a generation when enough objects were allocated since its
last collection, on whichever thread allocates the one object too many, and
stops every thread while it runs. In the scheduler that was the loop's
thread at the end of a cycle or a watch thread decoding an event, and the
pause grew with what it had to look at:

* a young collection looked at up to 50,000 objects (the runner's
  ``GC_THRESHOLDS``): 20-50 ms, 37 ms beside the API server, twice a minute
  under single-pod churn (``benchmarks/scheduler_soak.py --mode contender``), with
  nothing to collect: a pod that arrived meanwhile waited for all of it;
* an old collection looked at every object that survived since the cache's
  first sync was frozen. Every pod the watch shows again is a new object, so
  in a cluster that runs for hours that is the whole cache, about fifty
  objects a pod: 1.8-2 s at 150,000 pods, binds and watches stopped alike.

What the scheduler keeps lives long (the cache's objects, the engine's kept
state) and what it throws away is freed by reference counting as it goes;
cyclic garbage is rare, and what there is of it is young (a failed request's
traceback). The two bulks of cyclic state that die old are taken apart or
looked for: the engine breaks the cycles of a kept state it drops
(``scheduler.engine.incremental``), and the runner asks for a sweep when it
drops its cache and kept state after losing the lease.

So, once the cache has synced, automatic collection is off and the loop
collects between its cycles instead: the young generation once
``young_limit`` objects are in it, after which everything that survived is
frozen (:func:`gc.freeze`), never to be looked at again. Each object is then
looked at once, while young, and each pause is as short as ``young_limit``
makes it. More than ``bulk_limit`` young objects at once are a bulk of state
built in one go (the first cycle's kept state of every job and pod, a cache
listed again): frozen without a look, which at 150,000 pods would have taken
seconds for nothing. A frozen object that later becomes part of a garbage
cycle would never be found, so every ``sweep_every_s`` the loop thaws
everything and collects it all once (its pause and what it found are
logged): a leak is bounded by that period and shows in the log.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# Objects in the young generation before the loop collects it. Under
# single-pod churn (``benchmarks/scheduler_churn.py``, 3,000 cycles) that was
# 229 collections of 0.1 ms at the median and 8.3 ms at most, 12 ms per 1,000
# cycles in all; left to itself at 50,000 the collector ran twice, 76 ms at
# most, 36 ms per 1,000 cycles. Limits of 3,000 and 10,000 paused longer for
# more in all.
YOUNG_LIMIT = 1_000
# Young objects beyond which the loop freezes them unlooked at: a bulk of new state (about 0.1 s to look at).
BULK_LIMIT = 250_000
# How often everything frozen is looked at again, for garbage cycles among old objects.
SWEEP_EVERY_S = 3600.0

# Loops that hold automatic collection off (several run in one test process);
# the first turns it off, the last one out restores it.
_lock = threading.Lock()
_holders = 0
_was_enabled = False


@dataclass
class LoopCollector:
    """Young collections and the periodic sweep, on the thread that calls :meth:`between_cycles`."""

    young_limit: int = YOUNG_LIMIT
    bulk_limit: int = BULK_LIMIT
    sweep_every_s: float = SWEEP_EVERY_S
    clock: Callable[[], float] = time.monotonic
    # Counted for tests and logs: young collections, bulks frozen unlooked at, and sweeps.
    collections: int = 0
    bulks: int = 0
    sweeps: int = 0
    _swept_at: float | None = field(default=None, repr=False)
    _holding: bool = field(default=False, repr=False)

    def start(self) -> None:
        """Freeze what exists now (the synced cache) and turn automatic collection off while this loop runs."""
        global _holders, _was_enabled
        gc.freeze()
        self._swept_at = self.clock()
        with _lock:
            if not self._holding:
                if _holders == 0:
                    _was_enabled = gc.isenabled()
                _holders += 1
                self._holding = True
            # Off whoever turned it on meanwhile (a session's pause ending on another thread).
            gc.disable()

    def stop(self) -> None:
        """Give collection back: automatic again once no loop holds it (if it was before the first took it)."""
        global _holders
        if not self._holding:
            return
        self._holding = False
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()

    def sweep_soon(self) -> None:
        """Sweep at the next turn: a bulk of frozen state was just dropped (the runner's reset)."""
        self._swept_at = -math.inf

    def between_cycles(self) -> None:
        """Collect what is due: the sweep when its period is up, else the young generation once it is full."""
        if not self._holding:
            return
        now = self.clock()
        # What the young generation holds. Not gc.get_count(): it goes down
        # with every object freed, frozen ones too, so while the watch
        # replaces the frozen pods with new objects it stays near 0 and the
        # young generation grows unseen. Counted only up to a bulk: a count
        # that high is a young generation at least that big.
        young = gc.get_count()[0]
        if young < self.bulk_limit:
            young = len(gc.get_objects(generation=0))
        if self._swept_at is not None and now - self._swept_at >= self.sweep_every_s:
            self._sweep(now)
        elif young >= self.bulk_limit:
            gc.freeze()  # state built in one go: kept, not looked at (the sweep finds any garbage in it)
            self.bulks += 1
            log.debug("garbage_bulk_frozen", objects=young)
        elif young >= self.young_limit:
            gc.collect(0)
            gc.freeze()  # what survived its first look lives long: never looked at again (see the module)
            self.collections += 1

    def _sweep(self, now: float) -> None:
        began = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self._swept_at = now
        self.sweeps += 1
        log.info("garbage_swept", collected=found, seconds=round(time.perf_counter() - began, 3))
