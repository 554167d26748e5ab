"""The remediation controller: observe each node, advance its machine, carry out the steps.

It runs beside the leader's scheduling cycles, on its own thread
(:mod:`scheduler.remediation.worker`), over the newest view a cycle
offered (:class:`scheduler.cluster.cycle.ClusterView`). A restarted or
failed-over scheduler continues from what the Nodes say: the
record lives in the ``gpuwarden.io/remediation-state`` annotation, the state
in the ``gpuwarden.io/state`` label (``kubectl get nodes -L
gpuwarden.io/state``).

Per node and pass (a node is observed when its Node or GPUNode changed since
the last pass, or when it has a record or a fault; every other node is
quiet, and its last transition stands):

1. Observe (:func:`observe`): the faults the engine's health judge calls
   fatal, from the Node's conditions with their start times from the
   GPUNode; the cordon and gpuwarden's taint; how many pods are left on each
   draining scope and what holds them (on one GPU: the pods the kubelet
   reports there where the GPUNode lists its holders, else by assignment); the agent's reset and validation
   answers from ``GPUNode.status.remediation``; a person's
   ``gpuwarden.io/escalation-cleared``; the pool's breaker verdict.
2. :func:`scheduler.remediation.machine.advance` (pure).
3. Carry out the steps, holds first (made true only where the cluster
   differs), then edges, then write the record, label and fences.

How a fence reaches placement: the quarantined GPUs go into
``gpuwarden.io/quarantined-gpus`` and a node drain into
``gpuwarden.io/draining``, which the scheduler's conversion reads: the GPU
(or node) takes no new gpuwarden work from the next cycle on, and the
engine's health eviction drains gpuwarden's own pods through the Eviction
API, gang-aware and rate-limited, exactly as for any fault. The device
plugin knows nothing of the fence: while it lists the GPU healthy, the
kubelet's device manager can give it to a whole-GPU pod, gpuwarden's
(which health eviction then moves at once, see
:mod:`scheduler.cluster.misplaced`) or another scheduler's, which is why a
node-level fault cordons the node (that stops every scheduler). A node
drain also evicts the pods no gpuwarden action owns (other schedulers', bare
pods), by their namespace's drain policy; DaemonSet and mirror pods stay. A
drain of one GPU does the same for the pods the kubelet reports on that GPU
(the GPUNode's holders): nothing else can name them there.

The carry-out contract: steps first, then the record. A step that fails is
logged and retried next cycle (holds are re-issued every cycle); the record
is still written, except when the machine says the record must not be
(an unreadable one). A record refused because the Node changed since the
pass read it is written again at once when only the Node's status changed
(the agent's own write racing the pass), and left to the next pass when
its labels, annotations or spec did.

The watch cache can be a write behind: the next pass may start before the
watch has brought back the Node this pass patched, and would advance the
old record again, writing its Events, webhook calls and requests a second
time (a person's escalation-cleared taken twice restarts the validation it
began). So the controller keeps the Node its own patch returned, and uses it
in place of the cache's until the cache holds that version or a later one.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuwarden import contract
from gpuwarden.contract import EvictionAction
from gpuwarden.dra import Device
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from gpuwarden.timefmt import parse_epoch
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.convert import node_from_objects
from scheduler.cluster.evict import Evictor, EvictOutcome
from scheduler.cluster.fence import LeaseLostError
from scheduler.cluster.logonce import WarnOnce
from scheduler.engine.holders import holder_key
from scheduler.engine.model import Eviction
from scheduler.remediation.breaker import BreakerVerdict, PoolStatus, is_out, verdict
from scheduler.remediation.driverhealth import driver_faults
from scheduler.remediation.machine import Transition, advance
from scheduler.remediation.model import (
    DecodedRecord,
    NodeRecord,
    ResetResult,
    State,
    ValidationResult,
    decode_record,
    encode_record,
)
from scheduler.remediation.observations import DrainProgress, GpuIdentity, Observations, faults_from_conditions
from scheduler.remediation.policy import ControllerSettings, PodDrainAction
from scheduler.remediation.steps import (
    ClearEscalation,
    Cordon,
    Drain,
    EmitEvent,
    Escalate,
    QuarantineGpu,
    RequestGpuReset,
    RequestValidation,
    Step,
    StopManaging,
    Uncordon,
)

log = get_logger(__name__)
warn = WarnOnce(__name__)

_TERMINAL = frozenset({"Succeeded", "Failed"})
# Node patches of one pass sent at once: the first pass of a new leader
# labels every node it manages, and 500 patches one after another would
# keep remediation from acting on anything else for seconds.
NODE_PATCH_WORKERS = 16
_MIRROR = "kubernetes.io/config.mirror"


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def request_time(ts: float) -> str:
    """A request's ``requestedAt``: microseconds, rounded up, so it reads back no earlier than it was asked."""
    micros = math.ceil(round(ts * 1_000_000, 3))
    seconds, fraction = divmod(micros, 1_000_000)
    stamp = datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=fraction)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _map(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []


# --------------------------------------------------------------------------
# Observing
# --------------------------------------------------------------------------


def _fault_starts(gpunode: Mapping[str, Any] | None) -> dict[tuple[str, str, int | None], float]:
    """When the agent raised each fault: (condition, reason, GPU index or None) -> time."""
    out: dict[tuple[str, str, int | None], float] = {}
    status = _map(gpunode or {}, "status")
    for gpu in _list(status, "gpus"):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
            continue
        for fault in _list(gpu, "faults"):
            if isinstance(fault, dict) and (since := parse_epoch(fault.get("since"))) is not None:
                out[(str(fault.get("condition")), str(fault.get("reason")), gpu["index"])] = since
    for fault in _list(status, "nodeFaults"):
        if isinstance(fault, dict) and (since := parse_epoch(fault.get("since"))) is not None:
            out[(str(fault.get("condition")), str(fault.get("reason")), None)] = since
    return out


def agent_answers(gpunode: Mapping[str, Any] | None) -> tuple[tuple[ResetResult, ...], tuple[ValidationResult, ...]]:
    """The agent's finished answers to the requests now in ``spec.remediation`` (Waiting is no answer).

    An answer counts only if it echoes a current request's ``requestedAt``
    exactly: an answer to an older request (a previous workflow, a request
    since withdrawn) is never taken for this one, whatever the clocks say.
    Its time is always later than the request it answers, so the machine's
    "after the request" comparisons hold even when the agent writes whole
    seconds or its clock is a little behind.
    """
    obj = gpunode or {}
    asked = _map(_map(obj, "spec"), contract.GPUNODE_REMEDIATION)
    report = _map(_map(obj, "status"), contract.GPUNODE_REMEDIATION)
    key = contract.REMEDIATION_REQUESTED_AT
    reset_asks = {(e.get("gpu"), e.get(key)) for e in _list(asked, contract.REMEDIATION_RESETS) if isinstance(e, dict)}
    resets: list[ResetResult] = []
    for entry in _list(report, contract.REMEDIATION_RESETS):
        if not isinstance(entry, dict) or not isinstance(entry.get("gpu"), int):
            continue
        if (entry["gpu"], entry.get(key)) not in reset_asks:
            continue
        result = entry.get("result")
        at = _answer_time(entry)
        if result in (contract.RESET_SUCCEEDED, contract.RESET_FAILED) and at is not None:
            ok = result == contract.RESET_SUCCEEDED
            resets.append(ResetResult(entry["gpu"], ok, at, str(entry.get("message", ""))))
    validation_asks = {e.get(key) for e in _list(asked, contract.REMEDIATION_VALIDATIONS) if isinstance(e, dict)}
    validations: list[ValidationResult] = []
    for entry in _list(report, contract.REMEDIATION_VALIDATIONS):
        if not isinstance(entry, dict) or not isinstance(entry.get("passed"), bool):
            continue
        at = _answer_time(entry)
        if at is None or entry.get(key) not in validation_asks:
            continue
        gpus = [g for g in _list(entry, "gpus") if isinstance(g, int)]
        message = str(entry.get("message", ""))
        targets: list[int | None] = list(gpus) if gpus else [None]
        validations.extend(ValidationResult(g, entry["passed"], at, message) for g in targets)
    return tuple(resets), tuple(validations)


def _answer_time(entry: Mapping[str, Any]) -> float | None:
    finished = parse_epoch(entry.get("finishedAt"))
    requested = parse_epoch(entry.get(contract.REMEDIATION_REQUESTED_AT))
    if finished is None or requested is None:
        return None
    # An answer comes after its request (causality, whatever the clocks say).
    return max(finished, requested + 1e-6)


def _gpus_of_pod(
    pod: Mapping[str, Any], node: str, holders: Mapping[str, tuple[int, ...]] | None = None
) -> tuple[int, ...]:
    """The GPUs a pod holds: the kubelet's word where the node publishes it, else the assignment.

    The same rule as the engine's (:mod:`scheduler.engine.holders`): a drain
    of one GPU must wait for the pod the device manager really put there,
    not for the one gpuwarden meant for it.
    """
    meta = _meta(pod)
    if holders:
        uid = meta.get("uid")
        real = holders.get(uid) if isinstance(uid, str) and uid else None
        if real is None:
            real = holders.get(holder_key(str(meta.get("namespace") or "default"), str(meta.get("name") or "")))
        if real:
            return real
    annotations = _map(meta, "annotations")
    text = annotations.get(contract.ANNOTATION_GPU_ASSIGNMENT)
    # A MIG device is drained with the GPU it is carved from.
    decoded = decode_assignment(text, node=node, parents=True) if isinstance(text, str) else None
    return tuple(decoded or ())


def _stays(pod: Mapping[str, Any]) -> bool:
    """DaemonSet and mirror pods stay on a drained node (they belong to it)."""
    meta = _meta(pod)
    if _MIRROR in _map(meta, "annotations"):
        return True
    return any(isinstance(o, dict) and o.get("kind") == "DaemonSet" for o in _list(meta, "ownerReferences"))


def _holds_node(pod: Mapping[str, Any]) -> bool:
    return _map(pod, "status").get("phase") not in _TERMINAL


def pods_on(
    pods: Collection[Mapping[str, Any]],
    node: str,
    gpus: tuple[int, ...],
    holders: Mapping[str, tuple[int, ...]] | None = None,
) -> list[Mapping[str, Any]]:
    """Pods a drain of ``node`` (all of it when ``gpus`` is empty, else those GPUs) must see leave.

    ``holders`` is the node's kubelet mapping (:attr:`scheduler.engine.model.Node.kubelet_holders`).
    """
    out = []
    for pod in pods:
        if _map(pod, "spec").get("nodeName") != node or not _holds_node(pod) or _stays(pod):
            continue
        if gpus and not set(gpus).intersection(_gpus_of_pod(pod, node, holders)):
            continue
        out.append(pod)
    return out


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def observe(
    node_obj: Mapping[str, Any],
    gpunode: Mapping[str, Any] | None,
    pods: Collection[Mapping[str, Any]],
    record: NodeRecord,
    *,
    blocked: Mapping[str, str],
    driver: Sequence[Device] = (),
) -> Observations:
    """One node's observations (the breaker verdict is filled in by the controller).

    ``blocked`` maps a pod (``namespace/name``) to why its eviction was
    refused this cycle: the drain's blockers. ``driver`` are the node's
    devices that NVIDIA's DRA driver tainted for their health
    (:mod:`.driverhealth`): faults beside the conditions'.
    """
    engine_node = node_from_objects(node_obj, gpunode)
    gpus = tuple(GpuIdentity(g.index, g.uuid) for g in engine_node.gpus)
    faults = faults_from_conditions(engine_node.conditions, gpus, _fault_starts(gpunode))
    if driver:
        reported = {f.key for f in faults}
        faults += tuple(f for f in driver_faults(driver, gpus) if f.key not in reported)
    spec = _map(node_obj, "spec")
    taints = [t for t in _list(spec, "taints") if isinstance(t, dict)]
    drains: list[DrainProgress] = []
    name = engine_node.name
    for scope in record.scopes:
        if scope.state is not State.DRAINING:
            continue
        left = pods_on(pods, name, () if scope.scope.is_node else scope.gpus, engine_node.kubelet_holders)
        blockers = tuple(f"{_pod_key(p)}: {blocked[_pod_key(p)]}" for p in left if _pod_key(p) in blocked)
        drains.append(DrainProgress(scope.scope.key, len(left), blockers))
    resets, validations = agent_answers(gpunode)
    cleared = _map(_meta(node_obj), "annotations").get(contract.ANNOTATION_ESCALATION_CLEARED)
    return Observations(
        node=name,
        pool=engine_node.pool,
        gpus=gpus,
        faults=faults,
        unschedulable=spec.get("unschedulable") is True,
        quarantine_taint=any(t.get("key") == contract.TAINT_QUARANTINE for t in taints),
        drains=tuple(drains),
        resets=resets,
        validations=validations,
        escalation_cleared=cleared if isinstance(cleared, str) else None,
    )


# --------------------------------------------------------------------------
# The controller
# --------------------------------------------------------------------------


@dataclass
class RemediationReport:
    """What one pass did, for logs, metrics and tests.

    ``before`` is each node's record as the pass found it, ``transitions``
    what the machine made of it; ``pools`` maps each node to its pool and
    ``breaker_held`` names the nodes whose new quarantine the breaker held.
    """

    transitions: dict[str, Transition] = field(default_factory=dict)
    before: dict[str, NodeRecord] = field(default_factory=dict)
    pools: dict[str, str] = field(default_factory=dict)
    breaker_held: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    evicted: int = 0
    finished_at: float = 0.0
    # The nodes this pass observed (converted and advanced); every other
    # node was quiet and unchanged, and its last transition stands.
    observed: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Seen:
    """A node as the controller last read it, kept until its Node or GPUNode changes.

    ``versions`` are the two objects' resourceVersions and the node's driver-tainted devices; ``pool``, ``out``
    and ``draining`` its part in the breaker's pool counts. ``quiet`` is set
    when the last pass found nothing to do and nothing to remember (no
    record, no fault, no step, no patch): with the same objects the next
    pass would find the same, so the node is not observed again until one
    of them changes.
    """

    versions: tuple[object, object, object]
    record: DecodedRecord
    pool: str
    out: bool
    draining: bool
    quiet: Transition | None = None


Poster = Callable[[str, bytes, float], None]


# Escalation calls that may still run at once, those abandoned past their
# timeout included; beyond it a call fails at once instead of adding a thread.
_WEBHOOK_CALLS = threading.BoundedSemaphore(2)


def _post(url: str, body: bytes, timeout: float) -> None:
    """POST ``body`` to ``url``; raises TimeoutError when the whole call takes longer than ``timeout``.

    urllib's timeout bounds each socket operation, not the call: a server
    that answers a byte every few seconds would hold the remediation pass
    (and fail the scheduler's liveness) for as long as it likes. The request
    runs on a daemon thread the pass waits for at most ``timeout``; one it
    gives up on ends by itself at urllib's per-operation timeout.
    """
    if not _WEBHOOK_CALLS.acquire(blocking=False):
        raise TimeoutError("earlier escalation webhook calls are still hanging past their timeout")
    done = threading.Event()
    failed: list[BaseException] = []

    def call() -> None:
        try:
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                reply.read()
        except BaseException as exc:  # handed to the waiting pass
            failed.append(exc)
        finally:
            done.set()
            _WEBHOOK_CALLS.release()

    threading.Thread(target=call, name="escalation-webhook", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no complete answer within {timeout:g}s")
    if failed:
        raise failed[0]


class RemediationController:
    """Advances every node's remediation once per call; one per scheduler (leader only)."""

    def __init__(
        self,
        api: KubeApi,
        evictor: Evictor,
        settings: ControllerSettings | None = None,
        *,
        clock: Callable[[], float] | None = None,
        post: Poster = _post,
    ) -> None:
        self._api = api
        self._evictor = evictor
        self.settings = settings or ControllerSettings()
        self._clock = clock or time.time
        self._post = post
        # Called with each pass's report (the metrics keep the latest).
        self.on_report: Callable[[RemediationReport], None] | None = None
        # Pods whose eviction was refused, with why (from this controller's
        # drains and from the scheduling cycle's), as the drains' blockers.
        self._blocked: dict[str, str] = {}
        # The Node each of this controller's patches returned, until the
        # watched view catches up with it (see the module docstring).
        self._written: dict[str, Mapping[str, Any]] = {}
        # Every node as last read (see _Seen), and the breaker's pool counts
        # kept from them: per pool, its members, those out and those draining.
        self._seen: dict[str, _Seen] = {}
        self._members: dict[str, tuple[set[str], set[str], set[str]]] = {}
        # Whether the last pass left every node quiet (see at_rest); False until a pass ran.
        self._all_quiet = False

    def at_rest(self) -> bool:
        """Whether a pass over a view in which no Node or GPUNode changed would do nothing.

        True when the last pass left every node quiet (no record, no fault,
        no step: nothing timed), no write of its own waits for the view, and
        no refused eviction waits to be read. Such a pass would only confirm
        each node's last reading; the worker skips it (:mod:`.worker`), so a
        healthy cluster costs remediation nothing per cycle, not even a walk
        over its nodes.
        """
        return self._all_quiet and not self._written and not self._blocked

    def note_refusals(self, refused: Mapping[str, str]) -> None:
        """Evictions the scheduling cycle saw refused this cycle (pod key -> why)."""
        self._blocked.update(refused)

    def run(
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        gpunodes: Mapping[str, Mapping[str, Any]],
        pods: Collection[Mapping[str, Any]],
        driver: Mapping[str, Sequence[Device]] | None = None,
    ) -> RemediationReport:
        """One pass over every node that changed or has work in hand; never raises for one node's trouble.

        ``driver``: per node, its devices that NVIDIA's DRA driver tainted
        for their health (:class:`~.driverhealth.DriverTaints`); a node whose
        taints changed is observed again as if its Node had.

        A healthy cluster is almost all quiet nodes, and a pass runs after
        every scheduling cycle: converting and advancing each of them again
        would cost the scheduling loop more than scheduling does. A quiet
        node is observed again when its Node or GPUNode changes (a new
        condition, a person's cordon, the agent's report); every other node,
        one with a record, a fault or steps, is observed on every pass, so
        its timers run as before.
        """
        now = self._clock()
        report = RemediationReport()
        blocked, self._blocked = self._blocked, {}
        nodes = self._caught_up(nodes)
        driver = driver or {}
        self._refresh(nodes, gpunodes, driver)
        pools = {
            pool: PoolStatus(pool, frozenset(members), frozenset(out), frozenset(draining))
            for pool, (members, out, draining) in self._members.items()
        }
        patches: list[tuple[str, JSON, Mapping[str, Any]]] = []
        for name in sorted(nodes):
            seen = self._seen[name]
            if seen.quiet is not None:
                report.before[name] = seen.record.record
                report.pools[name] = seen.pool
                report.transitions[name] = seen.quiet
                continue
            node_obj = nodes[name]
            decoded = seen.record
            report.observed.append(name)
            if decoded.error is not None:
                warn.warning(
                    "remediation_record_unreadable", ("record", name, decoded.error), node=name, error=decoded.error
                )
            try:
                obs = observe(
                    node_obj, gpunodes.get(name), pods, decoded.record, blocked=blocked, driver=driver.get(name, ())
                )
                status = pools[obs.pool]
                judged = verdict(self.settings.machine.breaker, status, name)
                obs = _with_verdict(obs, judged)
                transition = advance(decoded.record, obs, now, self.settings.machine)
                report.before[name] = decoded.record
                report.pools[name] = obs.pool
                if not judged.quarantine_allowed and transition.record.hold is not None:
                    report.breaker_held.add(name)
                patch = self._carry_out(
                    name,
                    node_obj=node_obj,
                    gpunode=gpunodes.get(name),
                    pods=pods,
                    transition=transition,
                    now=now,
                    report=report,
                )
                if patch:
                    patches.append((name, patch, node_obj))
                elif (
                    decoded.error is None
                    and not obs.faults
                    and not transition.steps
                    and transition.record == decoded.record == NodeRecord()
                ):
                    self._seen[name] = replace(seen, quiet=transition)
                pools[obs.pool] = _after(status, name, transition.record)
                report.transitions[name] = transition
            except LeaseLostError:
                raise  # no write of this pass may leave: the runner drops everything
            except ApiError as err:
                report.errors.append(f"{name}: {err}")
                log.warning("remediation_step_failed", node=name, status=err.status, error=err.detail)
            except Exception:  # one node's bad data must not stop the others
                report.errors.append(f"{name}: unexpected error")
                log.exception("remediation_node_failed", node=name)
        self._patch_nodes(patches, report)
        self._all_quiet = all(self._seen[name].quiet is not None for name in report.observed if name in self._seen)
        report.finished_at = self._clock()
        if self.on_report is not None:
            self.on_report(report)
        return report

    def _caught_up(self, nodes: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
        """``nodes`` with each Node this controller wrote since the view last had it put back."""
        if not self._written:
            return nodes
        out = dict(nodes)
        for name, written in list(self._written.items()):
            seen = nodes.get(name)
            if seen is not None and _older(seen, written):
                out[name] = written
            else:
                # The view has our write or a later one (or the Node is gone).
                del self._written[name]
        return out

    # -- what changed, and the breaker's view ---------------------------------

    def _refresh(
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        gpunodes: Mapping[str, Mapping[str, Any]],
        driver: Mapping[str, Sequence[Device]],
    ) -> None:
        """Read again each node whose Node, GPUNode or driver taints changed since the last pass; drop the deleted."""
        for name in [n for n in self._seen if n not in nodes]:
            self._leave(name, self._seen.pop(name))
        for name, obj in nodes.items():
            versions = (
                _meta(obj).get("resourceVersion"),
                _meta(gpunodes.get(name) or {}).get("resourceVersion"),
                tuple(driver.get(name, ())),
            )
            seen = self._seen.get(name)
            if seen is not None and seen.versions == versions and versions[0]:
                continue
            if seen is not None:
                self._leave(name, seen)
            decoded = decode_record(_map(_meta(obj), "annotations").get(contract.ANNOTATION_REMEDIATION_STATE))
            engine_node = node_from_objects(obj, None)
            record = decoded.record
            unschedulable = _map(obj, "spec").get("unschedulable") is True
            ready = engine_node.schedulable or unschedulable
            seen = _Seen(
                versions=versions,
                record=decoded,
                pool=engine_node.pool,
                out=is_out(unschedulable=unschedulable, ready=ready, remediating=bool(record.scopes)),
                draining=any(s.state is State.DRAINING and not s.dry_run for s in record.scopes),
            )
            self._seen[name] = seen
            members, out, draining = self._members.setdefault(seen.pool, (set(), set(), set()))
            members.add(name)
            if seen.out:
                out.add(name)
            if seen.draining:
                draining.add(name)

    def _leave(self, name: str, seen: _Seen) -> None:
        """Take a node's old reading out of the pool counts."""
        sets = self._members.get(seen.pool)
        if sets is None:
            return
        for names in sets:
            names.discard(name)
        if not sets[0]:
            del self._members[seen.pool]

    # -- carrying out ---------------------------------------------------------

    def _carry_out(
        self,
        name: str,
        *,
        node_obj: Mapping[str, Any],
        gpunode: Mapping[str, Any] | None,
        pods: Collection[Mapping[str, Any]],
        transition: Transition,
        now: float,
        report: RemediationReport,
    ) -> JSON:
        """Carry out a transition's steps but the Node patch, which it returns (empty: none)."""
        steps = transition.steps
        meta = _map(node_obj, "metadata")
        labels = dict(_map(meta, "labels"))
        annotations = dict(_map(meta, "annotations"))
        spec = _map(node_obj, "spec")
        taints = [dict(t) for t in _list(spec, "taints") if isinstance(t, dict)]
        patch_meta: dict[str, Any] = {"labels": {}, "annotations": {}}
        patch_spec: dict[str, Any] = {}

        cordon = next((s for s in steps if isinstance(s, Cordon)), None)
        release = any(isinstance(s, Uncordon | StopManaging) for s in steps)
        ours = [t for t in taints if t.get("key") == contract.TAINT_QUARANTINE]
        if cordon is not None:
            if spec.get("unschedulable") is not True:
                patch_spec["unschedulable"] = True
            if not ours:
                taint = {
                    "key": contract.TAINT_QUARANTINE,
                    "effect": "NoSchedule",
                    "timeAdded": _time(cordon.time_added),
                }
                patch_spec["taints"] = [*taints, taint]
        elif release:
            if ours:
                patch_spec["taints"] = [t for t in taints if t.get("key") != contract.TAINT_QUARANTINE] or None
            if any(isinstance(s, Uncordon) for s in steps) and spec.get("unschedulable") is True:
                patch_spec["unschedulable"] = None

        for step in steps:
            if isinstance(step, Escalate):
                patch_meta["labels"][contract.LABEL_REPAIR_NEEDED] = step.need.value
                if contract.ANNOTATION_ESCALATION_CLEARED in annotations:
                    patch_meta["annotations"][contract.ANNOTATION_ESCALATION_CLEARED] = None
                self._call_webhook(name, step)
            elif isinstance(step, ClearEscalation | StopManaging):
                if contract.LABEL_REPAIR_NEEDED in labels:
                    patch_meta["labels"][contract.LABEL_REPAIR_NEEDED] = None
                if isinstance(step, ClearEscalation) and contract.ANNOTATION_ESCALATION_CLEARED in annotations:
                    patch_meta["annotations"][contract.ANNOTATION_ESCALATION_CLEARED] = None

        # The fences placement reads, derived from this cycle's holds.
        fenced = sorted({s.gpu_index for s in steps if isinstance(s, QuarantineGpu)})
        drain_node = any(isinstance(s, Drain) and s.scope.is_node for s in steps)
        _set(
            patch_meta["annotations"],
            annotations,
            contract.ANNOTATION_QUARANTINED_GPUS,
            ",".join(map(str, fenced)) or None,
        )
        _set(patch_meta["annotations"], annotations, contract.ANNOTATION_DRAINING, "true" if drain_node else None)
        if transition.persist:
            _set(
                patch_meta["annotations"],
                annotations,
                contract.ANNOTATION_REMEDIATION_STATE,
                _encoded(transition.record),
            )
            _set(patch_meta["labels"], labels, contract.LABEL_REMEDIATION_STATE, transition.label)

        patch: JSON = {}
        meta_patch = {k: v for k, v in patch_meta.items() if v}
        if meta_patch or patch_spec:
            # Decided from this version of the Node: a Node changed since (by
            # another replica that took the lease over, or by whoever edits
            # its taints, which the patch replaces whole) refuses it with 409,
            # and the next pass decides again from the current one.
            version = meta.get("resourceVersion")
            if isinstance(version, str) and version:
                meta_patch["resourceVersion"] = version
        if meta_patch:
            patch["metadata"] = meta_patch
        if patch_spec:
            patch["spec"] = patch_spec
        self._request_agent(name, gpunode, steps)
        drains = [s for s in steps if isinstance(s, Drain)]
        if any(s.scope.is_node for s in drains):
            # The node's drain takes every pod; its GPUs' drains add nothing.
            drains = [s for s in drains if s.scope.is_node]
        holders = node_from_objects(node_obj, gpunode).kubelet_holders if drains else None
        taken: set[str] = set()  # a pod on two draining GPUs is evicted once
        for step in drains:
            report.evicted += self._drain(name, pods, step, now, holders=holders, taken=taken)
        for step in steps:
            if isinstance(step, EmitEvent):
                self._event(name, meta, step)
        return patch

    def _patch_nodes(self, patches: Sequence[tuple[str, JSON, Mapping[str, Any]]], report: RemediationReport) -> None:
        """Send the pass's Node patches (labels, annotations, cordon) concurrently, after every other step.

        Each node's patch still comes after that node's own drains, Events
        and agent requests, as when it was sent at the end of its turn. A
        patch refused because the Node changed since it was decided is sent
        once more when the change is not one the decision read (see
        :meth:`_rebased`). A patch that fails leaves the node's record as it
        was, so the next pass decides its transition again; this pass does
        not report it.
        """

        def one(item: tuple[str, JSON, Mapping[str, Any]]) -> tuple[str, Mapping[str, Any] | Exception]:
            name, patch, decided_from = item
            try:
                try:
                    return name, self._api.patch_node(name, patch)
                except ApiError as err:
                    rebased = self._rebased(name, patch, decided_from) if err.status == 409 else None
                    if rebased is None:
                        raise
                    log.info("remediation_patch_rebased", node=name, why="the Node's status changed meanwhile")
                    return name, self._api.patch_node(name, rebased)
            except Exception as err:  # one node's failure must not lose the others' results
                return name, err

        if len(patches) <= 1:
            results = [one(item) for item in patches]
        else:
            with ThreadPoolExecutor(min(NODE_PATCH_WORKERS, len(patches)), thread_name_prefix="remediation") as pool:
                results = list(pool.map(one, patches))
        fenced = next((outcome for _, outcome in results if isinstance(outcome, LeaseLostError)), None)
        if fenced is not None:
            raise fenced
        for name, outcome in results:
            if isinstance(outcome, ApiError):
                report.errors.append(f"{name}: {outcome}")
                report.transitions.pop(name, None)
                log.warning("remediation_step_failed", node=name, status=outcome.status, error=outcome.detail)
            elif isinstance(outcome, Exception):
                report.errors.append(f"{name}: unexpected error")
                report.transitions.pop(name, None)
                log.error("remediation_node_failed", node=name, error=f"{type(outcome).__name__}: {outcome}")
            else:
                self._written[name] = outcome

    def _rebased(self, name: str, patch: JSON, decided_from: Mapping[str, Any]) -> JSON | None:
        """``patch`` against the Node as it is now, when only what the decision did not read changed; else None.

        The patch carries the resourceVersion it was decided from, so that a
        record, cordon or taint written meanwhile by someone else (a person,
        a replica that took the lease) is never overwritten. But most
        conflicts are the agent's own status write: the fault that started
        this transition is raised by a condition, and the agent's next status
        write (a reset answered, a heartbeat) can land between the pass's
        read and its patch. The steps of the transition (the agent's reset
        request, drains, Events) have gone out by then, so dropping its
        record would lose what was done: a GPU reset and returned with no
        quarantine on record, its reset count for escalation gone. When
        labels, annotations and spec are as they were, the patch is sent
        once more against the current version.
        """
        current = self._api.get_node(name)
        if current is None or _decision_basis(current) != _decision_basis(decided_from):
            return None
        version = _meta(current).get("resourceVersion")
        if not isinstance(version, str) or not version:
            return None
        meta = dict(_map(patch, "metadata"))
        meta["resourceVersion"] = version
        return {**patch, "metadata": meta}

    def _request_agent(self, name: str, gpunode: Mapping[str, Any] | None, steps: Sequence[Step]) -> None:
        """Make GPUNode spec.remediation list exactly this cycle's reset and validation holds."""
        resets = [
            {"gpu": s.gpu_index, "uuid": s.gpu_uuid, contract.REMEDIATION_REQUESTED_AT: request_time(s.requested_at)}
            for s in steps
            if isinstance(s, RequestGpuReset)
        ]
        validations = [
            {
                "gpus": list(s.gpus) if not s.scope.is_node else [],
                contract.REMEDIATION_REQUESTED_AT: request_time(s.requested_at),
            }
            for s in steps
            if isinstance(s, RequestValidation)
        ]
        current = _map(_map(gpunode or {}, "spec"), contract.GPUNODE_REMEDIATION)
        wanted = {contract.REMEDIATION_RESETS: resets, contract.REMEDIATION_VALIDATIONS: validations}
        shown = {k: _list(current, k) for k in wanted}
        if shown == wanted:
            return
        if gpunode is None:
            if resets or validations:
                log.warning("remediation_no_gpunode", node=name, why="the agent cannot be asked to reset or validate")
            return
        # No resourceVersion precondition here, unlike the Node patch: the
        # agent writes the GPUNode's status every few polls, and each write
        # would make this request fail. A stale replica's request is fenced
        # in the process; the agent never resets a GPU that runs work.
        self._api.patch_gpunode(name, {"spec": {contract.GPUNODE_REMEDIATION: wanted}})

    def _drain(
        self,
        name: str,
        pods: Collection[Mapping[str, Any]],
        step: Drain,
        now: float,
        *,
        holders: Mapping[str, tuple[int, ...]] | None,
        taken: set[str],
    ) -> int:
        """Evict what no gpuwarden action evicts from a drained node or GPU, by namespace policy.

        gpuwarden's own pods are the engine's health eviction's (gang-aware,
        budgeted). The rest (other schedulers' pods, bare pods) only this
        drain moves. On one GPU those are the pods the kubelet reports there
        (``holders``, the GPUNode's mapping): such a pod carries no
        assignment of gpuwarden's, so without the kubelet's word nothing
        names it, and the GPU's drain would wait on it for ever. ``taken``
        holds the pods an earlier drain of this pass already evicts or deletes (a
        pod on two draining GPUs); the ones this drain moves are added.
        """
        policies = self.settings.machine.drain
        evictions: list[Eviction] = []
        deletions: list[Mapping[str, Any]] = []
        if step.scope.is_node:
            reason = f"node {name} is drained by remediation"
        else:
            reason = f"GPU {step.scope.gpu_index} of node {name} is drained by remediation"
        for pod in pods_on(pods, name, step.gpus, holders):
            spec = _map(pod, "spec")
            if spec.get("schedulerName") == contract.SCHEDULER_NAME:
                continue  # the engine's health eviction takes these, gang-aware
            meta = _meta(pod)
            if meta.get("deletionTimestamp") or _pod_key(pod) in taken:
                continue
            namespace = str(meta.get("namespace") or "default")
            action = policies.for_namespace(namespace).pod_action(now - step.started_at)
            if action is PodDrainAction.WAIT:
                continue  # another GPU's drain, begun earlier, may be past the policy's timeout
            taken.add(_pod_key(pod))
            if action is PodDrainAction.DELETE:
                deletions.append(pod)
                continue
            evictions.append(
                Eviction(
                    job=f"{namespace}/{meta.get('name')}",
                    namespace=namespace,
                    pod=str(meta.get("name")),
                    uid=str(meta.get("uid") or ""),
                    node=name,
                    action=EvictionAction.REMEDIATION_DRAIN,
                    reason=reason,
                )
            )
        done = 0
        for result in self._evictor.evict_all(evictions):
            if result.outcome is EvictOutcome.REFUSED:
                self._blocked[f"{result.eviction.namespace}/{result.eviction.pod}"] = result.error or "refused"
            elif result.ok:
                done += 1
        for pod in deletions:
            meta = _meta(pod)
            try:
                self._api.delete_pod(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid") or ""))
                done += 1
                log.info(
                    "remediation_pod_deleted", node=name, pod=_pod_key(pod), why="drain policy delete-after-timeout"
                )
            except ApiError as err:
                if err.status == 403:
                    # The admission policy: the namespace is not labelled for
                    # deletes. The drain waits on it, shown as a blocked pod.
                    self._blocked[_pod_key(pod)] = f"delete refused: {err.detail}"
                if err.status != 404:
                    log.warning("remediation_delete_failed", node=name, pod=_pod_key(pod), error=err.detail)
        return done

    def _event(self, name: str, meta: Mapping[str, Any], step: EmitEvent) -> None:
        stamp = _time(self._clock())
        digest = hashlib.sha256(f"{name}\x1f{step.reason}\x1f{step.message}\x1f{stamp}".encode()).hexdigest()[:10]
        involved: JSON = {"apiVersion": "v1", "kind": "Node", "name": name}
        if meta.get("uid"):
            involved["uid"] = meta["uid"]
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name[:200]}.{digest}", "namespace": "default"},
            "involvedObject": involved,
            "type": step.type.value,
            "reason": step.reason.value,
            "message": step.message[:1024],
            "source": {"component": contract.SCHEDULER_COMPONENT},
            "reportingComponent": contract.SCHEDULER_COMPONENT,
            "reportingInstance": contract.SCHEDULER_COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._api.create_event("default", body)
        except ApiError as err:
            if err.status != 409:
                log.warning("remediation_event_failed", node=name, reason=step.reason.value, error=err.detail)

    def _call_webhook(self, name: str, step: Escalate) -> None:
        url = self.settings.webhook_url
        if not url:
            return
        # Calling people is acting on the pass's decisions: a replica that may have lost the lease does not.
        self._api.check_write("escalation_webhook")
        try:
            self._post(url, json.dumps(step.payload(), sort_keys=True).encode(), self.settings.webhook_timeout_s)
            log.info("escalation_webhook_called", node=name, need=step.need.value)
        except Exception as exc:  # any transport failure: the Event and label still stand
            log.warning("escalation_webhook_failed", node=name, url=url, error=f"{type(exc).__name__}: {exc}")


def _resource_version(obj: Mapping[str, Any]) -> int | None:
    version = _meta(obj).get("resourceVersion")
    return int(version) if isinstance(version, str) and version.isascii() and version.isdigit() else None


def _decision_basis(node: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a Node a transition reads that another writer may also write: everything but its status."""
    meta = _map(node, "metadata")
    return (dict(_map(meta, "labels")), dict(_map(meta, "annotations")), dict(_map(node, "spec")))


def _older(seen: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether ``seen`` is a version of the Node from before ``written``.

    resourceVersions are opaque to clients in general; the API server's etcd
    storage numbers them in write order, and one that does not read as such
    a number is taken as current (the view wins, as it did before).
    """
    a, b = _resource_version(seen), _resource_version(written)
    return a is not None and b is not None and a < b


def _set(patch: dict[str, Any], current: Mapping[str, Any], key: str, value: str | None) -> None:
    """Patch ``key`` to ``value`` (None removes it) only where it differs."""
    if current.get(key) != value:
        patch[key] = value


def _encoded(record: NodeRecord) -> str | None:
    """The annotation for ``record``; None (removed) once nothing is left to remember."""
    if (
        not record.scopes
        and not record.history
        and record.unmanaged_since is None
        and not record.suppressed
        and record.hold is None
    ):
        return None
    return encode_record(record)


def _with_verdict(obs: Observations, breaker: BreakerVerdict) -> Observations:
    return replace(obs, breaker=breaker)


def _after(status: PoolStatus, name: str, record: NodeRecord) -> PoolStatus:
    """The pool as the next node's verdict must see it, after this node's transition."""
    if any(s.state is State.DRAINING and not s.dry_run for s in record.scopes):
        return status.with_draining(name)
    if record.scopes:
        return status.with_out(name)
    return status
