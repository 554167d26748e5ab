"""The scenario's faults on their schedule, and the people who take the repairs gpuwarden escalates.

:class:`FaultSchedule` injects each fault into its node's simulated hardware
when it comes due; from there on the demo does nothing: the agent detects,
the scheduler quarantines, drains, asks the agent for a reset and a
validation, and returns the hardware. Only a repair that needs hands -- a
reboot, a replaced cable -- is escalated to people (the
``gpuwarden.io/repair-needed`` label, a ``RepairEscalated`` Event), and
:class:`People` plays them: ``repair_after_s`` after the escalation they
repair the node (:meth:`~demo.nodes.SimulatedNode.repair`), wait until its
agent reports it clean, and close the ticket with the
``gpuwarden.io/escalation-cleared`` annotation, which starts the validation
that returns it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubernetes import client

from demo.nodes import SimulatedNode
from demo.observe import Observer
from demo.scenario import FaultSpec
from gpuwarden import contract
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# How long people wait for a repaired node's agent to report it clean before closing the ticket anyway.
CLEAN_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Injected:
    at_s: float
    node: str
    fault: FaultSpec


@dataclass(slots=True)
class Repair:
    node: str
    escalated_s: float
    repaired_s: float | None = None
    cleared_s: float | None = None
    ticket: str = ""


class FaultSchedule:
    """Injects the scenario's faults when due (``at`` seconds after the demo's start)."""

    def __init__(self, faults: list[FaultSpec], nodes: list[SimulatedNode], elapsed: Callable[[], float]) -> None:
        self.skipped = [f for f in faults if f.node >= len(nodes)]
        self._faults = sorted((f for f in faults if f.node < len(nodes)), key=lambda f: f.at)
        self._nodes = nodes
        self._elapsed = elapsed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-faults", daemon=True)
        self.injected: list[Injected] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        for fault in self._faults:
            if self._stop.wait(max(0.0, fault.at - self._elapsed())):
                return
            node = self._nodes[fault.node]
            try:
                node.inject(fault.inject, **fault.params())
            except ValueError as exc:
                log.error("demo_fault_invalid", node=node.name, fault=fault.inject, error=str(exc))
                continue
            self.injected.append(Injected(self._elapsed(), node.name, fault))
            log.info("demo_fault_injected", node=node.name, fault=fault.inject, **fault.params())


class People:
    """The on-call who repair escalated nodes; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        nodes: Mapping[str, SimulatedNode],
        observer: Observer,
        repair_after_s: float,
    ) -> None:
        self._api = api
        self._nodes = nodes
        self._observer = observer
        self._after = repair_after_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-people", daemon=True)
        self._open: dict[str, Repair] = {}
        self.repairs: list[Repair] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._tick()
            except client.ApiException as exc:
                log.warning("demo_people_failed", status=exc.status, reason=exc.reason)

    def _tick(self) -> None:
        now = self._observer.elapsed()
        escalated = {n.name for n in self._observer.latest.nodes if n.repair_needed}
        for name in escalated:
            if name not in self._open and name in self._nodes:
                repair = Repair(name, now, ticket=f"DEMO-{len(self.repairs) + 1}")
                self._open[name] = repair
                self.repairs.append(repair)
                log.info("demo_escalation_taken", node=name, ticket=repair.ticket)
        for name, repair in list(self._open.items()):
            node = self._nodes[name]
            if repair.cleared_s is not None:
                if name not in escalated:
                    del self._open[name]  # the ticket is closed on gpuwarden's side too
                continue
            if repair.repaired_s is None:
                if now - repair.escalated_s >= self._after:
                    node.repair()
                    repair.repaired_s = now
                continue
            if node.clean() or now - repair.repaired_s > CLEAN_TIMEOUT_S:
                client.CoreV1Api(self._api).patch_node(
                    name, {"metadata": {"annotations": {contract.ANNOTATION_ESCALATION_CLEARED: repair.ticket}}}
                )
                repair.cleared_s = now
                log.info(
                    "demo_escalation_cleared",
                    node=name,
                    ticket=repair.ticket,
                    waited_s=round(now - repair.repaired_s, 1),
                )
