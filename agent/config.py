"""The agent's config file: thresholds, windows and the expected topology.

One YAML file (``--config``, env ``GPUWARDEN_CONFIG``) holds every tunable
of detection and judgement, each with a documented default so that an empty
file, or none, is a working configuration. The file is read once at startup:
a poll never re-reads it (the poll budget is milliseconds).

A malformed file is a startup error that names the bad key
(``pcie.window_s: expected a number, got 'abc'``): a typo in a threshold must
not silently become the default on a fleet of nodes.

Example with every key at its default::

    poll_interval_s: 10          # seconds between polls (XIDs are event-driven)
    kmsg_path: /dev/kmsg         # kernel log; missing or unreadable is logged, not fatal
    kmsg_state_file: null        # file remembering how far the kernel log was read this boot, so a
                                 # restarted agent does not announce the same XIDs again
    sysfs_root: /sys             # root of sysfs (tests point it at a fixture tree)
    hysteresis:
      raise_polls: 1             # polls a non-latched signal must be present before it is raised
      clear_polls: 3             # polls a non-latched signal must be absent before it clears
      clear_ratio: 0.5           # a rate fault clears only below threshold * clear_ratio
    gpu:
      expected_count: null       # GPUs the node must show; null: the most seen since boot (see state_file)
      state_file: null           # file remembering that count across agent restarts within one boot
      nvml_retry_initial_s: 1    # seconds to the first retry when NVML fails to initialise
      nvml_retry_max_s: 300      # the retry delay doubles up to this
      retired_pages_limit: 64    # pre-Ampere: retired pages that mean "replace the board"
    xid:
      unknown: event             # event or condition: what an XID missing from the catalogue raises
      unknown_action: RESET_GPU  # action of the condition when unknown is "condition"
      dedup_window_s: 10         # the same XID from NVML and the kernel log within this is one
      overrides: {}              # per XID, e.g. {94: {kind: hardware, action: RESET_GPU}} (kind: hardware,
                                 # application or ignore)
    nvlink:
      error_rate_per_min: 60     # replay+recovery+CRC errors per minute on one link, as their increase
                                 # within window_s (so by default: over 300 errors in 5 minutes)
      window_s: 300              # seconds the NVLink error rate is measured over
    pcie:
      replay_rate_per_min: 60    # PCIe replay counter growth per minute, measured as for nvlink
      window_s: 300              # seconds the PCIe replay rate is measured over
      gen_load_pct: 30           # a generation drop counts while GPU utilisation is at least this
      gen_sustained_s: 0         # >0: also count a drop lasting this long whatever the load
    infiniband:
      expected_rate_gbps: null   # the rate every port must run at; null: each port against the highest
                                 # rate it has run at itself
      expected_ports: []         # "mlx5_0/1": ports that must be up even if absent when the agent starts
      ignore_ports: []           # "mlx5_4/1": ports never judged (down on purpose, e.g. a management port);
                                 # every other port found is expected ACTIVE/LinkUp
      link_downed_hold_s: 600    # how long a link_downed increment keeps the port degraded
      netdev: true               # read netdev state and speed through netlink
    storage:
      mounts: []                 # shared-storage mounts that must answer, e.g. [{path: /mnt/shared, timeout_s: 5}]
    remediation:                 # what the agent does when the scheduler's remediation asks (GPUNode spec)
      nvidia_smi: nvidia-smi     # the binary that resets a GPU (NVML's Python binding has no reset call)
      reset_timeout_s: 30        # a reset still running after this is killed and reported Failed
      dcgmi: dcgmi               # run as `dcgmi diag -r <level>` during validation when found on PATH
      dcgm_diag_level: 1         # 1 takes seconds; 2 and 3 run for minutes
      dcgm_diag_timeout_s: 300   # a diagnostic still running after this is killed and fails the check
    pod_resources:               # the kubelet's PodResources API: which pod holds which GPU (GPUNode)
      socket: null               # its unix socket, e.g. /var/lib/kubelet/pod-resources/kubelet.sock; null: not read
      timeout_s: 2               # each call gives up after this (a hung kubelet costs a poll no more)
"""

from __future__ import annotations

import types
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from gpuwarden.contract import Action
from gpuwarden.flags import MAX_SECONDS, Bounds, bounded, brief, check_bounds
from gpuwarden.yamlfile import load_yaml, unknown_keys, yaml_number


class ConfigError(ValueError):
    """The config file is unusable; the message names the key."""


# The range of each numeric setting, declared once: the config file's loader
# checks the fields that carry them, and a setting that also has a flag
# (--poll-interval) parses it with the same Bounds (gpuwarden.flags). Upper
# bounds are generous but finite: an interval of 1e9 s polls once and never
# again while /healthz says all is well, and 1e300 overflows the timeouts of
# the threads that wait on it.
POLL_INTERVAL_S = Bounds(0.0, 3600.0)
_POLLS = Bounds(1, 1000, allow_low=True, integer=True)
_SHORT_S = Bounds(0.0, 3600.0)
_LONG_S = Bounds(0.0, MAX_SECONDS)
_HOLD_S = Bounds(0.0, MAX_SECONDS, allow_low=True)
_RATE = Bounds(0.0, 1e9)


@dataclass(frozen=True, slots=True)
class HysteresisConfig:
    raise_polls: int = bounded(1, _POLLS)
    clear_polls: int = bounded(3, _POLLS)
    clear_ratio: float = bounded(0.5, Bounds(0.0, 1.0))


@dataclass(frozen=True, slots=True)
class GpuConfig:
    expected_count: int | None = bounded(None, Bounds(0, 1024, allow_low=True, integer=True))
    state_file: str | None = None
    nvml_retry_initial_s: float = bounded(1.0, _SHORT_S)
    nvml_retry_max_s: float = bounded(300.0, _LONG_S)
    # 0 or less would flag every pre-Ampere GPU "replace the board" at once.
    retired_pages_limit: int = bounded(64, Bounds(1, 1_000_000, allow_low=True, integer=True))


@dataclass(frozen=True, slots=True)
class XidOverride:
    kind: str  # hardware | application | ignore
    action: str = Action.RESET_GPU.value
    meaning: str = ""


@dataclass(frozen=True, slots=True)
class XidConfig:
    unknown: str = "event"
    unknown_action: str = Action.RESET_GPU.value
    dedup_window_s: float = bounded(10.0, _SHORT_S)
    overrides: dict[int, XidOverride] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NvlinkConfig:
    error_rate_per_min: float = bounded(60.0, _RATE)
    window_s: float = bounded(300.0, _LONG_S)


@dataclass(frozen=True, slots=True)
class PcieConfig:
    replay_rate_per_min: float = bounded(60.0, _RATE)
    window_s: float = bounded(300.0, _LONG_S)
    gen_load_pct: int = bounded(30, Bounds(0, 100, allow_low=True, integer=True))
    gen_sustained_s: float = bounded(0.0, _HOLD_S)


@dataclass(frozen=True, slots=True)
class InfinibandConfig:
    expected_rate_gbps: float | None = bounded(None, Bounds(0.0, 100_000.0))
    expected_ports: list[str] = field(default_factory=list)
    ignore_ports: list[str] = field(default_factory=list)
    # A negative hold would drop an IbLinkDowned the poll it is raised.
    link_downed_hold_s: float = bounded(600.0, _HOLD_S)
    netdev: bool = True


@dataclass(frozen=True, slots=True)
class MountConfig:
    path: str
    timeout_s: float = bounded(5.0, _SHORT_S)


@dataclass(frozen=True, slots=True)
class StorageConfig:
    mounts: list[MountConfig] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RemediationConfig:
    nvidia_smi: str = "nvidia-smi"
    reset_timeout_s: float = bounded(30.0, _LONG_S)
    dcgmi: str = "dcgmi"
    dcgm_diag_level: int = bounded(1, Bounds(1, 4, allow_low=True, integer=True))
    dcgm_diag_timeout_s: float = bounded(300.0, _LONG_S)


@dataclass(frozen=True, slots=True)
class PodResourcesConfig:
    socket: str | None = None
    # Zero would fail every call; a long wait would hold the poll loop.
    timeout_s: float = bounded(2.0, Bounds(0.0, 60.0))


@dataclass(frozen=True, slots=True)
class AgentConfig:
    poll_interval_s: float = bounded(10.0, POLL_INTERVAL_S)
    kmsg_path: str = "/dev/kmsg"
    kmsg_state_file: str | None = None
    sysfs_root: str = "/sys"
    hysteresis: HysteresisConfig = field(default_factory=HysteresisConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    xid: XidConfig = field(default_factory=XidConfig)
    nvlink: NvlinkConfig = field(default_factory=NvlinkConfig)
    pcie: PcieConfig = field(default_factory=PcieConfig)
    infiniband: InfinibandConfig = field(default_factory=InfinibandConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    pod_resources: PodResourcesConfig = field(default_factory=PodResourcesConfig)


_ACTIONS = {a.value for a in Action}
_XID_KINDS = {"hardware", "application", "ignore"}


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {brief(value)}")
        (item,) = get_args(tp)
        return [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {brief(value)}")
        ktype, vtype = get_args(tp)
        return {_convert(ktype, k, f"{key}.{k}"): _convert(vtype, v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and hasattr(tp, "__dataclass_fields__"):
        return from_mapping(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {brief(value)}")
        if isinstance(value, int):
            return value
        # ASCII digits only: ``isdigit`` and ``int`` also take other scripts' digits.
        digits = value.strip().removeprefix("-") if isinstance(value, str) else ""
        # At most 18 digits: beyond every bound, and int() refuses thousands.
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {brief(value)}")
    if tp is float:
        number = yaml_number(value)
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {brief(value)}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {brief(value)}")
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def from_mapping(cls: type[Any], data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from parsed YAML, rejecting unknown keys.

    Errors name the dotted key under ``prefix``. Shared with the sim
    scenario files so both read alike.
    """
    where = prefix or "config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {brief(data)}")
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    for name, problem in unknown_keys(data, known):
        raise ConfigError(f"{prefix}.{name}: {problem}" if prefix else f"{name}: {problem}")
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        dotted = f"{prefix}.{name}" if prefix else name
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], dotted)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{dotted}: required key missing")
    return cls(**kwargs)


def _validate(cfg: AgentConfig) -> None:
    # Every number first, against the bounds its field declares. YAML reads
    # ``.nan`` and ``.inf`` as floats; every comparison with NaN is false, so
    # a NaN threshold or window would silently disable its rule: the bounds
    # take finite numbers only.
    for key, problem in check_bounds(cfg):
        raise ConfigError(f"{key}: {problem}")
    if cfg.gpu.state_file is not None and not cfg.gpu.state_file.startswith("/"):
        raise ConfigError(f"gpu.state_file: must be absolute, got {brief(cfg.gpu.state_file)}")
    if cfg.kmsg_state_file is not None and not cfg.kmsg_state_file.startswith("/"):
        raise ConfigError(f"kmsg_state_file: must be absolute, got {brief(cfg.kmsg_state_file)}")
    if cfg.xid.unknown not in {"event", "condition"}:
        raise ConfigError(f"xid.unknown: must be 'event' or 'condition', got {brief(cfg.xid.unknown)}")
    if cfg.xid.unknown_action not in _ACTIONS:
        raise ConfigError(f"xid.unknown_action: must be one of {sorted(_ACTIONS)}, got {brief(cfg.xid.unknown_action)}")
    for xid, ov in cfg.xid.overrides.items():
        if ov.kind not in _XID_KINDS:
            raise ConfigError(f"xid.overrides.{xid}.kind: must be one of {sorted(_XID_KINDS)}, got {brief(ov.kind)}")
        if ov.action not in _ACTIONS:
            raise ConfigError(f"xid.overrides.{xid}.action: must be one of {sorted(_ACTIONS)}, got {brief(ov.action)}")
    for key in ("expected_ports", "ignore_ports"):
        for i, port in enumerate(getattr(cfg.infiniband, key)):
            dev, sep, num = port.partition("/")
            # ASCII digits only: sysfs names ports 1, 2, ..., never in another script.
            if not sep or not dev or not (num.isascii() and num.isdigit()):
                raise ConfigError(f"infiniband.{key}[{i}]: expected 'device/port', got {brief(port)}")
    for i, port in enumerate(cfg.infiniband.ignore_ports):
        # Both required and ignored: a contradiction nobody meant.
        if port in cfg.infiniband.expected_ports:
            raise ConfigError(f"infiniband.ignore_ports[{i}]: {brief(port)} is also in expected_ports")
    for key in ("nvidia_smi", "dcgmi"):
        if not getattr(cfg.remediation, key).strip():
            raise ConfigError(f"remediation.{key}: must name a binary")
    for i, m in enumerate(cfg.storage.mounts):
        if not m.path.startswith("/"):
            raise ConfigError(f"storage.mounts[{i}].path: must be absolute, got {brief(m.path)}")


def config_from_dict(data: Any) -> AgentConfig:
    """Build and validate a config from parsed YAML (``None`` = all defaults)."""
    cfg: AgentConfig = from_mapping(AgentConfig, data, "")
    _validate(cfg)
    return cfg


def load_config(path: str | Path | None) -> AgentConfig:
    """Read the config file; ``None`` gives the defaults.

    A bad value's error names the file as well as the key: the same setting
    may also come from a flag or an environment variable, and the person
    reading the error must know which one to fix.
    """
    if path is None:
        return config_from_dict(None)
    data = load_yaml(path, "config file", ConfigError)
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
