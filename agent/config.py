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
"""

from __future__ import annotations

import math
import types
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from gpuwarden.contract import Action
from gpuwarden.yamlfile import load_yaml, unknown_keys, yaml_number


class ConfigError(ValueError):
    """The config file is unusable; the message names the key."""


@dataclass(frozen=True, slots=True)
class HysteresisConfig:
    raise_polls: int = 1
    clear_polls: int = 3
    clear_ratio: float = 0.5


@dataclass(frozen=True, slots=True)
class GpuConfig:
    expected_count: int | None = None
    state_file: str | None = None
    nvml_retry_initial_s: float = 1.0
    nvml_retry_max_s: float = 300.0
    retired_pages_limit: int = 64


@dataclass(frozen=True, slots=True)
class XidOverride:
    kind: str  # hardware | application | ignore
    action: str = Action.RESET_GPU.value
    meaning: str = ""


@dataclass(frozen=True, slots=True)
class XidConfig:
    unknown: str = "event"
    unknown_action: str = Action.RESET_GPU.value
    dedup_window_s: float = 10.0
    overrides: dict[int, XidOverride] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NvlinkConfig:
    error_rate_per_min: float = 60.0
    window_s: float = 300.0


@dataclass(frozen=True, slots=True)
class PcieConfig:
    replay_rate_per_min: float = 60.0
    window_s: float = 300.0
    gen_load_pct: int = 30
    gen_sustained_s: float = 0.0


@dataclass(frozen=True, slots=True)
class InfinibandConfig:
    expected_rate_gbps: float | None = None
    expected_ports: list[str] = field(default_factory=list)
    ignore_ports: list[str] = field(default_factory=list)
    link_downed_hold_s: float = 600.0
    netdev: bool = True


@dataclass(frozen=True, slots=True)
class MountConfig:
    path: str
    timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class StorageConfig:
    mounts: list[MountConfig] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RemediationConfig:
    nvidia_smi: str = "nvidia-smi"
    reset_timeout_s: float = 30.0
    dcgmi: str = "dcgmi"
    dcgm_diag_level: int = 1
    dcgm_diag_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    poll_interval_s: float = 10.0
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
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item,) = get_args(tp)
        return [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        ktype, vtype = get_args(tp)
        return {_convert(ktype, k, f"{key}.{k}"): _convert(vtype, v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and hasattr(tp, "__dataclass_fields__"):
        return from_mapping(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        # ASCII digits only: ``isdigit`` and ``int`` also take other scripts' digits.
        digits = value.strip().removeprefix("-") if isinstance(value, str) else ""
        if digits.isascii() and digits.isdigit():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = yaml_number(value)
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
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
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
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
    # YAML reads ``.nan`` and ``.inf`` as floats. Every comparison with NaN is
    # false, so "value <= 0" lets it through, and a NaN threshold or window
    # silently disables its rule; an infinite one does the same. Both are
    # rejected wherever a finite number is meant.
    def positive(key: str, value: float) -> None:
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{key}: must be a finite number greater than 0, got {value!r}")

    def non_negative(key: str, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{key}: must be a finite number not below 0, got {value!r}")

    positive("poll_interval_s", cfg.poll_interval_s)
    if cfg.hysteresis.raise_polls < 1:
        raise ConfigError(f"hysteresis.raise_polls: must be at least 1, got {cfg.hysteresis.raise_polls}")
    if cfg.hysteresis.clear_polls < 1:
        raise ConfigError(f"hysteresis.clear_polls: must be at least 1, got {cfg.hysteresis.clear_polls}")
    if not 0 < cfg.hysteresis.clear_ratio <= 1:
        raise ConfigError(f"hysteresis.clear_ratio: must be in (0, 1], got {cfg.hysteresis.clear_ratio}")
    positive("gpu.nvml_retry_initial_s", cfg.gpu.nvml_retry_initial_s)
    positive("gpu.nvml_retry_max_s", cfg.gpu.nvml_retry_max_s)
    if cfg.gpu.state_file is not None and not cfg.gpu.state_file.startswith("/"):
        raise ConfigError(f"gpu.state_file: must be absolute, got {cfg.gpu.state_file!r}")
    if cfg.kmsg_state_file is not None and not cfg.kmsg_state_file.startswith("/"):
        raise ConfigError(f"kmsg_state_file: must be absolute, got {cfg.kmsg_state_file!r}")
    if cfg.gpu.expected_count is not None and cfg.gpu.expected_count < 0:
        raise ConfigError(f"gpu.expected_count: must not be negative, got {cfg.gpu.expected_count}")
    if cfg.gpu.retired_pages_limit < 1:
        # 0 or less would flag every pre-Ampere GPU "replace the board" at once.
        raise ConfigError(f"gpu.retired_pages_limit: must be at least 1, got {cfg.gpu.retired_pages_limit}")
    if cfg.xid.unknown not in {"event", "condition"}:
        raise ConfigError(f"xid.unknown: must be 'event' or 'condition', got {cfg.xid.unknown!r}")
    if cfg.xid.unknown_action not in _ACTIONS:
        raise ConfigError(f"xid.unknown_action: must be one of {sorted(_ACTIONS)}, got {cfg.xid.unknown_action!r}")
    for xid, ov in cfg.xid.overrides.items():
        if ov.kind not in _XID_KINDS:
            raise ConfigError(f"xid.overrides.{xid}.kind: must be one of {sorted(_XID_KINDS)}, got {ov.kind!r}")
        if ov.action not in _ACTIONS:
            raise ConfigError(f"xid.overrides.{xid}.action: must be one of {sorted(_ACTIONS)}, got {ov.action!r}")
    positive("xid.dedup_window_s", cfg.xid.dedup_window_s)
    positive("nvlink.error_rate_per_min", cfg.nvlink.error_rate_per_min)
    positive("nvlink.window_s", cfg.nvlink.window_s)
    positive("pcie.replay_rate_per_min", cfg.pcie.replay_rate_per_min)
    positive("pcie.window_s", cfg.pcie.window_s)
    non_negative("pcie.gen_sustained_s", cfg.pcie.gen_sustained_s)
    if cfg.infiniband.expected_rate_gbps is not None:
        positive("infiniband.expected_rate_gbps", cfg.infiniband.expected_rate_gbps)
    # A negative hold would drop an IbLinkDowned the poll it is raised.
    non_negative("infiniband.link_downed_hold_s", cfg.infiniband.link_downed_hold_s)
    for key in ("expected_ports", "ignore_ports"):
        for i, port in enumerate(getattr(cfg.infiniband, key)):
            dev, sep, num = port.partition("/")
            # ASCII digits only: sysfs names ports 1, 2, ..., never in another script.
            if not sep or not dev or not (num.isascii() and num.isdigit()):
                raise ConfigError(f"infiniband.{key}[{i}]: expected 'device/port', got {port!r}")
    for i, port in enumerate(cfg.infiniband.ignore_ports):
        # Both required and ignored: a contradiction nobody meant.
        if port in cfg.infiniband.expected_ports:
            raise ConfigError(f"infiniband.ignore_ports[{i}]: {port!r} is also in expected_ports")
    positive("remediation.reset_timeout_s", cfg.remediation.reset_timeout_s)
    positive("remediation.dcgm_diag_timeout_s", cfg.remediation.dcgm_diag_timeout_s)
    if cfg.remediation.dcgm_diag_level not in (1, 2, 3, 4):
        raise ConfigError(f"remediation.dcgm_diag_level: must be 1, 2, 3 or 4, got {cfg.remediation.dcgm_diag_level}")
    for key in ("nvidia_smi", "dcgmi"):
        if not getattr(cfg.remediation, key).strip():
            raise ConfigError(f"remediation.{key}: must name a binary")
    for i, m in enumerate(cfg.storage.mounts):
        positive(f"storage.mounts[{i}].timeout_s", m.timeout_s)
        if not m.path.startswith("/"):
            raise ConfigError(f"storage.mounts[{i}].path: must be absolute, got {m.path!r}")


def config_from_dict(data: Any) -> AgentConfig:
    """Build and validate a config from parsed YAML (``None`` = all defaults)."""
    cfg: AgentConfig = from_mapping(AgentConfig, data, "")
    _validate(cfg)
    return cfg


def load_config(path: str | Path | None) -> AgentConfig:
    """Read the config file; ``None`` gives the defaults."""
    if path is None:
        return config_from_dict(None)
    return config_from_dict(load_yaml(path, "config file", ConfigError))
