"""DeviceTaintRules for the GPUs remediation quarantined, so that every DRA-aware scheduler keeps off them.

A GPU quarantined one by one is fenced for gpuwarden's placement by the
Node's ``gpuwarden.io/quarantined-gpus`` annotation, which no other
scheduler reads. On a node where NVIDIA's DRA driver publishes the GPUs
(driver ``gpu.nvidia.com``, a pool named after the node, a device per GPU
and per MIG device, each with its ``uuid``), the Kubernetes way to say "no
new claims here" is a device taint, and a ``DeviceTaintRule`` is how
someone other than the driver puts one on a device: kube-scheduler's
allocator (and KAI's, and any allocator built on the upstream one) skips a
tainted device unless the claim tolerates the taint.

So for every GPU that the annotation names, this publisher keeps one rule:
effect ``NoSchedule``, key ``gpuwarden.io/quarantined``, the reason as its
value (``xid-79``, or the fault's reason), selecting that device of that
node's pool by name, and one more per MIG device carved from that GPU. The
rule goes when the annotation no longer names the GPU, which remediation
writes only after the GPU validated (or when a person takes the node out
of remediation). It is derived from the annotation, not from the steps of a
pass, so a restarted scheduler, a rule deleted by hand, or a driver that
publishes its slice after the quarantine began all end in the same rules.

What the rule does not do:

* ``NoSchedule`` keeps new claims off the device; pods that hold it are left
  to remediation's drain, which goes through the Eviction API, gang-aware,
  as on any node. ``NoExecute`` would have the device-taint eviction
  controller delete those pods without asking any PodDisruptionBudget,
  which is why gpuwarden writes it only when the remediation config asks
  for it (``device_taint_effect``, :class:`~.policy.DeviceTaintEffect`) and
  the admission policy's component allows it.
* The driver's own taints (``gpu.nvidia.com/xid``, ``gpu.nvidia.com/gpu-lost``)
  live in its ResourceSlice and stay until the driver's plugin restarts; a
  rule can add a taint, not remove one. A GPU that gpuwarden returns after
  validation therefore stays out for DRA claims while the driver's taint
  stands; a reboot (gpuwarden's node repair) restarts the plugin.
* A GPU whose device cannot be told (no GPUNode UUID or PCI address that
  matches a device of the driver's slices) gets no rule: tainting a guessed
  device would take a healthy GPU out and leave the sick one in.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwarden import contract
from gpuwarden.dra import Device, devices_by_node, pci_bus
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.convert import quarantined_indices
from scheduler.remediation.model import decode_record
from scheduler.remediation.policy import DeviceTaintEffect

log = get_logger(__name__)

MANAGER = contract.SCHEDULER_COMPONENT  # the label value the admission policy checks
NAME_PREFIX = "gpuwarden-quarantine-"
EFFECT = DeviceTaintEffect.NO_SCHEDULE
# What a taint's value may hold (a label value): 63 characters, alphanumerics at both ends.
_VALUE_MAX = 63
_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME_MAX = 253
# How soon a sync that could not write everything is tried again without a new change.
RETRY_S = 10.0


@dataclass(frozen=True, slots=True)
class Wanted:
    """One rule this publisher keeps: the device it taints, why, and the GPU (node and index) it stands for."""

    node: str
    gpu_index: int
    device: Device
    value: str
    effect: DeviceTaintEffect = EFFECT

    @property
    def name(self) -> str:
        return rule_name(self.device)

    def body(self) -> JSON:
        return {
            "apiVersion": f"{contract.DRA_API_GROUP}/{contract.DRA_API_VERSION}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": self.name,
                "labels": {contract.LABEL_MANAGED_BY: MANAGER},
                "annotations": {contract.ANNOTATION_DEVICE_TAINT_GPU: f"{self.node}/{self.gpu_index}"},
            },
            "spec": {
                "deviceSelector": {"driver": self.device.driver, "pool": self.device.pool, "device": self.device.name},
                "taint": {"key": contract.TAINT_QUARANTINE, "value": self.value, "effect": str(self.effect)},
            },
        }


@dataclass
class DeviceTaintReport:
    """What one sync did: rules created, replaced and deleted (by name), and the writes that failed."""

    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # GPUs quarantined on a node with the driver's devices, for which no device matched ("node/index").
    unmatched: list[str] = field(default_factory=list)
    # Rules left in place although not worked out now: their GPU is still out (see sync).
    kept: list[str] = field(default_factory=list)


def rule_name(device: Device) -> str:
    """The rule's name: readable where it fits an object name, else its start and a digest of the whole."""
    name = f"{NAME_PREFIX}{device.pool}.{device.name}".lower()
    name = re.sub(r"[^a-z0-9.-]+", "-", name)
    if len(name) <= _NAME_MAX and name[-1].isalnum():
        return name
    digest = hashlib.sha256(f"{device.driver}/{device.pool}/{device.name}".encode()).hexdigest()[:16]
    return f"{name[: _NAME_MAX - 17].rstrip('.-')}-{digest}"


def taint_value(text: str) -> str:
    """``text`` as a taint's value (a label value), or ``quarantined`` when nothing of it fits."""
    value = _VALUE_BAD.sub("-", text)[:_VALUE_MAX].strip("-_.")
    return value or "quarantined"


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _gpu_identities(gpunode: Mapping[str, Any] | None) -> dict[int, tuple[str, str]]:
    """Each GPU's (UUID, PCI address) by index, as the agent published them."""
    status = gpunode.get("status") if gpunode is not None else None
    gpus = status.get("gpus") if isinstance(status, dict) else None
    found: dict[int, tuple[str, str]] = {}
    for entry in gpus if isinstance(gpus, list) else ():
        if not isinstance(entry, dict):
            continue
        index = entry.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            found[index] = (_str(entry.get("uuid")), _str(entry.get("pciBusId")))
    return found


def _from_record(annotations: Mapping[str, Any]) -> dict[int, tuple[str, str]]:
    """Why each GPU is out and its UUID, from the remediation record (the XID when the fault has one)."""
    decoded = decode_record(_str(annotations.get(contract.ANNOTATION_REMEDIATION_STATE)) or None)
    found: dict[int, tuple[str, str]] = {}
    for scope in decoded.record.scopes:
        fault = scope.fault
        why = f"xid-{fault.xid}" if fault.xid is not None else (fault.reason or fault.condition)
        for index in (*scope.fenced_gpus, *scope.gpus):
            uuid = (
                fault.gpu_uuid
                if fault.gpu_index == index
                else scope.scope.gpu_uuid
                if scope.scope.gpu_index == index
                else ""
            )
            found.setdefault(index, (why, uuid))
    return found


def quarantined(
    nodes: Mapping[str, Mapping[str, Any]], gpunodes: Mapping[str, Mapping[str, Any]]
) -> dict[str, frozenset[int]]:
    """The GPUs each node's annotation fences (a malformed one fences every GPU the GPUNode lists, as placement)."""
    out: dict[str, frozenset[int]] = {}
    for name, node in nodes.items():
        listed = _str(_annotations(node).get(contract.ANNOTATION_QUARANTINED_GPUS))
        if listed:
            fenced = quarantined_indices(listed)
            out[name] = fenced if fenced is not None else frozenset(_gpu_identities(gpunodes.get(name)))
    return out


def wanted_rules(
    nodes: Mapping[str, Mapping[str, Any]],
    gpunodes: Mapping[str, Mapping[str, Any]],
    devices: Mapping[str, list[Device]],
    report: DeviceTaintReport | None = None,
    fenced: Mapping[str, frozenset[int]] | None = None,
    *,
    effect: DeviceTaintEffect = EFFECT,
) -> dict[str, Wanted]:
    """The rules the quarantined GPUs of ``nodes`` call for, by name (see the module docstring).

    ``fenced`` is :func:`quarantined` of the same nodes, when the caller has it already.
    """
    if fenced is None:
        fenced = quarantined(nodes, gpunodes)
    wanted: dict[str, Wanted] = {}
    for name, on_node in devices.items():
        node = nodes.get(name)
        if node is None or name not in fenced or not on_node:
            continue  # gone, nothing quarantined, or no DRA devices of the driver on this node
        identities = _gpu_identities(gpunodes.get(name))
        recorded = _from_record(_annotations(node))
        for index in sorted(fenced[name]):
            why, recorded_uuid = recorded.get(index, ("quarantined", ""))
            uuid, bus = identities.get(index, ("", ""))
            uuid = uuid or recorded_uuid
            whole = [d for d in on_node if uuid and d.uuid == uuid]
            if not whole and bus:
                whole = [d for d in on_node if d.pci_bus and pci_bus(d.pci_bus) == pci_bus(bus) and not d.parent_uuid]
            gpu_uuid = whole[0].uuid if whole else uuid
            carved = [d for d in on_node if gpu_uuid and d.parent_uuid == gpu_uuid]
            if not whole and not carved:
                if report is not None:
                    report.unmatched.append(f"{name}/{index}")
                continue
            value = taint_value(why)
            for device in (*whole, *carved):
                rule = Wanted(name, index, device, value, effect)
                wanted[rule.name] = rule
    return wanted


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def _slice_node(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    return _str(spec.get("nodeName")) if isinstance(spec, dict) else ""


def _rule_gpu(rule: Mapping[str, Any]) -> tuple[str, int] | None:
    """The GPU (node, index) a rule of ours stands for, from its annotation; None if unreadable."""
    node, _, index = _str(_annotations(rule).get(contract.ANNOTATION_DEVICE_TAINT_GPU)).rpartition("/")
    return (node, int(index)) if node and index.isdigit() else None


def _ours(rule: Mapping[str, Any]) -> bool:
    meta = rule.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return isinstance(labels, dict) and labels.get(contract.LABEL_MANAGED_BY) == MANAGER


def _same(have: Mapping[str, Any], want: JSON) -> bool:
    """Whether the rule in place says what ``want`` says (its taint's ``timeAdded`` is the API server's)."""
    spec = have.get("spec")
    if not isinstance(spec, dict):
        return False
    taint = spec.get("taint")
    taint = {k: v for k, v in taint.items() if k != "timeAdded"} if isinstance(taint, dict) else None
    wanted_spec = want["spec"]
    return bool(spec.get("deviceSelector") == wanted_spec["deviceSelector"] and taint == wanted_spec["taint"])


class DeviceTaintPublisher:
    """Keeps gpuwarden's DeviceTaintRules equal to what the quarantined GPUs call for; one per term.

    The remediation worker syncs on a view in which a Node, a GPUNode, a
    ResourceSlice or a DeviceTaintRule changed, and :data:`RETRY_S` after
    a sync that could not write everything. A sync works the wanted rules
    out again (a look at each Node's annotation; only the slices of nodes
    that quarantined a GPU are read) and writes only the difference. A write refused
    because this replica lost its lease raises at the fence
    (:class:`~scheduler.cluster.fence.LeaseLostError`), as every write does.
    """

    def __init__(
        self, api: KubeApi, clock: Callable[[], float] = time.monotonic, effect: DeviceTaintEffect = EFFECT
    ) -> None:
        self._api = api
        self._clock = clock
        # NoSchedule unless the remediation config asks for NoExecute (see DeviceTaintEffect).
        self.effect = effect
        # When the last sync left a write undone (None: it wrote all it meant to).
        self._failed_at: float | None = None
        # What was last said in the log, so that it is said once, not on every sync.
        self._unknown_told = False
        self._unmatched_told: set[str] = set()

    @property
    def retry_due(self) -> bool:
        """Whether the last sync left a write undone and :data:`RETRY_S` went by since."""
        return self._failed_at is not None and self._clock() - self._failed_at >= RETRY_S

    def sync(
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        gpunodes: Mapping[str, Mapping[str, Any]],
        slices: Mapping[str, Mapping[str, Any]],
        rules: Mapping[str, Mapping[str, Any]],
        *,
        unknown: bool = False,
    ) -> DeviceTaintReport | None:
        """Write the difference between the rules in place and those the quarantined GPUs call for.

        ``unknown``: the slices or the rules could not be read (not served,
        as before Kubernetes 1.37; or refused): nothing is written, since an
        empty list there says nothing of what exists (returns None).

        A rule is deleted only when its GPU (``gpuwarden.io/gpu``) is no
        longer quarantined, or when another rule now covers that GPU: a GPU
        still out whose device cannot be told right now (the driver's slice
        gone while its plugin restarts, a pool half republished, the GPUNode
        not there) keeps the rule it has.
        """
        if unknown:
            if not self._unknown_told:
                log.warning("device_taints_unavailable", why="ResourceSlices or DeviceTaintRules cannot be read")
                self._unknown_told = True
            return None
        self._unknown_told = False
        report = DeviceTaintReport()
        fenced = quarantined(nodes, gpunodes)
        devices = devices_by_node(s for s in slices.values() if _slice_node(s) in fenced) if fenced else {}
        wanted = wanted_rules(nodes, gpunodes, devices, report, fenced, effect=self.effect) if devices else {}
        covered = {(rule.node, rule.gpu_index) for rule in wanted.values()}
        ours = {name: rule for name, rule in rules.items() if _ours(rule)}
        for name, rule in sorted(wanted.items()):
            body = rule.body()
            have = ours.get(name)
            if have is None and name in rules:
                report.errors.append(f"{name}: a DeviceTaintRule gpuwarden did not make has this name")
                continue
            try:
                if have is None:
                    self._api.create_device_taint_rule(body)
                    report.created.append(name)
                elif not _same(have, body):
                    meta = have.get("metadata")
                    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
                    if isinstance(version, str):
                        body["metadata"]["resourceVersion"] = version
                    self._api.replace_device_taint_rule(name, body)
                    report.replaced.append(name)
            except ApiError as err:
                if err.status == 409:
                    continue  # made or changed since this view was taken: the next view shows it
                report.errors.append(f"{name}: {err}")
        for name, have in sorted(ours.items()):
            if name in wanted:
                continue
            gpu = _rule_gpu(have)
            if gpu is not None and gpu[1] in fenced.get(gpu[0], ()) and gpu not in covered:
                report.kept.append(name)  # still out, its device not told now: keep what protects it
                continue
            meta = have.get("metadata")
            uid = meta.get("uid") if isinstance(meta, dict) else None
            try:
                self._api.delete_device_taint_rule(name, uid if isinstance(uid, str) else "")
                report.deleted.append(name)
            except ApiError as err:
                if err.status != 409:  # 409: replaced since; the next view shows the new one
                    report.errors.append(f"{name}: {err}")
        self._failed_at = self._clock() if report.errors else None
        if report.created or report.replaced or report.deleted:
            log.info(
                "device_taint_rules_written",
                created=report.created,
                replaced=report.replaced,
                deleted=report.deleted,
            )
        if report.errors:
            log.warning("device_taint_rules_failed", errors=report.errors)
        unmatched = set(report.unmatched)
        if unmatched - self._unmatched_told:
            log.warning(
                "quarantined_gpu_without_dra_device",
                gpus=sorted(unmatched),
                why="no device of the driver's slices has the GPU's UUID or PCI address: no DeviceTaintRule for it",
            )
        self._unmatched_told = unmatched
        return report
