"""Remediation passes on their own thread, so that a slow pass never delays a bind.

The leader used to run a remediation pass after each scheduling cycle, on
the loop's thread: a pass that waited on an escalation webhook, on a drain's
evictions or on 500 Node patches held every pending pod for that long. The
worker runs passes on a thread of its own, always over the latest view the
loop offered (views it had no time for are skipped: a pass reads the whole
cluster, so only the newest matters), with the eviction refusals of every
cycle since its last pass.

Most cycles change no Node and no GPUNode. When, besides, the controller is
at rest (every node quiet, nothing of its own in flight, no refusal to
read: :meth:`RemediationController.at_rest`), a pass would confirm what the
last one read, and the worker skips it. What changed is merged over the
views it did not take, so a skipped view's Node change is never lost.

Before the pass, on a view in which a Node, a GPUNode, a ResourceSlice or
a DeviceTaintRule changed, the worker syncs the DeviceTaintRules of the
quarantined GPUs (:mod:`scheduler.remediation.devicetaints`); a change of
DeviceTaintRules alone brings that sync and no pass. A changed
ResourceSlice brings a pass too: NVIDIA's DRA driver reports a failed GPU
by tainting its device there (:mod:`scheduler.remediation.driverhealth`),
and only the nodes whose taints changed are observed again.

Fencing is unchanged: the controller writes through the same fenced API,
so a pass of a lost term fails at the fence (:class:`LeaseLostError`),
which ends the worker; the runner reads :attr:`RemediationWorker.fenced`
after each cycle and drops its kept state, stopping the worker (and waiting
for it, as for the cycle's own queued writes) before the fence can be armed
for a new term.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.logconfig import get_logger
from scheduler.cluster.cache import DEVICETAINTRULES, RESOURCESLICES
from scheduler.cluster.cycle import ClusterView
from scheduler.cluster.fence import LeaseLostError
from scheduler.remediation.controller import RemediationController
from scheduler.remediation.devicetaints import DeviceTaintPublisher
from scheduler.remediation.driverhealth import DriverTaints

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Offer:
    view: ClusterView
    refused: dict[str, str]
    # Whether a Node, GPUNode or ResourceSlice changed since the view of the worker's last pass (or that is unknown).
    nodes_changed: bool
    # The view's pods, taken on the loop's thread; None when no pass was expected (see offer).
    pods: tuple[Mapping[str, Any], ...] | None = None
    # Whether a ResourceSlice or DeviceTaintRule changed (or that is unknown): a device-taint sync.
    dra_changed: bool = False


class RemediationWorker:
    """One thread running :meth:`RemediationController.run` over the newest offered view; one per term."""

    def __init__(self, controller: RemediationController, taints: DeviceTaintPublisher | None = None) -> None:
        self.controller = controller
        # The DeviceTaintRules of the quarantined GPUs (None: not kept), synced before each pass.
        self.taints = taints
        # The DRA driver's health taints, read from the slices that changed.
        self.driver = DriverTaints()
        self._cond = threading.Condition()
        self._offer: _Offer | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Why the worker ended on a fenced write (the runner resets on it), else None.
        self.fenced: str | None = None
        self.passes = 0
        # Views taken without a pass: nothing changed for remediation (see the module docstring).
        self.skipped = 0
        # When the pass now running began (monotonic), for the runner's liveness; None between passes.
        self.busy_since: float | None = None
        # A pass is due (the controller is not at rest) on a view offered without its pods: take them next time.
        self._want_pods = False

    def offer(self, view: ClusterView, refused: Mapping[str, str]) -> None:
        """Hand the worker the cycle's view (replacing one it has not begun) and the cycle's refusals."""
        with self._cond:
            if self._stopping or self.fenced is not None:
                return
            kept = dict(self._offer.refused) if self._offer is not None else {}
            kept.update(refused)
            changed = view.changed
            moved = changed is None or bool(changed.nodes or changed.gpunodes or changed.resource_slices)
            moved = moved or (self._offer is not None and self._offer.nodes_changed)
            dra = changed is None or bool(changed.resource_slices or changed.device_taint_rules)
            dra = dra or (self._offer is not None and self._offer.dra_changed)
            # The view's pods are the loop's own dict, which its next view
            # changes: a pass takes them as they are now, copied here. Only
            # for a view a pass is expected on (a Node changed, a refusal,
            # or the worker asked): copying every pod for every cycle was a
            # fifth of the loop's CPU under steady arrivals.
            pods = tuple(view.pods.values()) if moved or kept or self._want_pods else None
            if pods is not None:
                self._want_pods = False
            self._offer = _Offer(view, kept, moved, pods, dra)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="remediation", daemon=True)
                self._thread.start()
            self._cond.notify()

    def idle(self) -> bool:
        """Whether no pass runs and none waits (for tests and a clean stop)."""
        with self._cond:
            return self.busy_since is None and self._offer is None

    def stop(self) -> None:
        """End the worker after the pass it runs, if any; waits for it (its writes meet the fence as they go)."""
        with self._cond:
            self._stopping = True
            self._offer = None
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._offer is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                offer, self._offer = self._offer, None
                self.busy_since = time.monotonic()
            assert offer is not None
            try:
                self._sync_taints(offer)
            except LeaseLostError as lost:
                self._fenced_out(lost)
                return
            if not offer.nodes_changed and not offer.refused and self.controller.at_rest():
                with self._cond:
                    self.skipped += 1
                    self.busy_since = None
                continue
            if offer.pods is None:
                # Work in hand with nothing new: the next view (at most one
                # period away) comes with its pods.
                with self._cond:
                    self._want_pods = True
                    self.busy_since = None
                continue
            try:
                self.controller.note_refusals(offer.refused)
                view = offer.view
                slices = {} if RESOURCESLICES in view.missing else view.resource_slices
                self.controller.run(view.nodes, view.gpunodes, offer.pods, self.driver.update(slices))
                self.passes += 1
            except LeaseLostError as lost:
                self._fenced_out(lost)
                return
            except Exception:  # one bad pass must not end remediation: log, and take the next view
                log.exception("remediation_failed")
            with self._cond:
                self.busy_since = None

    def _sync_taints(self, offer: _Offer) -> None:
        """The device-taint sync, where something it reads changed or a retry is due; raises only when fenced."""
        taints = self.taints
        if taints is None or not (offer.nodes_changed or offer.dra_changed or taints.retry_due):
            return
        view = offer.view
        unknown = bool(view.missing & {RESOURCESLICES, DEVICETAINTRULES})
        try:
            taints.sync(view.nodes, view.gpunodes, view.resource_slices, view.device_taint_rules, unknown=unknown)
        except LeaseLostError:
            raise
        except Exception:  # as for a pass: log, and take the next view
            log.exception("device_taints_failed")

    def _fenced_out(self, lost: LeaseLostError) -> None:
        """A write of this term met the fence: the worker ends, and the runner reads why."""
        with self._cond:
            self.fenced = str(lost)
            self.busy_since = None
