"""A pod's placement rules, from its raw spec to the engine's :class:`Placement`.

Read here: required and preferred node affinity, pod affinity and
anti-affinity, topology spread constraints, host ports, and the requests
of every resource other than CPU, memory and whole GPUs (ephemeral storage,
hugepages, extended resources). The engine enforces them
(:mod:`scheduler.engine.rules`).

A rule that cannot be read is never dropped: a pod whose rule the scheduler
dropped would be bound where the rule forbids. It makes the pod
*unplaceable* with the reason, which its PodGroup then shows
(``UnsupportedPlacement``). The API server validates these fields, so in
practice that is a term gpuwarden cannot judge: a pod affinity whose
namespace selector has labels (namespaces are not watched), or a volume
claim that is not bound yet. An anti-affinity term with such a selector is
read as covering every namespace instead, which can only refuse more nodes.

A bound claim's volume that has node affinity (a local volume, a zonal
disk) joins the pod's required node terms (``volume_terms``), which is what
kube-scheduler's VolumeBinding filter checks for a bound claim. A claim
that is not bound (``WaitForFirstConsumer``, or not provisioned yet) would
need the scheduler to choose and bind a volume, which gpuwarden does not
do; such pods wait saying so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuwarden.contract import RESOURCE_NVIDIA_GPU
from gpuwarden.quantity import QuantityError, exact
from scheduler.engine.model import (
    HostPort,
    LabelSelector,
    NodeTerm,
    Placement,
    PodTerm,
    Requirement,
    SpreadConstraint,
)

# Resources the engine counts itself; every other one is an "other" resource.
_COUNTED = frozenset({"cpu", "memory", RESOURCE_NVIDIA_GPU})
_NODE_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
_MAX_WEIGHT = 100


class UnreadableError(Exception):
    """A placement field the scheduler cannot judge; the message says which."""


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """What :func:`read_placement` found: the rules, or why the pod cannot be placed."""

    placement: Placement | None
    unplaceable: str = ""


def _map(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnreadableError(f"{what} is not an object")
    return value


def _seq(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UnreadableError(f"{what} is not a list")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnreadableError(f"{what} is not a string")
    return value


def _requirements(raw: object, what: str, operators: frozenset[str]) -> tuple[Requirement, ...]:
    out: list[Requirement] = []
    for item in _seq(raw, what):
        entry = _map(item, what)
        operator = _text(entry.get("operator"), f"{what}.operator")
        if operator not in operators:
            raise UnreadableError(f"{what}: operator {operator!r} is not one Kubernetes knows")
        values = tuple(_text(v, f"{what}.values") for v in _seq(entry.get("values"), f"{what}.values"))
        out.append(Requirement(_text(entry.get("key"), f"{what}.key"), operator, values))
    return tuple(out)


def node_term(raw: object, what: str) -> NodeTerm:
    """One node selector term (matchExpressions over labels, matchFields over metadata.name)."""
    raw = _map(raw, what)
    fields = _requirements(raw.get("matchFields"), f"{what}.matchFields", _NODE_OPERATORS)
    for req in fields:
        if req.key != "metadata.name":
            raise UnreadableError(f"{what}.matchFields: field {req.key!r} (only metadata.name is defined)")
    return NodeTerm(_requirements(raw.get("matchExpressions"), f"{what}.matchExpressions", _NODE_OPERATORS), fields)


def node_terms(raw: object, what: str) -> tuple[NodeTerm, ...]:
    """A NodeSelector's terms (any one must hold)."""
    raw = _map(raw, what)
    return tuple(node_term(t, f"{what}.nodeSelectorTerms") for t in _seq(raw.get("nodeSelectorTerms"), what))


def label_selector(raw: object, what: str) -> LabelSelector | None:
    """A label selector; None for an absent one (which selects nothing)."""
    if raw is None:
        return None
    raw = _map(raw, what)
    labels = _map(raw.get("matchLabels"), f"{what}.matchLabels")
    pairs = tuple(sorted((_text(k, what), _text(v, f"{what}.matchLabels")) for k, v in labels.items()))
    expressions = _requirements(raw.get("matchExpressions"), f"{what}.matchExpressions", _LABEL_OPERATORS)
    return LabelSelector(pairs, expressions)


def _with_keys(
    selector: LabelSelector | None, keys: object, labels: Mapping[str, str], what: str
) -> LabelSelector | None:
    """``selector`` and the pod's own values of ``keys`` (matchLabelKeys); keys the pod lacks are ignored."""
    names = [_text(k, what) for k in _seq(keys, what)]
    if selector is None or not names:
        return selector
    extra = [(k, labels[k]) for k in names if k in labels]
    return LabelSelector(tuple(sorted({*selector.match_labels, *extra})), selector.expressions)


def _mismatch(
    selector: LabelSelector | None, keys: object, labels: Mapping[str, str], what: str
) -> LabelSelector | None:
    """``selector`` and NotIn the pod's own values of ``keys`` (mismatchLabelKeys)."""
    names = [_text(k, what) for k in _seq(keys, what)]
    if selector is None or not names:
        return selector
    extra = tuple(Requirement(k, "NotIn", (labels[k],)) for k in names if k in labels)
    return LabelSelector(selector.match_labels, selector.expressions + extra)


def pod_term(raw: object, what: str, labels: Mapping[str, str], *, anti: bool) -> PodTerm:
    raw = _map(raw, what)
    key = _text(raw.get("topologyKey"), f"{what}.topologyKey")
    if not key:
        raise UnreadableError(f"{what}: empty topologyKey")
    selector = label_selector(raw.get("labelSelector"), f"{what}.labelSelector")
    selector = _with_keys(selector, raw.get("matchLabelKeys"), labels, f"{what}.matchLabelKeys")
    selector = _mismatch(selector, raw.get("mismatchLabelKeys"), labels, f"{what}.mismatchLabelKeys")
    namespaces = tuple(sorted(_text(n, f"{what}.namespaces") for n in _seq(raw.get("namespaces"), what)))
    all_namespaces = False
    ns_selector = raw.get("namespaceSelector")
    if ns_selector is not None:
        parsed = label_selector(ns_selector, f"{what}.namespaceSelector")
        if parsed is not None and (parsed.match_labels or parsed.expressions):
            if not anti:
                raise UnreadableError(
                    f"{what}: a namespaceSelector with labels (namespaces' labels are not watched; "
                    "list the namespaces in `namespaces` instead)"
                )
            all_namespaces = True  # counts more pods: only ever stricter
        else:
            all_namespaces = True  # an empty namespace selector is every namespace
    return PodTerm(key, selector, namespaces, all_namespaces)


def _weighted(raw: object, what: str) -> tuple[int, dict[str, Any]]:
    entry = _map(raw, what)
    weight = entry.get("weight")
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= _MAX_WEIGHT:
        raise UnreadableError(f"{what}.weight must be 1-{_MAX_WEIGHT}")
    return weight, entry


def _pod_terms(
    raw: dict[str, Any], labels: Mapping[str, str], what: str, *, anti: bool
) -> tuple[tuple[PodTerm, ...], tuple[tuple[int, PodTerm], ...]]:
    required_what = f"{what}.requiredDuringSchedulingIgnoredDuringExecution"
    required = tuple(
        pod_term(t, required_what, labels, anti=anti)
        for t in _seq(raw.get("requiredDuringSchedulingIgnoredDuringExecution"), required_what)
    )
    preferred: list[tuple[int, PodTerm]] = []
    preferred_what = f"{what}.preferredDuringSchedulingIgnoredDuringExecution"
    for entry in _seq(raw.get("preferredDuringSchedulingIgnoredDuringExecution"), preferred_what):
        weight, body = _weighted(entry, preferred_what)
        # A preferred term is only scored: reading a labelled namespace
        # selector as every namespace misranks at worst, never misplaces.
        preferred.append((weight, pod_term(body.get("podAffinityTerm"), preferred_what, labels, anti=True)))
    return required, tuple(preferred)


def _spread(raw: object, labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    what = "spec.topologySpreadConstraints"
    out: list[SpreadConstraint] = []
    for item in _seq(raw, what):
        entry = _map(item, what)
        skew = entry.get("maxSkew")
        if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
            raise UnreadableError(f"{what}.maxSkew must be a positive integer")
        when = entry.get("whenUnsatisfiable")
        if when not in ("DoNotSchedule", "ScheduleAnyway"):
            raise UnreadableError(f"{what}.whenUnsatisfiable {when!r}")
        min_domains = entry.get("minDomains", 1)
        if min_domains is None:
            min_domains = 1
        if not isinstance(min_domains, int) or isinstance(min_domains, bool) or min_domains < 1:
            raise UnreadableError(f"{what}.minDomains must be a positive integer")
        affinity_policy = entry.get("nodeAffinityPolicy") or "Honor"
        taints_policy = entry.get("nodeTaintsPolicy") or "Ignore"
        if affinity_policy not in ("Honor", "Ignore") or taints_policy not in ("Honor", "Ignore"):
            raise UnreadableError(f"{what}: node inclusion policy {affinity_policy!r}/{taints_policy!r}")
        selector = label_selector(entry.get("labelSelector"), f"{what}.labelSelector")
        selector = _with_keys(selector, entry.get("matchLabelKeys"), labels, f"{what}.matchLabelKeys")
        out.append(
            SpreadConstraint(
                max_skew=skew,
                topology_key=_text(entry.get("topologyKey"), f"{what}.topologyKey"),
                hard=when == "DoNotSchedule",
                selector=selector,
                min_domains=min_domains if when == "DoNotSchedule" else 1,
                honor_affinity=affinity_policy == "Honor",
                honor_taints=taints_policy == "Honor",
            )
        )
    return tuple(out)


def _ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """Host ports of the containers and of the sidecars (init containers with ``restartPolicy: Always``).

    A one-shot init container's port is held only before the pod's
    containers start; kube-scheduler's NodePorts ignores it, on the
    incoming pod and on the pods already bound, and so does gpuwarden.
    """
    init = spec.get("initContainers")
    containers = spec.get("containers")
    if not init and isinstance(containers, list) and not any(isinstance(c, dict) and "ports" in c for c in containers):
        return ()  # the cache keeps only host ports, so most pods list none
    out: set[HostPort] = set()
    for kind in ("initContainers", "containers"):
        for container in _seq(spec.get(kind), f"spec.{kind}"):
            entry = _map(container, f"spec.{kind}")
            if kind == "initContainers" and entry.get("restartPolicy") != "Always":
                continue
            for item in _seq(entry.get("ports"), f"spec.{kind}.ports"):
                port = _map(item, f"spec.{kind}.ports")
                host = port.get("hostPort")
                if host is None or host == 0:
                    continue
                if not isinstance(host, int) or isinstance(host, bool) or not 0 < host < 65536:
                    raise UnreadableError(f"spec.{kind}.ports.hostPort {host!r}")
                out.add(HostPort(host, port.get("protocol") or "TCP", port.get("hostIP") or "0.0.0.0"))
    return tuple(sorted(out, key=lambda p: (p.port, p.protocol, p.ip)))


def read_placement(spec: Mapping[str, Any], labels: Mapping[str, str]) -> PodPlacement:
    """The pod's rules (None when it has none), or why they cannot be judged."""
    if spec.get("affinity") is None and spec.get("topologySpreadConstraints") is None:
        # Most pods carry no rules at all: read their host ports alone rather
        # than build every kind of rule to find it empty (every pod is read).
        try:
            ports = _ports(spec)
        except UnreadableError as why:
            return PodPlacement(None, str(why))
        return PodPlacement(Placement(ports=ports)) if ports else _NO_RULES
    try:
        affinity = _map(spec.get("affinity"), "spec.affinity")
        node = _map(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        terms = node_terms(required, "spec.affinity.nodeAffinity.required") if required is not None else ()
        if required is not None and not terms:
            raise UnreadableError("required node affinity with no term (matches no node)")
        preferred_what = "spec.affinity.nodeAffinity.preferred"
        preferred_nodes = []
        for entry in _seq(node.get("preferredDuringSchedulingIgnoredDuringExecution"), preferred_what):
            weight, body = _weighted(entry, preferred_what)
            preferred_nodes.append((weight, node_term(body.get("preference"), preferred_what)))
        pod_affinity, preferred_affinity = _pod_terms(
            _map(affinity.get("podAffinity"), "spec.affinity.podAffinity"), labels, "podAffinity", anti=False
        )
        anti, preferred_anti = _pod_terms(
            _map(affinity.get("podAntiAffinity"), "spec.affinity.podAntiAffinity"), labels, "podAntiAffinity", anti=True
        )
        placement = Placement(
            node_terms=terms,
            preferred_nodes=tuple(preferred_nodes),
            affinity=pod_affinity,
            anti_affinity=anti,
            preferred_affinity=preferred_affinity,
            preferred_anti_affinity=preferred_anti,
            spread=_spread(spec.get("topologySpreadConstraints"), labels),
            ports=_ports(spec),
        )
    except UnreadableError as why:
        return PodPlacement(None, str(why))
    return PodPlacement(placement if placement != _EMPTY else None)


_EMPTY = Placement()
_NO_RULES = PodPlacement(None)


def with_volume_terms(placement: Placement | None, terms: tuple[tuple[NodeTerm, ...], ...]) -> Placement | None:
    """``placement`` plus the node affinity of the pod's bound volumes."""
    if not terms:
        return placement
    # Every other field kept as it is (the nodes a job is kept off among them).
    return replace(placement or _EMPTY, volume_terms=terms)


# --------------------------------------------------------------------------
# Other resources
# --------------------------------------------------------------------------


def thousandths(raw: object, *, up: bool) -> int | None:
    """A quantity in thousandths of its unit, rounded up (a request) or down (allocatable); None if unreadable."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    return _thousandths(raw, up)


# The same few quantities ("1", "110", "8") come back on every node and pod,
# and exact parsing goes through Fractions: read each text once.
@functools.lru_cache(maxsize=4096, typed=True)
def _thousandths(raw: str | int | float, up: bool) -> int | None:
    try:
        value = exact(raw) * 1000
    except (QuantityError, ValueError, OverflowError):
        return None
    if value < 0:
        return None
    return math.ceil(value) if up else math.floor(value)


def _counted_only(amounts: object) -> bool:
    """Whether a requests or limits map (or its absence) names no resource but CPU, memory and GPUs."""
    return amounts is None or (isinstance(amounts, dict) and amounts.keys() <= _COUNTED)


def _container_other(container: object) -> dict[str, int]:
    if not isinstance(container, dict):
        return {}
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return {}
    raw_requests, raw_limits = resources.get("requests"), resources.get("limits")
    requests: dict[str, Any] = raw_requests if isinstance(raw_requests, dict) else {}
    limits: dict[str, Any] = raw_limits if isinstance(raw_limits, dict) else {}
    if requests.keys() <= _COUNTED and limits.keys() <= _COUNTED:
        return {}  # most containers ask for CPU, memory and GPUs only
    out: dict[str, int] = {}
    for name in {*requests, *limits}:
        if name in _COUNTED or not isinstance(name, str):
            continue
        raw = requests[name] if name in requests else limits[name]
        amount = thousandths(raw, up=True)
        if amount is None:
            raise UnreadableError(f"resources.requests[{name!r}] {raw!r}")
        if amount:
            out[name] = amount
    return out


def other_requests(spec: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """Requests of every other resource, as kube-scheduler sums them (sidecars, init peaks, overhead).

    Raises :class:`UnreadableError` for an amount that does not parse: counted
    as zero it could overcommit the node.
    """
    containers = spec.get("containers")
    if isinstance(containers, list) and not spec.get("initContainers") and not spec.get("overhead"):
        # The common pod: containers asking for CPU, memory and GPUs only.
        for container in containers:
            resources = container.get("resources") if isinstance(container, dict) else None
            if isinstance(resources, dict) and not (
                _counted_only(resources.get("requests")) and _counted_only(resources.get("limits"))
            ):
                break
        else:
            return ()
    total: dict[str, int] = {}
    for container in _seq(containers, "spec.containers"):
        for name, amount in _container_other(container).items():
            total[name] = total.get(name, 0) + amount
    init = spec.get("initContainers")
    if init:
        sidecars: dict[str, int] = {}
        peak: dict[str, int] = {}
        for container in _seq(init, "spec.initContainers"):
            own = _container_other(container)
            restart = isinstance(container, dict) and container.get("restartPolicy") == "Always"
            if restart:
                for name, amount in own.items():
                    sidecars[name] = sidecars.get(name, 0) + amount
                running = dict(sidecars)
            else:
                running = {n: own.get(n, 0) + sidecars.get(n, 0) for n in {*own, *sidecars}}
            for name, amount in running.items():
                peak[name] = max(peak.get(name, 0), amount)
        for name, amount in sidecars.items():
            total[name] = total.get(name, 0) + amount
        for name, amount in peak.items():
            total[name] = max(total.get(name, 0), amount)
    overhead = spec.get("overhead")
    if isinstance(overhead, dict):
        for name, raw in overhead.items():
            if name in _COUNTED or not isinstance(name, str):
                continue
            extra = thousandths(raw, up=True)
            if extra is None:
                raise UnreadableError(f"spec.overhead[{name!r}] {raw!r}")
            total[name] = total.get(name, 0) + extra
    return tuple(sorted((n, a) for n, a in total.items() if a))


def node_other(allocatable: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """A node's allocatable of every other resource (thousandths, rounded down) and its pod limit."""
    out: dict[str, int] = {}
    pods = 0
    for name, raw in allocatable.items():
        if name in _COUNTED or not isinstance(name, str):
            continue
        amount = thousandths(raw, up=False)
        if amount is None:
            continue
        if name == "pods":
            pods = amount // 1000
        else:
            out[name] = amount
    return out, pods
