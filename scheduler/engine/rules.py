"""Kubernetes' placement rules for one pod: node and pod affinity, topology spread, host ports, other resources.

A user moving from kube-scheduler expects every rule its default filters
enforce to hold for pods gpuwarden places, and its default scores to order
the nodes the same way. The node-only rules (node affinity, a bound
volume's node affinity) are static: :mod:`scheduler.engine.predicates`
judges them once per pod shape. This module holds the rules whose verdict
depends on the pods around a node:

- **inter-pod affinity and anti-affinity** (required), against pods
  already bound anywhere in the topology domain and pods placed earlier in
  the same session, gang members included; and the required anti-affinity
  of pods already bound, which binds the newcomer too (a pod that says
  "no ``app=db`` in my zone" keeps ``app=db`` pods out of its zone);
- **topology spread constraints** with ``whenUnsatisfiable:
  DoNotSchedule``, with ``minDomains`` and the node inclusion policies;
- **host ports**, a node's **pod limit**, and **every other requested
  resource** (ephemeral storage, hugepages, extended resources) against
  the node's allocatable.

Cost. The pods bound in the cluster are indexed by label once per session
(:class:`PodIndex`, built on first use and kept up to date by every
placement and eviction of the session), so a term's matching pods come from
the index entry of its most selective label, never from a scan of every
pod, and a pod's verdict (:class:`Verdict`) is worked out once per state
of the index: every candidate node is then a few dictionary lookups. A
session whose pods carry none of these rules builds nothing.

Where gpuwarden is stricter than kube-scheduler, and why (both only ever
refuse a node kube-scheduler would accept, never the reverse):

- a cordoned node takes no pod of ours even if it tolerates
  ``node.kubernetes.io/unschedulable``: remediation cordons nodes to empty
  them;
- a pod affinity term with a namespace selector that has labels is
  refused with an explanation, and an anti-affinity term with one counts
  pods of every namespace: namespaces' labels are not watched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.engine.model import (
    HostPort,
    LabelSelector,
    Node,
    NodeTerm,
    Placement,
    PodTerm,
    Requirement,
    SpreadConstraint,
    TaintEffect,
    Task,
)
from scheduler.engine.podindex import PodIndex
from scheduler.engine.state import Cluster, NodeState, TaskState

_BLOCKING = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})
_ANY_IP = "0.0.0.0"


# --------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------


_INT64 = 2**63
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def _integer(text: str) -> int | None:
    """A label value as Kubernetes reads it for Gt and Lt: a base-10 int64 (Go's strconv.ParseInt).

    Python's ``int`` also takes "1_0", spaces and non-ASCII digits, which
    Kubernetes rejects (the requirement then fails): a node whose label
    only Python reads as a number must not pass.
    """
    if _DECIMAL.fullmatch(text) is None:
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


def requirement_holds(req: Requirement, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy one requirement, with Kubernetes' meaning of each operator."""
    op = req.operator
    value = labels.get(req.key)
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(req.values) != 1:
            return False
        have, bound = _integer(value), _integer(req.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def node_term_matches(term: NodeTerm, node: Node) -> bool:
    """Every requirement of ``term`` holds for ``node``; an empty term matches nothing."""
    if not term.expressions and not term.fields:
        return False
    labels = node.labels
    if not all(requirement_holds(r, labels) for r in term.expressions):
        return False
    name = {"metadata.name": node.name}
    return all(requirement_holds(r, name) for r in term.fields)


def node_affinity_problem(placement: Placement, node: Node) -> str | None:
    """Why ``node`` fails the pod's required node affinity or a volume's, or None."""
    if placement.node_terms and not any(node_term_matches(t, node) for t in placement.node_terms):
        return "node affinity does not match"
    for terms in placement.volume_terms:
        if not any(node_term_matches(t, node) for t in terms):
            return "a volume's node affinity does not match"
    if node.name in placement.avoid:
        return "avoided for now: its device manager started a pod of this job on a GPU out of service"
    return None


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """A label selector over ``labels``: None matches nothing, empty matches everything."""
    if selector is None:
        return False
    for key, value in selector.match_labels:
        if labels.get(key) != value:
            return False
    return all(requirement_holds(r, labels) for r in selector.expressions)


def term_selects(term: PodTerm, owner_namespace: str, pod: Task) -> bool:
    """Whether ``term``, written on a pod of ``owner_namespace``, selects ``pod``."""
    if not term.all_namespaces:
        namespaces = term.namespaces or (owner_namespace,)
        if pod.namespace not in namespaces:
            return False
    return selector_matches(term.selector, pod.labels)


def pod_index(cluster: Cluster) -> PodIndex:
    """The session's index, built on first use from every seated pod and the bystanders.

    From then on :meth:`Cluster.take` and :meth:`Cluster.release` keep it
    up to date; the session drops it at its end.
    """
    index = cluster.pod_index
    if index is None:
        index = PodIndex()
        for node in cluster.nodes.values():
            for task in node.tasks:
                if not task.placeholder:
                    index.add(id(task), task.spec, node.spec)
        for spec in cluster.bystanders:
            bound = cluster.nodes.get(spec.node or "")
            if bound is not None:
                index.add(id(spec), spec, bound.spec)
        cluster.pod_index = index
    return index


# --------------------------------------------------------------------------
# One pod's verdict over every node
# --------------------------------------------------------------------------


@dataclass(slots=True)
class Verdict:
    """What the pods around say about each node for one pod, as lookups.

    ``forbidden``: topology key -> domains where a required anti-affinity
    (the pod's own, or a bound pod's that selects it) forbids it.
    ``required``: per required affinity term, its key and the domains that
    hold a pod matching every term; None when no pod anywhere matches them
    all and the pod matches its own terms (the first of a group with affinity to itself,
    which Kubernetes lets go anywhere that has the topology keys).
    ``spread``: per hard spread constraint, its key and the domains a pod
    may join without exceeding the skew.
    """

    forbidden: dict[str, set[str]] = field(default_factory=dict)
    required: list[tuple[str, set[str]]] | None = None
    required_keys: tuple[str, ...] = ()
    spread: list[tuple[str, set[str]]] = field(default_factory=list)
    ports: tuple[HostPort, ...] = ()
    extended: tuple[tuple[str, int], ...] = ()
    version: int = -1
    # Whether a bound pod's anti-affinity closes a domain to this pod (which
    # depends on its labels, not only its shape).
    guarded: bool = False

    def problem(self, node: NodeState) -> str | None:
        """Why ``node`` cannot take the pod because of the pods around it, or None."""
        labels = node.spec.labels
        for key, values in self.forbidden.items():
            value = labels.get(key)
            if value is not None and value in values:
                return f"pod anti-affinity ({key}={value})"
        if self.required is not None:
            for key, values in self.required:
                value = labels.get(key)
                if value is None or value not in values:
                    return f"pod affinity ({key})"
        else:
            for key in self.required_keys:
                if key not in labels:
                    return f"pod affinity ({key} missing)"
        for key, values in self.spread:
            value = labels.get(key)
            if value is None:
                return f"topology spread ({key} missing)"
            if value not in values:
                return f"topology spread ({key}={value} would exceed the skew)"
        if self.ports and _port_conflict(node, self.ports):
            return "host port in use"
        if self.extended:
            return _extended_problem(node, self.extended)
        return None


def _port_conflict(node: NodeState, wanted: tuple[HostPort, ...]) -> bool:
    for task in node.tasks:
        placement = task.spec.placement
        if placement is None or not placement.ports:
            continue
        for have in placement.ports:
            for want in wanted:
                same = have.port == want.port and have.protocol == want.protocol
                if same and (have.ip == want.ip or _ANY_IP in (have.ip, want.ip)):
                    return True
    return False


def _extended_problem(node: NodeState, wanted: tuple[tuple[str, int], ...]) -> str | None:
    allocatable = node.spec.extended
    for name, amount in wanted:
        used = 0
        for task in node.tasks:
            for other, held in task.spec.extended:
                if other == name:
                    used += held
        if used + amount > allocatable.get(name, 0):
            return f"insufficient {name}"
    return None


def needs_verdict(cluster: Cluster, task: TaskState) -> bool:
    """Whether any rule of this module can refuse a node to ``task`` (else it costs nothing)."""
    spec = task.spec
    if spec.extended:
        return True
    placement = spec.placement
    if placement is not None and (placement.dynamic or placement.ports):
        return True
    return cluster.anti_holders > 0 or cluster.bystander_anti


def verdict_for(cluster: Cluster, domains: DomainCache, task: TaskState) -> Verdict:
    """``task``'s verdict against the state as it is now (recomputed only when a pod moved)."""
    index = pod_index(cluster)
    spec = task.spec
    placement = spec.placement or _NO_PLACEMENT
    # A pod without pod rules of its own is judged only by the bound pods'
    # anti-affinity (host ports and extended resources are read live), so
    # its verdict stands until a term comes or goes, not until any pod moves.
    own = bool(placement.anti_affinity or placement.affinity or placement.spread)
    version = index.version if own else index.guard_version
    cached = domains.verdicts.get(id(task))
    if cached is not None and cached.version == version:
        return cached
    verdict = Verdict(ports=placement.ports, extended=spec.extended, version=version)
    for key, values in _symmetric(index, spec).items():
        verdict.forbidden.setdefault(key, set()).update(values)
        verdict.guarded = True
    for term in placement.anti_affinity:
        verdict.forbidden.setdefault(term.topology_key, set()).update(_domains_with(index, term, spec.namespace))
    if placement.affinity:
        required = _affinity_domains(index, placement.affinity, spec.namespace)
        if any(values for _, values in required) or not all(
            term_selects(t, spec.namespace, spec) for t in placement.affinity
        ):
            verdict.required = required
        else:
            verdict.required_keys = tuple(t.topology_key for t in placement.affinity)
    else:
        verdict.required = []
    for constraint in placement.spread:
        if constraint.hard:
            verdict.spread.append((constraint.topology_key, _spread_allowed(cluster, index, domains, task, constraint)))
    domains.verdicts[id(task)] = verdict
    return verdict


_NO_PLACEMENT = Placement()


def rules_key(task: TaskState, verdict: Verdict) -> tuple[object, ...] | None:
    """What makes two pods alike under these rules, for a cache of "nothing fits"; None: never alike.

    A pod whose required pod affinity or topology spread another pod's
    placement can satisfy may fit after a placement, which a cache trusted
    until something is released would miss. Every other rule only gets
    stricter as pods are placed, so a failure stays true for pods of the
    same shape (which holds the rules themselves), in the same namespace
    when its own anti-affinity terms count that namespace's pods, with the
    same labels when a bound pod's anti-affinity selects it.
    """
    spec = task.spec
    placement = spec.placement
    if placement is not None and (placement.affinity or placement.spread):
        return None
    key = task.shape
    if placement is not None and placement.anti_affinity:
        key = (*key, spec.namespace)
    if verdict.guarded:
        key = (*key, spec.namespace, tuple(sorted(spec.labels.items())))
    return key


def _domains_with(index: PodIndex, term: PodTerm, namespace: str) -> set[str]:
    """The domains of ``term.topology_key`` holding a pod the term selects."""
    found: set[str] = set()
    if term.selector is None:
        return found
    key = term.topology_key
    for entry in index.candidates(term.selector):
        value = entry.node.labels.get(key)
        if value is not None and value not in found and term_selects(term, namespace, entry.spec):
            found.add(value)
    return found


def _affinity_domains(index: PodIndex, terms: tuple[PodTerm, ...], namespace: str) -> list[tuple[str, set[str]]]:
    """Per required affinity term, its key and the domains holding a pod that matches *every* term.

    kube-scheduler's InterPodAffinity counts a bound pod for a pod's
    required affinity only when it matches all of its terms (and then in
    each term's domain): "a db pod in my zone and a web pod on my node"
    needs one pod that is both, not one of each.
    """
    found: list[tuple[str, set[str]]] = [(t.topology_key, set()) for t in terms]
    first = terms[0].selector
    if first is None or any(t.selector is None for t in terms):
        return found
    for entry in index.candidates(first):
        if all(term_selects(t, namespace, entry.spec) for t in terms):
            labels = entry.node.labels
            for key, values in found:
                value = labels.get(key)
                if value is not None:
                    values.add(value)
    return found


def _symmetric(index: PodIndex, spec: Task) -> dict[str, set[str]]:
    """Domains that bound pods' required anti-affinity closes to ``spec`` (by its namespace and labels)."""
    out: dict[str, set[str]] = {}
    for term, entry in index.guards_for(spec.labels):
        if term_selects(term, entry.spec.namespace, spec):
            value = entry.node.labels.get(term.topology_key)
            if value is not None:
                out.setdefault(term.topology_key, set()).add(value)
    return out


def _spread_allowed(
    cluster: Cluster, index: PodIndex, domains: DomainCache, task: TaskState, constraint: SpreadConstraint
) -> set[str]:
    """The domains ``task`` may join under one hard constraint: count + self - min <= maxSkew.

    The minimum is 0 while fewer domains than ``minDomains`` exist, as in
    Kubernetes, so a pod can open a new domain before piling onto the
    existing ones.
    """
    spec = task.spec
    counts = _spread_counts(cluster, index, domains, spec, constraint)
    if not counts:
        return set()
    lowest = min(counts.values()) if len(counts) >= constraint.min_domains else 0
    own = 1 if selector_matches(constraint.selector, spec.labels) else 0
    return {d for d, n in counts.items() if n + own - lowest <= constraint.max_skew}


@dataclass(slots=True, eq=False)
class DomainCache:
    """What one session works out once: eligible nodes per spread constraint, verdicts per pod."""

    # (pod's static node rules, constraint's key and policies) -> node name -> domain.
    domains: dict[tuple[object, ...], dict[str, str]] = field(default_factory=dict)
    # id of such a map -> its distinct domains, in first-seen order.
    distinct: dict[int, tuple[str, ...]] = field(default_factory=dict)
    verdicts: dict[int, Verdict] = field(default_factory=dict)

    def eligible(self, cluster: Cluster, spec: Task, constraint: SpreadConstraint) -> dict[str, str]:
        """Nodes that count for ``constraint`` (its inclusion policies), with their domain.

        As in kube-scheduler, a node counts only if it carries the topology
        key of every constraint of the pod of the same kind (hard, or
        soft): pods on a node without the rack label are not counted in
        their zone when the pod also spreads over racks.
        """
        placement = spec.placement
        assert placement is not None
        keys = tuple(sorted({c.topology_key for c in placement.spread if c.hard == constraint.hard}))
        key = (
            constraint.topology_key,
            keys,
            constraint.honor_affinity and tuple(sorted(spec.node_selector.items())),
            constraint.honor_affinity and placement.node_terms,
            constraint.honor_taints and spec.tolerations,
        )
        found = self.domains.get(key)
        if found is None:
            found = {}
            for state in cluster.nodes.values():
                node = state.spec
                value = node.labels.get(constraint.topology_key)
                if value is None or any(k not in node.labels for k in keys):
                    continue
                if constraint.honor_affinity and not _selector_and_affinity(spec, node):
                    continue
                if constraint.honor_taints and not _tolerated(spec, node):
                    continue
                found[node.name] = value
            self.domains[key] = found
            self.distinct[id(found)] = tuple(dict.fromkeys(found.values()))
        return found


def _selector_and_affinity(spec: Task, node: Node) -> bool:
    for key, value in spec.node_selector.items():
        if node.labels.get(key) != value:
            return False
    placement = spec.placement
    if placement is None or not placement.node_terms:
        return True
    return any(node_term_matches(t, node) for t in placement.node_terms)


def _tolerated(spec: Task, node: Node) -> bool:
    return all(any(t.tolerates(taint) for t in spec.tolerations) for taint in node.taints if taint.effect in _BLOCKING)


# --------------------------------------------------------------------------
# Preferences
# --------------------------------------------------------------------------

# kube-scheduler's default weights of the scores that read these rules.
NODE_AFFINITY_WEIGHT = 2
POD_AFFINITY_WEIGHT = 2
SPREAD_WEIGHT = 2
TAINT_WEIGHT = 3
MAX_SCORE = 100


def preference_scores(cluster: Cluster, domains: DomainCache, task: TaskState, nodes: list[NodeState]) -> list[int]:
    """Scores (higher is better) for ``nodes``, as kube-scheduler's default scores would rank them.

    Each score is normalised to 0-100 over the candidates and weighted as
    kube-scheduler weighs it: preferred node affinity (sum of the matching
    terms' weights, weight 2), preferred pod affinity and anti-affinity
    (weight times matching pods in the node's domain, plus for affinity,
    minus for anti-affinity, weight 2), soft topology spread (fewer matching
    pods in the node's domain is better, weight 2) and PreferNoSchedule
    taints not tolerated (fewer is better, weight 3).
    """
    spec = task.spec
    placement = spec.placement or _NO_PLACEMENT
    index = pod_index(cluster)
    affinity_raw = [0] * len(nodes)
    node_raw = [0] * len(nodes)
    spread_raw = [0] * len(nodes)
    taint_raw = [0] * len(nodes)
    weighted = [(w, t, 1) for w, t in placement.preferred_affinity]
    weighted += [(w, t, -1) for w, t in placement.preferred_anti_affinity]
    per_term = [(w * sign, t, _domain_counts(index, t, spec.namespace)) for w, t, sign in weighted]
    soft = [c for c in placement.spread if not c.hard]
    soft_counts = [_spread_counts(cluster, index, domains, spec, c) for c in soft]
    for i, node in enumerate(nodes):
        labels = node.spec.labels
        node_raw[i] = sum(w for w, term in placement.preferred_nodes if node_term_matches(term, node.spec))
        for factor, term, counts in per_term:
            value = labels.get(term.topology_key)
            if value is not None:
                affinity_raw[i] += factor * counts.get(value, 0)
        for constraint, counts in zip(soft, soft_counts, strict=True):
            value = labels.get(constraint.topology_key)
            spread_raw[i] += counts.get(value, 0) if value is not None else 0
        taint_raw[i] = sum(
            1
            for taint in node.spec.taints
            if taint.effect is TaintEffect.PREFER_NO_SCHEDULE and not any(t.tolerates(taint) for t in spec.tolerations)
        )
    return [
        NODE_AFFINITY_WEIGHT * n + POD_AFFINITY_WEIGHT * a + SPREAD_WEIGHT * s + TAINT_WEIGHT * t
        for n, a, s, t in zip(
            _normalised(node_raw, higher=True),
            _normalised(affinity_raw, higher=True),
            _normalised(spread_raw, higher=False),
            _normalised(taint_raw, higher=False),
            strict=True,
        )
    ]


def _normalised(raw: list[int], *, higher: bool) -> list[int]:
    """0-100 over the candidates; all equal is no preference (every node 0)."""
    lo, hi = min(raw, default=0), max(raw, default=0)
    if hi == lo:
        return [0] * len(raw)
    span = hi - lo
    if higher:
        return [MAX_SCORE * (v - lo) // span for v in raw]
    return [MAX_SCORE * (hi - v) // span for v in raw]


def _domain_counts(index: PodIndex, term: PodTerm, namespace: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    if term.selector is None:
        return counts
    for entry in index.candidates(term.selector):
        value = entry.node.labels.get(term.topology_key)
        if value is not None and term_selects(term, namespace, entry.spec):
            counts[value] = counts.get(value, 0) + 1
    return counts


def _spread_counts(
    cluster: Cluster, index: PodIndex, domains: DomainCache, spec: Task, constraint: SpreadConstraint
) -> dict[str, int]:
    """Matching pods (same namespace, not terminating) per domain of every node that counts for it.

    A selector that is absent or empty counts no pod at all, as
    kube-scheduler counts (an empty selector would match every pod, but
    kube-scheduler's filter and score skip it); the pod still counts
    itself, since an empty selector matches its own labels.
    """
    eligible = domains.eligible(cluster, spec, constraint)
    # Every domain starts at zero (a domain with no matching pod is the
    # emptiest), from the few distinct ones rather than every node's.
    counts = dict.fromkeys(domains.distinct[id(eligible)], 0)
    selector = constraint.selector
    if selector is None or not (selector.match_labels or selector.expressions):
        return counts
    for entry in index.candidates(selector):
        other = entry.spec
        if other.namespace != spec.namespace or other.terminating:
            continue
        value = eligible.get(entry.node.name)
        if value is not None and selector_matches(selector, other.labels):
            counts[value] += 1
    return counts
