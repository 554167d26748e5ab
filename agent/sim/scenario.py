"""Sim scenario files: their schema, and loading them by name or path.

A scenario is read with the agent config's loader (:func:`agent.config.from_mapping`),
so an unknown key or a wrongly typed value is reported with its path, and a
time or rate that is not a finite number is refused by key. Each
timeline fault is checked against the fault table (:data:`agent.sim.faults.FAULTS`)
when the file is loaded, not when the fault comes due minutes into a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agent.config import ConfigError, from_mapping
from agent.sim.faults import FAULTS, missing_params
from gpuwarden.yamlfile import load_yaml, parse_yaml

# The package the shipped scenario files are data of.
_SHIPPED = "agent.sim.scenarios"


@dataclass(frozen=True, slots=True)
class SimGpus:
    count: int = 8
    model: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    nvlinks: int = 18
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    # False: a pre-Ampere GPU with dynamic page retirement instead.
    row_remapping: bool = True
    utilization_pct: int = 0
    mig: bool = False


@dataclass(frozen=True, slots=True)
class SimInfiniband:
    hcas: int = 8
    ports_per_hca: int = 1
    rate_gbps: float = 400.0
    link_layer: str = "InfiniBand"
    netdevs: bool = True


@dataclass(frozen=True, slots=True)
class SimReset:
    """How the simulated ``nvidia-smi --gpu-reset`` answers: a reset of one of
    ``fail_gpus`` fails with ``error`` (the failure path of remediation, which
    escalates to a reboot); any other reset succeeds once no process uses the GPU."""

    fail_gpus: list[int] = field(default_factory=list)
    error: str = "Unable to reset this GPU: it is in a state that needs a node reboot (simulated)"


@dataclass(frozen=True, slots=True)
class SimFault:
    """One timeline entry: fault ``inject`` at ``at`` seconds after start,
    with the parameters its kind takes (the others stay ``None``)."""

    at: float
    inject: str
    gpu: int | None = None
    xid: int | None = None
    message: str | None = None
    link: int | None = None
    count: int | None = None
    width: int | None = None
    gen: int | None = None
    pct: int | None = None
    device: str | None = None
    port: int | None = None
    rate_gbps: float | None = None
    path: str | None = None

    def params(self) -> dict[str, Any]:
        names = ("gpu", "xid", "message", "link", "count", "width", "gen", "pct", "device", "port", "rate_gbps", "path")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str = "sim"
    description: str = ""
    gpus: SimGpus = field(default_factory=SimGpus)
    infiniband: SimInfiniband = field(default_factory=SimInfiniband)
    mounts: list[str] = field(default_factory=list)
    faults: list[SimFault] = field(default_factory=list)
    reset: SimReset = field(default_factory=SimReset)


def _finite(source: str, key: str, value: float, minimum: float, inclusive: bool) -> None:
    # YAML reads .nan and .inf as floats: a NaN or infinite time never comes
    # due, and a NaN rate would make the simulated port neither up to speed nor
    # degraded, so both are refused where they are read.
    if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
        bound = f"not below {minimum:g}" if inclusive else f"greater than {minimum:g}"
        raise ConfigError(f"{source}: {key}: must be a finite number {bound}, got {value!r}")


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    try:
        sc: Scenario = from_mapping(Scenario, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    _finite(source, "infiniband.rate_gbps", sc.infiniband.rate_gbps, 0, inclusive=False)
    for i, f in enumerate(sc.faults):
        _finite(source, f"faults[{i}].at", f.at, 0, inclusive=True)
        if f.rate_gbps is not None:
            _finite(source, f"faults[{i}].rate_gbps", f.rate_gbps, 0, inclusive=False)
        if f.inject not in FAULTS:
            raise ConfigError(f"{source}: faults[{i}].inject: unknown kind {f.inject!r} (known: {', '.join(FAULTS)})")
        missing = missing_params(f.inject, f.params())
        if missing:
            raise ConfigError(f"{source}: faults[{i}]: {f.inject} needs {', '.join(missing)}")
    return sc


def list_scenarios() -> list[str]:
    """Names of the scenarios shipped in the package."""
    root = resources.files(_SHIPPED)
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``default``) or a scenario file by path."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or "/" in name_or_path:
        return scenario_from_dict(load_yaml(path, "scenario file", ConfigError), str(path))
    res = resources.files(_SHIPPED).joinpath(f"{name_or_path}.yaml")
    if not res.is_file():
        raise ConfigError(f"no scenario named {name_or_path!r} (shipped: {', '.join(list_scenarios())})")
    source = f"scenario {name_or_path}"
    return scenario_from_dict(parse_yaml(res.read_text(), source, ConfigError), source)
