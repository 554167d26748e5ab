"""Demo scenario files: the cluster, the queue tree, the workload and the faults of one run.

A scenario is a YAML file (``demo/scenarios/default.yaml`` is the one
``make run`` shows; ``--scenario`` takes another name or a path), read with
the agent config's loader, so an unknown or misspelt key is refused with its
dotted path when the demo starts rather than when a fault comes due minutes
into the run. Every fault is checked against the sim's fault table.

Sizes are written for the scenario's own node count (``cluster.nodes``) and
follow ``--nodes``: queue quotas and limits are percentages of their node
pool's GPUs, and job arrivals come more often on a bigger cluster, so the same file
over-subscribes 6 nodes and 200 alike. A fault names its node by index;
indices past ``--nodes`` are left out (and said so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from agent.config import POLL_INTERVAL_S, ConfigError, from_mapping
from agent.publish.settings import DaemonSettings
from agent.sim.faults import FAULTS, missing_params
from gpuwarden.flags import Bounds, bounded, bounds_of, check_bounds
from gpuwarden.yamlfile import load_yaml, parse_yaml

_SHIPPED = "demo.scenarios"


class Owner(StrEnum):
    """Who owns a job's pods: a batch Job (the Job controller makes them), a
    Kubeflow PyTorchJob (the demo's stand-in operator makes them), or nobody."""

    JOB = "job"
    PYTORCHJOB = "pytorchjob"
    POD = "pod"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 16
    # Nodes are dealt to the pools in turn (node 0 to the first, node 1 to the second, ...).
    pools: list[str] = field(default_factory=lambda: ["train", "batch"])
    # The agent sim scenario every node starts from (8 GPUs, 8 InfiniBand ports).
    node_scenario: str = "healthy"
    # The agents' own settings, so their bounds (checked when the scenario loads, not when a node starts).
    poll_interval_s: float = bounded(2.0, Bounds(0.1, POLL_INTERVAL_S.high, allow_low=True))
    heartbeat_period_s: float = bounded(30.0, bounds_of(DaemonSettings, "heartbeat_period_s"))


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    period_s: float = 1.0
    evictions_per_s: float = 50.0
    # How much of a pool remediation may take out at once (the breaker's max_out_fraction).
    max_out_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One queue. A department names its node pool (its children divide the same
    pool); quota and limit are percent of that pool's GPUs."""

    name: str
    parent: str = ""
    pool: str = ""
    priority: int = 0
    quota_pct: float | None = None
    limit_pct: float | None = None
    over_quota_weight: float | None = None


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """Jobs of one kind arriving one every ``every_s`` (at the scenario's size) into ``queue``.

    A job has ``pods`` pods of ``gpus`` whole GPUs each (a gang when more than
    one), or one pod with a ``fraction`` of a GPU; it runs ``duration_s`` once
    placed. No new job arrives while ``max_pending`` of this stream wait, so
    the demand stays above capacity without an ever-growing backlog.
    """

    name: str
    queue: str
    # An Owner value: job, pytorchjob or pod.
    owner: str = Owner.JOB.value
    pods: int = 1
    gpus: int = 1
    fraction: float | None = None
    duration_s: float = 60.0
    every_s: float = 10.0
    start_s: float = 0.0
    initial: int = 0
    max_pending: int = 2


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One scheduled fault: ``inject`` (a sim fault kind) on node ``node`` at ``at`` seconds."""

    at: float
    node: int
    inject: str
    note: str = ""
    gpu: int | None = None
    xid: int | None = None
    link: int | None = None
    count: int | None = None
    device: str | None = None
    port: int | None = None
    rate_gbps: float | None = None

    def params(self) -> dict[str, Any]:
        names = ("gpu", "xid", "link", "count", "device", "port", "rate_gbps")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True, slots=True)
class PeopleSpec:
    """How the people who take escalated repairs behave: ``repair_after_s``
    after a node is escalated they reboot or fix it, check it is clean, and
    mark the ticket done with the escalation-cleared annotation."""

    repair_after_s: float = 15.0


@dataclass(frozen=True, slots=True)
class DemoScenario:
    name: str = "demo"
    description: str = ""
    duration_s: float = 300.0
    # The last seconds of a run, in which no new gang arrives: gangs cannot be
    # reclaimed in parts, so a queue a gang took above its fair share comes
    # back to it only when the gang ends; without new gangs every queue
    # settles within one GPU of its fair share by the end.
    settle_s: float = 50.0
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    queues: list[QueueSpec] = field(default_factory=list)
    workload: list[StreamSpec] = field(default_factory=list)
    faults: list[FaultSpec] = field(default_factory=list)
    people: PeopleSpec = field(default_factory=PeopleSpec)

    def scale(self, nodes: int) -> float:
        """How much more often jobs arrive on ``nodes`` nodes than on the scenario's own size."""
        return nodes / self.cluster.nodes


def _check(source: str, sc: DemoScenario) -> None:
    def finite(key: str, value: float, minimum: float = 0.0) -> None:
        if not math.isfinite(value) or value < minimum:
            raise ConfigError(f"{source}: {key}: must be a finite number not below {minimum:g}, got {value!r}")

    finite("duration_s", sc.duration_s)
    if sc.cluster.nodes < 1 or not sc.cluster.pools:
        raise ConfigError(f"{source}: cluster: needs at least one node and one pool")
    for key, problem in check_bounds(sc.cluster, "cluster"):
        raise ConfigError(f"{source}: {key}: {problem}")
    names = {q.name for q in sc.queues}
    for i, q in enumerate(sc.queues):
        if q.parent and q.parent not in names:
            raise ConfigError(f"{source}: queues[{i}].parent: no queue named {q.parent!r}")
        if not q.parent and q.pool not in sc.cluster.pools:
            raise ConfigError(f"{source}: queues[{i}].pool: a department names one of the pools {sc.cluster.pools}")
        if q.parent and q.pool:
            raise ConfigError(f"{source}: queues[{i}].pool: a child queue divides its department's pool")
    parents = {q.parent for q in sc.queues}
    leaves = names - parents
    owners = [o.value for o in Owner]
    for i, s in enumerate(sc.workload):
        if s.owner not in owners:
            raise ConfigError(f"{source}: workload[{i}].owner: {s.owner!r} is not one of {', '.join(owners)}")
        if s.queue not in leaves:
            raise ConfigError(f"{source}: workload[{i}].queue: {s.queue!r} is not a leaf queue ({sorted(leaves)})")
        finite(f"workload[{i}].every_s", s.every_s, 0.1)
        finite(f"workload[{i}].duration_s", s.duration_s, 0.1)
        if s.fraction is not None and not 0 < s.fraction < 1:
            raise ConfigError(f"{source}: workload[{i}].fraction: must be between 0 and 1, got {s.fraction}")
        if s.fraction is not None and (s.pods != 1 or s.owner == Owner.PYTORCHJOB):
            raise ConfigError(f"{source}: workload[{i}]: a GPU slice is one pod of a Job or a bare pod")
    for i, f in enumerate(sc.faults):
        finite(f"faults[{i}].at", f.at)
        if f.inject not in FAULTS:
            raise ConfigError(f"{source}: faults[{i}].inject: unknown kind {f.inject!r} (known: {', '.join(FAULTS)})")
        missing = missing_params(f.inject, f.params())
        if missing:
            raise ConfigError(f"{source}: faults[{i}]: {f.inject} needs {', '.join(missing)}")


def scenario_from_dict(data: Any, source: str = "demo scenario") -> DemoScenario:
    try:
        sc: DemoScenario = from_mapping(DemoScenario, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    _check(source, sc)
    return sc


def list_scenarios() -> list[str]:
    """Names of the demo scenarios shipped in the package."""
    root = resources.files(_SHIPPED)
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> DemoScenario:
    """A shipped demo scenario by name (``default``) or a scenario file by path."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or "/" in name_or_path:
        return scenario_from_dict(load_yaml(path, "demo scenario file", ConfigError), str(path))
    res = resources.files(_SHIPPED).joinpath(f"{name_or_path}.yaml")
    if not res.is_file():
        raise ConfigError(f"no demo scenario named {name_or_path!r} (shipped: {', '.join(list_scenarios())})")
    source = f"demo scenario {name_or_path}"
    return scenario_from_dict(parse_yaml(res.read_text(), source, ConfigError), source)
