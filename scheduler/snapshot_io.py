"""Read a cluster snapshot, or a queue tree with demand, from YAML.

These files let a person ask the engine "what would you do" without a
cluster (``gpuwarden scheduler --snapshot FILE``, ``gpuwarden fairshare
FILE``), and let tests and demos write clusters by hand. Amounts are written
the way Kubernetes writes them and converted to engine units here:

- CPU: cores as a number (``8``, ``0.5``) or millicores (``"500m"``);
- memory: a quantity (``64Gi``, ``512Mi``, ``1G``; a bare number is bytes);
- GPU quota/limit/demand: GPUs as a number (``4``, ``2.5``);
- ``-1`` (or ``unlimited``) for an unbounded quota or limit.

A queue governs only the resources it names: one that leaves out ``cpu:``
(or ``memory:``, or ``gpu:``) has no quota and no limit for it, and the
non-preemptible-within-quota rule ignores it, so a queue tree with GPU
quotas alone admits pods that ask for CPU and memory. A resource that is
named but leaves out ``quota`` has a quota of 0 (it may only borrow); one
that leaves out ``limit`` has no limit.

Snapshot file::

    now: 1700000000                # seconds since the epoch
    config:                        # optional
      strategy: binpack            # default placement: binpack | spread
      poolStrategies: {inference: spread}
      staleGangGraceSeconds: 60
    nodes:
      - name: node-a
        pool: default              # optional; the node-pool label value
        cpu: 64
        memory: 512Gi
        gpus: 8                    # a count (uniform GPUs) ...
        gpuMemory: 80Gi            # ... with their memory, or a list:
        # gpus: [{index: 0, memory: 80Gi, healthy: true, mig: false, uuid: GPU-...,
        #         offered: true,            # the device plugin offers it (null: not said)
        #         faultedSince: 1699999000}]  # its oldest fault still listed
        labels: {zone: a}
        taints: [{key: dedicated, value: infer, effect: NoSchedule}]
        schedulable: true          # false = cordoned
        draining: false            # true = remediation is draining it
        conditions:
          - {type: GpuXidError, status: "True", reason: Xid79, action: REBOOT, gpus: [3]}
        kubeletHolders:            # optional: the GPUs the kubelet reports each pod holding,
          uid-1234: [0]            # by pod UID (or namespace/name); absent: the node said nothing
    queues:                        # see the fair-share file below
      - {name: research, gpu: {quota: 8, limit: -1, overQuotaWeight: 1}}
    jobs:
      - name: train
        namespace: default
        queue: research
        priority: 50
        preemptible: true          # optional; inferred from priority
        minMember: 2
        created: 1699990000
        belowMinMemberSince: null  # when a running gang was first seen short, having lost a member
        succeeded: 0               # members that finished successfully (count toward minMember)
        failed: 0                  # members that failed (count for nothing)
        tasks:
          - name: train-0          # or `replicas: 4` to make train-0..train-3
            cpu: 8
            memory: 64Gi
            gpus: 1                # whole GPUs (nvidia.com/gpu)
            annotations: {gpuwarden.io/gpu-fraction: "0.5"}
            status: Pending        # Pending | Running | Releasing
            node: node-a           # running pods: where, and which GPUs
            gpuIndices: [0]
            started: 1699995000    # a running pod's status.startTime
            nodeSelector: {}
            tolerations: [{key: dedicated, operator: Equal, value: infer, effect: NoSchedule}]

Fair-share file::

    capacity:                      # healthy capacity per node pool
      default: {gpu: 16, cpu: 256, memory: 2Ti}
    queues:
      - name: dept-a
        priority: 0
        pool: default
        gpu: {quota: 8, limit: -1, overQuotaWeight: 1}
        cpu: {quota: 64}
        memory: {quota: 512Gi}
      - {name: team-1, parent: dept-a, gpu: {quota: 4}}
    demand:                        # what each leaf queue asks for
      team-1: {gpu: 10, cpu: 64, memory: 256Gi}

Every problem in a file is reported at once, each with its place in the
document and the value written (``jobs[2].tasks[0].cpu: ...``); a file with
problems is refused whole rather than scheduled in part. What counts as a
problem:

- a key the format does not know, named with the closest known one
  (``queues[0].gpu.limt: unknown key 'limt' (did you mean 'limit'?)``): a
  misspelt quota or priority would otherwise silently be zero. Labels,
  annotations, node selectors and the names under ``poolStrategies``,
  ``kubeletHolders``, ``capacity`` and ``demand`` are the user's own and
  take any key;
- a number that is not finite (``.nan``, ``.inf``), negative, or beyond any
  cluster (over a million GPUs or 10^8 cores, 1Ei of memory, 1024 GPUs on
  one node or pod, a million replicas or gang members, an over-quota weight
  over 10^6). A number may be written ``1e3``, which YAML 1.1 reads as a
  string;
- a queue defined twice (``queue 'x' is defined twice (queues[1] and
  queues[3])``), which would leave it unclear which definition holds.

Pod annotations are passed through as written: a malformed GPU slice is the
engine's to report on the job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.contract import DEFAULT_NODE_POOL, Action
from gpuwarden.yamlfile import load_yaml, unknown_keys, yaml_number
from scheduler.engine.model import (
    UNGOVERNED,
    UNLIMITED,
    Gpu,
    Job,
    Node,
    NodeCondition,
    PlacementStrategy,
    Queue,
    QueueResource,
    SchedulerConfig,
    Snapshot,
    Taint,
    TaintEffect,
    Task,
    TaskStatus,
    Toleration,
)
from scheduler.engine.resources import CPU, GPU, MEMORY, MILLI

_BYTES_PER_MIB = 1024 * 1024
_SUFFIXES = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

# Beyond these no cluster goes: a larger amount is a typo (an exponent, a
# unit written twice), and refusing it keeps the engine's integer arithmetic
# and its lists (a GPU per index, a task per replica) of a sane size.
_MAX_GPUS = 1_000_000
_MAX_CORES = 100_000_000
_MAX_BYTES = 1024**6  # 1Ei
_MAX_GPUS_PER_NODE = 1024
_MAX_MEMBERS = 1_000_000
_MAX_WEIGHT = 1_000_000

# The keys of each mapping of the two formats (see the module docstring).
_KEYS: dict[str, frozenset[str]] = {
    "snapshot": frozenset({"now", "config", "nodes", "queues", "jobs"}),
    "fair-share file": frozenset({"capacity", "queues", "demand"}),
    "config": frozenset({"strategy", "poolStrategies", "staleGangGraceSeconds"}),
    "node": frozenset(
        {
            "name",
            "pool",
            "cpu",
            "memory",
            "gpus",
            "gpuMemory",
            "labels",
            "taints",
            "schedulable",
            "draining",
            "conditions",
            "kubeletHolders",
        }
    ),
    "gpu": frozenset({"index", "memory", "healthy", "mig", "uuid", "offered", "faultedSince"}),
    "taint": frozenset({"key", "value", "effect"}),
    "condition": frozenset({"type", "status", "reason", "message", "action", "gpus"}),
    "queue": frozenset({"name", "parent", "priority", "pool", "gpu", "cpu", "memory"}),
    "queue resource": frozenset({"quota", "limit", "overQuotaWeight"}),
    "job": frozenset(
        {
            "name",
            "queue",
            "namespace",
            "uid",
            "priority",
            "preemptible",
            "minMember",
            "created",
            "belowMinMemberSince",
            "succeeded",
            "failed",
            "tasks",
        }
    ),
    "task": frozenset(
        {
            "name",
            "uid",
            "replicas",
            "namespace",
            "status",
            "cpu",
            "memory",
            "gpus",
            "annotations",
            "nodeSelector",
            "tolerations",
            "node",
            "gpuIndices",
            "started",
        }
    ),
    "toleration": frozenset({"key", "operator", "value", "effect"}),
    "vector": frozenset({"gpu", "cpu", "memory"}),
}
KNOWN_KEYS: frozenset[str] = frozenset().union(*_KEYS.values())
"""Every key either format knows somewhere."""


def _at(where: str, key: str) -> str:
    """The path of ``key`` in the mapping at ``where`` ("" is the top of the document)."""
    return f"{where}.{key}" if where else key


def _shown(value: Any) -> str:
    """A value as the message quotes it: a number as written, anything else quoted."""
    return str(value) if yaml_number(value) is not None else repr(value)


class SnapshotError(ValueError):
    """A file that cannot be read; the message lists every problem found."""


@dataclass(frozen=True, slots=True)
class FairShareInput:
    queues: tuple[Queue, ...]
    capacity: dict[str, tuple[int, int, int]]
    demand: dict[str, tuple[int, int, int]]


class _Reader:
    """Walks a parsed document, collecting problems instead of stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def mapping(self, value: Any, where: str, kind: str | None = None) -> Mapping[str, Any]:
        """``value`` as a mapping; with ``kind``, a key not in that part of the format is a problem."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(where or "document", f"expected a mapping, got {type(value).__name__}")
            return {}
        if kind is not None:
            for key, problem in unknown_keys(value, _KEYS[kind]):
                self.fail(_at(where, key), problem)
        return value

    def sequence(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(where, f"expected a list, got {type(value).__name__}")
            return []
        return value

    def labels(self, value: Any, where: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.mapping(value, where).items()}

    def string(self, data: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if value is None:
            self.fail(_at(where, key), "required")
            return ""
        return str(value)

    def integer(
        self,
        data: Mapping[str, Any],
        key: str,
        where: str,
        default: int,
        *,
        maximum: int | None = None,
        beyond: str = "any cluster",
    ) -> int:
        """A whole number; with ``maximum``, also not negative and at most that (beyond ``beyond``)."""
        value = data.get(key, default)
        number = yaml_number(value)
        whole: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            whole = value
        elif number is not None and not math.isfinite(number):
            self.fail(_at(where, key), f"must be a finite number, got {value!r}")
            return default
        elif number is not None and number.is_integer():
            whole = int(number)
        if whole is None:
            self.fail(_at(where, key), f"expected a whole number, got {value!r}")
            return default
        if maximum is not None:
            if whole < 0:
                self.fail(_at(where, key), f"must not be negative, got {value!r}")
                return default
            if whole > maximum:
                self.fail(_at(where, key), f"{_shown(value)} is beyond {beyond} (at most {maximum})")
                return default
        return whole

    def number(
        self, data: Mapping[str, Any], key: str, where: str, default: float, *, maximum: float | None = None
    ) -> float:
        """A finite number not below 0 (and, with ``maximum``, not above it)."""
        value = data.get(key, default)
        number = yaml_number(value)
        if number is None:
            self.fail(_at(where, key), f"expected a number, got {value!r}")
            return default
        if not math.isfinite(number):
            self.fail(_at(where, key), f"must be a finite number, got {value!r}")
            return default
        if number < 0:
            self.fail(_at(where, key), f"must not be negative, got {value!r}")
            return default
        if maximum is not None and number > maximum:
            self.fail(_at(where, key), f"{_shown(value)} is beyond any useful {key} (at most {maximum:g})")
            return default
        return number

    def boolean(self, data: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = data.get(key, default)
        if isinstance(value, str) and value.lower() in {"true", "false"}:
            return value.lower() == "true"
        if not isinstance(value, bool):
            self.fail(_at(where, key), f"expected true or false, got {value!r}")
            return default
        return value

    def time(self, data: Mapping[str, Any], key: str, where: str, default: float | None) -> float | None:
        value = data.get(key, default)
        if value is None:
            return None
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        number = yaml_number(value)
        if number is None:
            self.fail(_at(where, key), f"expected seconds since the epoch or a timestamp, got {value!r}")
            return default
        if not math.isfinite(number):
            self.fail(_at(where, key), f"must be a finite number, got {value!r}")
            return default
        return number

    def _measure(
        self, value: Any, amount: float | None, where: str, *, unit: str, limit: tuple[float, str], what: str
    ) -> float | None:
        """``amount`` (``value`` read as ``unit``) if it is usable; if not, ``None`` and the problem noted.

        An ``amount`` of ``None`` means ``value`` is no amount at all (``what``
        says what was expected). An amount must be finite, not negative and at
        most ``limit`` (the number, and how a message writes it).
        """
        if amount is None:
            self.fail(where, what)
        elif not math.isfinite(amount):
            self.fail(where, f"must be a finite number, got {value!r}")
        elif amount < 0:
            self.fail(where, f"must not be negative, got {value!r}")
        elif amount > limit[0]:
            shown = f"{value} {unit}" if yaml_number(value) is not None else repr(value)
            self.fail(where, f"{shown} is beyond any cluster (at most {limit[1]})")
        else:
            return amount
        return None

    def cpu(self, value: Any, where: str) -> int:
        """Cores (number) or millicores ("500m") -> millicores, rounded up."""
        milli: int | None = None
        cores = yaml_number(value)
        if isinstance(value, str) and value.strip().endswith("m"):
            try:
                milli = int(value.strip()[:-1])
            except ValueError:
                pass
            else:
                cores = milli / MILLI
        what = f"not a CPU amount: {value!r} (use cores like 8 or 0.5, or millicores like 500m)"
        cores = self._measure(value, cores, where, unit="cores", limit=(_MAX_CORES, f"{_MAX_CORES} cores"), what=what)
        if cores is None:
            return 0
        return milli if milli is not None else math.ceil(cores * MILLI)

    def memory(self, value: Any, where: str) -> int:
        """A quantity (64Gi, 512Mi, bytes) -> MiB, rounded up."""
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_BYTES:
            return -(-value // _BYTES_PER_MIB)  # exact: an int of bytes never goes through a float
        amount = yaml_number(value)
        if amount is None and isinstance(value, str):
            match = _QUANTITY.match(value)
            if match and (match.group(2) == "" or match.group(2) in _SUFFIXES):
                amount = float(match.group(1)) * _SUFFIXES.get(match.group(2), 1)
        what = f"not a memory quantity: {value!r} (use e.g. 64Gi or 512Mi)"
        amount = self._measure(value, amount, where, unit="bytes", limit=(_MAX_BYTES, "1Ei"), what=what)
        if amount is None:
            return 0
        return math.ceil(amount / _BYTES_PER_MIB)

    def gpus(self, value: Any, where: str) -> int:
        """GPUs as a number -> milli-GPUs, rounded up."""
        limit = (_MAX_GPUS, f"{_MAX_GPUS} GPUs")
        what = f"not a GPU amount: {value!r}"
        amount = self._measure(value, yaml_number(value), where, unit="GPUs", limit=limit, what=what)
        if amount is None:
            return 0
        return math.ceil(amount * MILLI)

    def bound(self, value: Any, resource: int, where: str) -> int:
        if value in (-1, "-1", "unlimited"):
            return UNLIMITED
        if resource == GPU:
            return self.gpus(value, where)
        if resource == CPU:
            return self.cpu(value, where)
        return self.memory(value, where)

    def vector(self, data: Any, where: str) -> tuple[int, int, int]:
        data = self.mapping(data, where, "vector")
        return (
            self.gpus(data.get("gpu", 0), f"{where}.gpu"),
            self.cpu(data.get("cpu", 0), f"{where}.cpu"),
            self.memory(data.get("memory", 0), f"{where}.memory"),
        )

    # ------------------------------------------------------------------

    def queue(self, data: Any, where: str) -> Queue:
        data = self.mapping(data, where, "queue")
        resources: list[QueueResource] = []
        for resource, key in ((GPU, "gpu"), (CPU, "cpu"), (MEMORY, "memory")):
            if data.get(key) is None:
                # Not named: not governed (no quota, no limit) for this queue.
                resources.append(UNGOVERNED)
                continue
            setting = self.mapping(data.get(key), f"{where}.{key}", "queue resource")
            quota = self.bound(setting.get("quota", 0), resource, f"{where}.{key}.quota")
            limit = self.bound(setting.get("limit", -1), resource, f"{where}.{key}.limit")
            weight = self.number(setting, "overQuotaWeight", f"{where}.{key}", 1.0, maximum=_MAX_WEIGHT)
            resources.append(QueueResource(quota, limit, weight))
        parent = data.get("parent")
        return Queue(
            name=self.string(data, "name", where),
            parent=str(parent) if parent is not None else None,
            priority=self.integer(data, "priority", where, 0),
            node_pool=self.string(data, "pool", where, DEFAULT_NODE_POOL),
            gpu=resources[GPU],
            cpu=resources[CPU],
            memory=resources[MEMORY],
        )

    def node(self, data: Any, where: str) -> Node:
        data = self.mapping(data, where, "node")
        gpus_value = data.get("gpus", 0)
        gpus: list[Gpu] = []
        if gpus_value is not None and not isinstance(gpus_value, list):
            count = self.integer(data, "gpus", where, 0, maximum=_MAX_GPUS_PER_NODE, beyond="any node")
            memory = self.memory(data.get("gpuMemory", "80Gi"), f"{where}.gpuMemory")
            gpus = [Gpu(index=i, memory_mib=memory) for i in range(count)]
        else:
            for i, raw_gpu in enumerate(self.sequence(gpus_value, f"{where}.gpus")):
                gw = f"{where}.gpus[{i}]"
                g = self.mapping(raw_gpu, gw, "gpu")
                gpus.append(
                    Gpu(
                        index=self.integer(g, "index", gw, i, maximum=_MAX_GPUS_PER_NODE, beyond="any node"),
                        uuid=str(g.get("uuid", "")),
                        memory_mib=self.memory(g.get("memory", "80Gi"), f"{gw}.memory"),
                        healthy=self.boolean(g, "healthy", gw, True),
                        mig_enabled=self.boolean(g, "mig", gw, False),
                        offered=None if g.get("offered") is None else self.boolean(g, "offered", gw, True),
                        faulted_since=self.time(g, "faultedSince", gw, None),
                    )
                )
        taints: list[Taint] = []
        for i, raw_taint in enumerate(self.sequence(data.get("taints"), f"{where}.taints")):
            tw = f"{where}.taints[{i}]"
            t = self.mapping(raw_taint, tw, "taint")
            effect = str(t.get("effect", TaintEffect.NO_SCHEDULE.value))
            if effect not in {e.value for e in TaintEffect}:
                self.fail(f"{tw}.effect", f"unknown taint effect {effect!r}")
                effect = TaintEffect.NO_SCHEDULE.value
            taints.append(Taint(self.string(t, "key", tw), str(t.get("value", "")), TaintEffect(effect)))
        conditions: list[NodeCondition] = []
        for i, raw_cond in enumerate(self.sequence(data.get("conditions"), f"{where}.conditions")):
            cw = f"{where}.conditions[{i}]"
            c = self.mapping(raw_cond, cw, "condition")
            action = str(c.get("action", Action.NONE.value))
            if action not in {a.value for a in Action}:
                self.fail(f"{cw}.action", f"unknown action {action!r} (one of {', '.join(a.value for a in Action)})")
                action = Action.NONE.value
            indices = self.sequence(c.get("gpus"), f"{cw}.gpus")
            conditions.append(
                NodeCondition(
                    type=self.string(c, "type", cw),
                    status=self.boolean(c, "status", cw, True),
                    reason=str(c.get("reason", "")),
                    message=str(c.get("message", "")),
                    action=Action(action),
                    gpu_indices=tuple(int(x) for x in indices if isinstance(x, int)),
                )
            )
        return Node(
            name=self.string(data, "name", where),
            pool=self.string(data, "pool", where, DEFAULT_NODE_POOL),
            cpu_milli=self.cpu(data.get("cpu", 0), f"{where}.cpu"),
            memory_mib=self.memory(data.get("memory", 0), f"{where}.memory"),
            gpus=tuple(gpus),
            labels=self.labels(data.get("labels"), f"{where}.labels"),
            taints=tuple(taints),
            schedulable=self.boolean(data, "schedulable", where, True),
            conditions=tuple(conditions),
            draining=self.boolean(data, "draining", where, False),
            kubelet_holders=self.holders(data.get("kubeletHolders"), f"{where}.kubeletHolders"),
        )

    def holders(self, value: Any, where: str) -> dict[str, tuple[int, ...]] | None:
        """A node's kubelet holders: pod (UID or ``namespace/name``) to GPU indices; None when absent.

        An empty mapping is kept as written: the kubelet said no pod holds a
        GPU, which is not the same as saying nothing.
        """
        if value is None:
            return None
        out: dict[str, tuple[int, ...]] = {}
        for key, raw in self.mapping(value, where).items():
            indices: list[int] = []
            for i, x in enumerate(self.sequence(raw, f"{where}.{key}")):
                if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < _MAX_GPUS_PER_NODE:
                    self.fail(
                        f"{where}.{key}[{i}]", f"expected a GPU index from 0 to {_MAX_GPUS_PER_NODE - 1}, got {x!r}"
                    )
                    continue
                indices.append(x)
            out[str(key)] = tuple(indices)
        return out

    def tasks(self, data: Any, where: str) -> list[Task]:
        data = self.mapping(data, where, "task")
        status = str(data.get("status", TaskStatus.PENDING.value))
        if status not in {s.value for s in TaskStatus}:
            self.fail(f"{where}.status", f"unknown status {status!r} (Pending, Running or Releasing)")
            status = TaskStatus.PENDING.value
        tolerations: list[Toleration] = []
        for i, raw_tol in enumerate(self.sequence(data.get("tolerations"), f"{where}.tolerations")):
            t = self.mapping(raw_tol, f"{where}.tolerations[{i}]", "toleration")
            tolerations.append(
                Toleration(
                    key=str(t.get("key", "")),
                    operator=str(t.get("operator", "Equal")),
                    value=str(t.get("value", "")),
                    effect=str(t.get("effect", "")),
                )
            )
        node = data.get("node")
        common: dict[str, Any] = {
            "namespace": str(data.get("namespace", "default")),
            "status": TaskStatus(status),
            "cpu_milli": self.cpu(data.get("cpu", 0), f"{where}.cpu"),
            "memory_mib": self.memory(data.get("memory", 0), f"{where}.memory"),
            "gpus": self.integer(data, "gpus", where, 0, maximum=_MAX_GPUS_PER_NODE, beyond="any node"),
            "annotations": self.labels(data.get("annotations"), f"{where}.annotations"),
            "node_selector": self.labels(data.get("nodeSelector"), f"{where}.nodeSelector"),
            "tolerations": tuple(tolerations),
            "node": str(node) if node is not None else None,
            "gpu_indices": tuple(
                int(x) for x in self.sequence(data.get("gpuIndices"), f"{where}.gpuIndices") if isinstance(x, int)
            ),
            "started": self.time(data, "started", where, None),
        }
        replicas = data.get("replicas")
        name = self.string(data, "name", where)
        if replicas is None:
            return [Task(name=name, uid=str(data.get("uid", "")), **common)]
        count = self.integer(data, "replicas", where, 1, maximum=_MAX_MEMBERS)
        return [Task(name=f"{name}-{i}", uid="", **common) for i in range(count)]

    def job(self, data: Any, where: str) -> Job:
        data = self.mapping(data, where, "job")
        tasks: list[Task] = []
        for i, t in enumerate(self.sequence(data.get("tasks"), f"{where}.tasks")):
            tasks.extend(self.tasks(t, f"{where}.tasks[{i}]"))
        preemptible = data.get("preemptible")
        if preemptible is not None and not isinstance(preemptible, bool):
            self.fail(f"{where}.preemptible", f"expected true or false, got {preemptible!r}")
            preemptible = None
        return Job(
            name=self.string(data, "name", where),
            queue=self.string(data, "queue", where),
            namespace=str(data.get("namespace", "default")),
            uid=str(data.get("uid", "")),
            priority=self.integer(data, "priority", where, 0),
            preemptible=preemptible,
            min_member=self.integer(data, "minMember", where, 1, maximum=_MAX_MEMBERS),
            created=self.time(data, "created", where, 0.0) or 0.0,
            tasks=tuple(tasks),
            below_min_member_since=self.time(data, "belowMinMemberSince", where, None),
            succeeded=self.integer(data, "succeeded", where, 0, maximum=_MAX_MEMBERS),
            failed=self.integer(data, "failed", where, 0, maximum=_MAX_MEMBERS),
        )

    def config(self, data: Any, where: str) -> SchedulerConfig:
        data = self.mapping(data, where, "config")
        valid = {s.value for s in PlacementStrategy}
        default = str(data.get("strategy", PlacementStrategy.BINPACK.value))
        if default not in valid:
            self.fail(f"{where}.strategy", f"unknown strategy {default!r} (binpack or spread)")
            default = PlacementStrategy.BINPACK.value
        per_pool: dict[str, PlacementStrategy] = {}
        for pool, strategy in self.mapping(data.get("poolStrategies"), f"{where}.poolStrategies").items():
            if str(strategy) not in valid:
                self.fail(f"{where}.poolStrategies.{pool}", f"unknown strategy {strategy!r}")
                continue
            per_pool[str(pool)] = PlacementStrategy(str(strategy))
        return SchedulerConfig(
            default_strategy=PlacementStrategy(default),
            pool_strategies=per_pool,
            stale_gang_grace_s=self.number(data, "staleGangGraceSeconds", where, 60.0),
        )

    def raise_if_problems(self, source: str) -> None:
        if self.problems:
            lines = "\n  ".join(self.problems)
            raise SnapshotError(f"{source}: {len(self.problems)} problem(s):\n  {lines}")

    def queues(self, data: Any) -> list[Queue]:
        """The queue list; a name defined twice is a problem, since which definition holds is a guess."""
        queues: list[Queue] = []
        first: dict[str, int] = {}
        for i, raw in enumerate(self.sequence(data, "queues")):
            queue = self.queue(raw, f"queues[{i}]")
            if queue.name in first:
                self.fail(
                    f"queues[{i}].name",
                    f"queue {queue.name!r} is defined twice (queues[{first[queue.name]}] and queues[{i}])",
                )
            elif queue.name:
                first[queue.name] = i
            queues.append(queue)
        return queues


def _load_document(path: Path, what: str) -> Mapping[str, Any]:
    data = load_yaml(path, what, SnapshotError)
    if not isinstance(data, Mapping):
        raise SnapshotError(f"{what} {path}: expected a mapping at the top of the document")
    return data


def parse_snapshot(data: Mapping[str, Any], source: str = "snapshot") -> Snapshot:
    reader = _Reader()
    data = reader.mapping(data, "", "snapshot")
    nodes = [reader.node(n, f"nodes[{i}]") for i, n in enumerate(reader.sequence(data.get("nodes"), "nodes"))]
    queues = reader.queues(data.get("queues"))
    jobs = [reader.job(j, f"jobs[{i}]") for i, j in enumerate(reader.sequence(data.get("jobs"), "jobs"))]
    config = reader.config(data.get("config"), "config")
    now = reader.time(data, "now", "", 0.0) or 0.0
    reader.raise_if_problems(source)
    return Snapshot(tuple(nodes), tuple(queues), tuple(jobs), now, config)


def load_snapshot(path: Path) -> Snapshot:
    return parse_snapshot(_load_document(path, "snapshot"), str(path))


def parse_fairshare(data: Mapping[str, Any], source: str = "fair-share input") -> FairShareInput:
    reader = _Reader()
    data = reader.mapping(data, "", "fair-share file")
    queues = reader.queues(data.get("queues"))
    capacity = {
        str(pool): reader.vector(v, f"capacity.{pool}")
        for pool, v in reader.mapping(data.get("capacity"), "capacity").items()
    }
    demand = {str(q): reader.vector(v, f"demand.{q}") for q, v in reader.mapping(data.get("demand"), "demand").items()}
    reader.raise_if_problems(source)
    return FairShareInput(tuple(queues), capacity, demand)


def load_fairshare(path: Path) -> FairShareInput:
    return parse_fairshare(_load_document(path, "fair-share file"), str(path))
