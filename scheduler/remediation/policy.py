"""How remediation drains, how long it waits, and how often it tries.

Drain policy, per namespace, with a default for the rest. Teams differ: an
inference service behind a load balancer loses nothing when a replica is
evicted at once; a training job checkpoints every hour and would rather
finish its step; a batch job that ignores SIGTERM must be removed in the end
or the node never gets repaired.

- ``immediate``: evict now (Eviction API, so PodDisruptionBudgets hold).
- ``allow-completion``: leave the pod running up to ``timeout_s`` after the
  drain began, so it can finish; then evict it.
- ``delete-after-timeout``: evict now; a pod still there ``timeout_s`` after
  the drain began (a PDB refusing, a pod that never exits) is deleted, which
  PDBs do not stop. For namespaces whose owners accept that: the
  scheduler's admission policy admits the delete only in a namespace its
  admins labelled ``gpuwarden.io/drain-policy=delete-after-timeout``
  (contract.LABEL_DRAIN_POLICY), which the scheduler cannot label itself.

Timeouts count from the drain's start as recorded on the Node, so a
restarted scheduler neither restarts nor forgets them.

The machine's settings: the repeat window (a fault coming back on the same
hardware within it asks for replacement, not another reset), how long each
waiting state may last before the workflow moves on (a reset the agent never
reports counts as failed; a drain that never ends fails the workflow and
calls a person), and how many resets to try. Settings are checked when they
are built, with the key named, so a bad config stops the scheduler at start
rather than in the middle of a repair.

The config file (``gpuwarden scheduler --remediation-config``) holds
:class:`Settings`, its keys the field names; ``--remediation dry-run`` sets
``dry_run``.

Example with every key at its default::

    dry_run: false               # record workflows and write Events saying what would be done; change nothing
    repeat_window_s: 604800      # a fault on hardware (a GPU by UUID, or the node) that started a workflow
                                 # within this long (7 days) asks for REPLACE, not another reset or reboot
    drain_timeout_s: 21600       # a drain still waiting for pods after this (6 hours) fails the workflow
    reset_timeout_s: 600         # a GPU reset the agent has not reported by then counts as failed
    validation_timeout_s: 3600   # a validation the agent has not reported by then counts as failed
    max_reset_attempts: 1        # GPU resets tried before the GPU's node is escalated to REBOOT
    history_limit: 32            # workflow starts the Node's record keeps for the repeat window
    drain:
      default:
        mode: immediate          # drain policy of every namespace not listed below:
                                 # immediate, allow-completion or delete-after-timeout
        timeout_s: 0             # allow-completion: how long a pod may run on; delete-after-timeout: when
                                 # a pod still there is deleted
      namespaces: {}             # the namespaces whose policy differs, each as default is written, e.g.
                                 # {training: {mode: allow-completion, timeout_s: 3600}}
    breaker:
      max_out_fraction: 0.1      # per node pool: at most this share of its nodes (at least one) out at once,
                                 # for any reason; a quarantine beyond it is held
      max_out_nodes: null        # per node pool: and at most this many nodes (null: no such limit)
      max_concurrent_drains: 10  # per node pool: nodes drained at once
    device_taint_effect: NoSchedule  # the DeviceTaintRule on a quarantined GPU's DRA device: NoSchedule, or
                                 # NoExecute, which also has Kubernetes evict the pods using the device at
                                 # once, asking no PodDisruptionBudget (needs the admission policy's
                                 # noexecute-device-taints component)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import get_type_hints

from gpuwarden.contract import SCHEDULER_COMPONENT
from gpuwarden.flags import Bounds, bounded, check_bounds
from scheduler.remediation.breaker import BreakerSettings, BreakerSettingsError

DAY_S = 86400.0


class SettingsError(ValueError):
    """A remediation setting that cannot be used; the message names the key."""


class DrainMode(StrEnum):
    IMMEDIATE = "immediate"
    ALLOW_COMPLETION = "allow-completion"
    DELETE_AFTER_TIMEOUT = "delete-after-timeout"


class PodDrainAction(StrEnum):
    """What to do with one pod of a draining scope right now."""

    WAIT = "wait"  # let it run (allow-completion, before its timeout)
    EVICT = "evict"  # Eviction API: PDBs respected
    DELETE = "delete"  # plain delete: the policy's timeout passed


# The longest any remediation timer may be: a year. Longer is a typo (or an
# overflow waiting in datetime arithmetic), not a policy.
MAX_TIMER_S = 366 * DAY_S


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    mode: DrainMode = DrainMode.IMMEDIATE
    timeout_s: float = bounded(0.0, Bounds(0.0, MAX_TIMER_S, allow_low=True))

    def __post_init__(self) -> None:
        for key, problem in check_bounds(self):
            raise SettingsError(f"drain {key} {problem}")
        if self.mode is not DrainMode.IMMEDIATE and self.timeout_s <= 0:
            raise SettingsError(f"drain mode {self.mode} needs a timeout_s above 0")

    def pod_action(self, elapsed_s: float) -> PodDrainAction:
        """What to do with a pod ``elapsed_s`` after the drain began."""
        if self.mode is DrainMode.IMMEDIATE:
            return PodDrainAction.EVICT
        if self.mode is DrainMode.ALLOW_COMPLETION:
            return PodDrainAction.EVICT if elapsed_s >= self.timeout_s else PodDrainAction.WAIT
        return PodDrainAction.DELETE if elapsed_s >= self.timeout_s else PodDrainAction.EVICT


@dataclass(frozen=True, slots=True)
class DrainPolicies:
    """The default drain policy and the namespaces that differ from it."""

    default: DrainPolicy = DrainPolicy()
    namespaces: Mapping[str, DrainPolicy] = field(default_factory=lambda: MappingProxyType({}))

    def for_namespace(self, namespace: str) -> DrainPolicy:
        return self.namespaces.get(namespace, self.default)

    @property
    def longest_timeout_s(self) -> float:
        return max([self.default.timeout_s, *(p.timeout_s for p in self.namespaces.values())])


class DeviceTaintEffect(StrEnum):
    """The effect of gpuwarden's DeviceTaintRule on a quarantined GPU's device (scheduler/remediation/devicetaints.py).

    ``NoSchedule`` (the default) keeps new claims off the device; the pods
    that use it leave through remediation's drain, gang-aware, through the
    Eviction API, so PodDisruptionBudgets hold. ``NoExecute`` also has
    kube-controller-manager's device-taint eviction controller delete those
    pods at once, which no PodDisruptionBudget stops: only for clusters that
    would rather lose the pods than wait, and the scheduler's admission
    policy refuses it unless its ``noexecute-device-taints`` component is
    applied.
    """

    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the transition function needs besides the record and observations.

    ``actor`` is recorded as who quarantined; ``history_limit`` bounds the
    repeat history kept in the annotation.
    """

    dry_run: bool = False
    repeat_window_s: float = bounded(7 * DAY_S, Bounds(0.0, MAX_TIMER_S))
    drain_timeout_s: float = bounded(6 * 3600.0, Bounds(0.0, MAX_TIMER_S))
    reset_timeout_s: float = bounded(600.0, Bounds(0.0, MAX_TIMER_S))
    validation_timeout_s: float = bounded(3600.0, Bounds(0.0, MAX_TIMER_S))
    max_reset_attempts: int = bounded(1, Bounds(1, 100, allow_low=True, integer=True))
    history_limit: int = bounded(32, Bounds(1, 1000, allow_low=True, integer=True))
    drain: DrainPolicies = DrainPolicies()
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    device_taint_effect: DeviceTaintEffect = DeviceTaintEffect.NO_SCHEDULE
    actor: str = SCHEDULER_COMPONENT

    def __post_init__(self) -> None:
        # The same bounds whether the value came from the file or from code.
        for key, problem in check_bounds(self):
            raise SettingsError(f"remediation.{key} {problem}")
        if self.drain.longest_timeout_s >= self.drain_timeout_s:
            raise SettingsError(
                f"remediation.drain_timeout_s ({self.drain_timeout_s:g}) must be longer than every drain policy's "
                f"timeout ({self.drain.longest_timeout_s:g}): the drain would fail before the policy evicts"
            )
        if not self.actor:
            raise SettingsError("remediation.actor must not be empty")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> Settings:
        """Settings from the config file (parsed YAML); the keys are in the module docstring.

        Every field but those in :data:`NOT_IN_FILE` is a key, read by its
        type. Unknown keys are errors: a misspelt timeout silently left at its
        default is worse than a scheduler that does not start.
        """
        _no_unknown(data, set(file_keys()), "remediation")
        hints = get_type_hints(cls)
        kwargs: dict[str, object] = {}
        for key in file_keys():
            if key in data:
                kwargs[key] = _PARSERS[hints[key]](data[key], f"remediation.{key}")
        return cls(**kwargs)  # type: ignore[arg-type]


# Settings fields that are the scheduler's own, not the config file's: who it records as the actor.
NOT_IN_FILE = frozenset({"actor"})


def file_keys() -> tuple[str, ...]:
    """The config file's top-level keys, in field order: the fields of :class:`Settings` it may set."""
    return tuple(f.name for f in fields(Settings) if f.name not in NOT_IN_FILE)


def _no_unknown(data: Mapping[str, object], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise SettingsError(f"{where} must be a mapping")
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(f"{where} must be a number, got {value!r}")
    return float(value)


def _integer(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{where} must be an integer, got {value!r}")
    return value


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{where} must be true or false")
    return value


def _names(cls: type[object]) -> set[str]:
    return {f.name for f in fields(cls)}  # type: ignore[arg-type]


def _drain_policy(value: object, where: str) -> DrainPolicy:
    data = _mapping(value, where)
    _no_unknown(data, _names(DrainPolicy), where)
    mode_text = data.get("mode", DrainPolicy().mode.value)
    try:
        mode = DrainMode(str(mode_text))
    except ValueError:
        choices = ", ".join(m.value for m in DrainMode)
        raise SettingsError(f"{where}.mode: {mode_text!r} is not one of {choices}") from None
    timeout = _number(data.get("timeout_s", 0), f"{where}.timeout_s")
    try:
        return DrainPolicy(mode, timeout)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def _drain_policies(value: object, where: str = "remediation.drain") -> DrainPolicies:
    data = _mapping(value, where)
    _no_unknown(data, _names(DrainPolicies), where)
    default = _drain_policy(data["default"], "remediation.drain.default") if "default" in data else DrainPolicy()
    spaces = _mapping(data.get("namespaces", {}), "remediation.drain.namespaces")
    return DrainPolicies(
        default,
        MappingProxyType(
            {name: _drain_policy(p, f"remediation.drain.namespaces.{name}") for name, p in sorted(spaces.items())}
        ),
    )


def _breaker(value: object, where: str = "remediation.breaker") -> BreakerSettings:
    data = _mapping(value, where)
    _no_unknown(data, _names(BreakerSettings), where)
    kwargs: dict[str, object] = {}
    if "max_out_fraction" in data:
        kwargs["max_out_fraction"] = _number(data["max_out_fraction"], f"{where}.max_out_fraction")
    if "max_out_nodes" in data:
        nodes = data["max_out_nodes"]
        kwargs["max_out_nodes"] = None if nodes is None else _integer(nodes, f"{where}.max_out_nodes")
    if "max_concurrent_drains" in data:
        kwargs["max_concurrent_drains"] = _integer(data["max_concurrent_drains"], f"{where}.max_concurrent_drains")
    try:
        return BreakerSettings(**kwargs)  # type: ignore[arg-type]
    except BreakerSettingsError as exc:
        raise SettingsError(f"remediation.{exc}") from None


def _effect(value: object, where: str) -> DeviceTaintEffect:
    try:
        return DeviceTaintEffect(str(value))
    except ValueError:
        choices = ", ".join(e.value for e in DeviceTaintEffect)
        raise SettingsError(f"{where}: {value!r} is not one of {choices}") from None


# How each type of a file key is read; a new key's type must be here.
_PARSERS: dict[object, Callable[[object, str], object]] = {
    bool: _boolean,
    float: _number,
    int: _integer,
    DrainPolicies: _drain_policies,
    BreakerSettings: _breaker,
    DeviceTaintEffect: _effect,
}


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's settings: the machine's, and where escalations are sent.

    Escalations are POSTed to ``webhook_url`` as JSON
    (:meth:`scheduler.remediation.steps.Escalate.payload`); None sends none.
    """

    machine: Settings = field(default_factory=Settings)
    webhook_url: str | None = None
    webhook_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        url = self.webhook_url
        if url is not None and not (url.startswith("http://") or url.startswith("https://")):
            raise SettingsError(f"the escalation webhook must be an http:// or https:// URL, got {url!r}")
        if not self.webhook_timeout_s > 0:
            raise SettingsError(f"the escalation webhook timeout must be above 0, got {self.webhook_timeout_s}")
