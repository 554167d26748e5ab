"""The config file: documented defaults, and bad keys named in the error."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.config import AgentConfig, ConfigError, config_from_dict, load_config
from gpuwarden.flags import BOUNDS, Bounds, bounds_of


def test_no_file_and_empty_file_give_the_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(None) == AgentConfig() == load_config(empty)
    cfg = AgentConfig()
    assert cfg.poll_interval_s == 10 and cfg.kmsg_path == "/dev/kmsg" and cfg.hysteresis.clear_polls == 3


def test_the_documented_example_is_the_defaults() -> None:
    import yaml

    import agent.config as module

    doc = module.__doc__ or ""
    example = doc.split("Example with every key at its default::", 1)[1]
    data = yaml.safe_load("\n".join(line[4:] for line in example.splitlines()))
    assert config_from_dict(data) == AgentConfig()


def test_values_are_read(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        """
poll_interval_s: 5
gpu: {expected_count: 8}
xid:
  unknown: condition
  overrides:
    94: {kind: hardware, action: RESET_GPU}
infiniband: {expected_rate_gbps: 400, expected_ports: [mlx5_0/1]}
storage:
  mounts:
    - {path: /mnt/shared, timeout_s: 2}
"""
    )
    cfg = load_config(path)
    assert cfg.poll_interval_s == 5.0 and cfg.gpu.expected_count == 8
    assert cfg.xid.overrides[94].kind == "hardware" and cfg.xid.unknown == "condition"
    assert cfg.infiniband.expected_ports == ["mlx5_0/1"]
    assert cfg.storage.mounts[0].path == "/mnt/shared" and cfg.storage.mounts[0].timeout_s == 2.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"poll_interval": 5}, "poll_interval: unknown key"),
        ({"pcie": {"window_s": "abc"}}, "pcie.window_s: expected a number, got 'abc'"),
        ({"pcie": {"window_s": -1}}, "pcie.window_s: must be a finite number greater than 0"),
        ({"nvlink": {"error_rate_per_min": float("nan")}}, "nvlink.error_rate_per_min: must be a finite number"),
        (
            {"nvlink": {"window_s": float("inf")}},
            "nvlink.window_s: must be a finite number greater than 0 and at most 86400, got inf",
        ),
        ({"poll_interval_s": float("-inf")}, "poll_interval_s: must be a finite number greater than 0"),
        (
            {"gpu": {"retired_pages_limit": 0}},
            "gpu.retired_pages_limit: must be a whole number at least 1 and at most 1e+06, got 0",
        ),
        (
            {"gpu": {"retired_pages_limit": -5}},
            "gpu.retired_pages_limit: must be a whole number at least 1 and at most 1e+06, got -5",
        ),
        (
            {"infiniband": {"link_downed_hold_s": -1}},
            "infiniband.link_downed_hold_s: must be a finite number at least 0",
        ),
        ({"infiniband": {"link_downed_hold_s": float("nan")}}, "infiniband.link_downed_hold_s: must be a finite"),
        ({"pcie": {"gen_sustained_s": float("nan")}}, "pcie.gen_sustained_s: must be a finite number at least 0"),
        ({"gpu": {"expected_count": 2.5}}, "gpu.expected_count: expected an integer"),
        ({"gpu": {"expected_count": True}}, "gpu.expected_count: expected an integer"),
        ({"gpu": []}, "gpu: expected a mapping"),
        ({"infiniband": {"netdev": "yes"}}, "infiniband.netdev: expected true or false"),
        ({"infiniband": {"expected_ports": ["mlx5_0"]}}, "infiniband.expected_ports[0]: expected 'device/port'"),
        ({"infiniband": {"expected_ports": ["mlx5_0/\u0661"]}}, "infiniband.expected_ports[0]: expected 'device/port'"),
        ({"infiniband": {"ignore_ports": ["mlx5_0/\u0661"]}}, "infiniband.ignore_ports[0]: expected 'device/port'"),
        ({"xid": {"unknown": "page"}}, "xid.unknown: must be 'event' or 'condition'"),
        ({"xid": {"overrides": {79: {"kind": "fatal"}}}}, "xid.overrides.79.kind: must be one of"),
        ({"xid": {"overrides": {79: {"kind": "hardware", "action": "PRAY"}}}}, "xid.overrides.79.action"),
        ({"xid": {"overrides": {"x": {"kind": "hardware"}}}}, "xid.overrides.x: expected an integer"),
        # Only ASCII digits are a number: "٩٤" is not XID 94, nor "٨" eight GPUs.
        ({"xid": {"overrides": {"\u0669\u0664": {"kind": "hardware"}}}}, "xid.overrides.\u0669\u0664: expected an"),
        ({"gpu": {"expected_count": "\u0668"}}, "gpu.expected_count: expected an integer"),
        ({"storage": {"mounts": [{"timeout_s": 3}]}}, "storage.mounts[0].path: required key missing"),
        ({"storage": {"mounts": [{"path": "rel"}]}}, "storage.mounts[0].path: must be absolute"),
        (
            {"hysteresis": {"clear_ratio": 2}},
            "hysteresis.clear_ratio: must be a finite number greater than 0 and at most 1, got 2",
        ),
        ([1, 2], "config: expected a mapping"),
    ],
)
def test_bad_config_names_the_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert message in str(err.value)


def test_yaml_nan_and_inf_are_rejected_by_key(tmp_path: Path) -> None:
    """YAML's own spellings reach the checks as floats, not strings."""
    path = tmp_path / "agent.yaml"
    path.write_text("pcie:\n  replay_rate_per_min: .nan\n")
    with pytest.raises(ConfigError, match=r"pcie\.replay_rate_per_min: must be a finite number .*, got nan"):
        load_config(path)
    path.write_text("xid:\n  dedup_window_s: .inf\n")
    with pytest.raises(
        ConfigError, match=r"xid\.dedup_window_s: must be a finite number greater than 0 and at most 3600, got inf"
    ):
        load_config(path)


def test_range_limits_themselves_are_accepted() -> None:
    cfg = config_from_dict({"gpu": {"retired_pages_limit": 1}, "infiniband": {"link_downed_hold_s": 0}})
    assert cfg.gpu.retired_pages_limit == 1 and cfg.infiniband.link_downed_hold_s == 0.0


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_a_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"kmsg_path: /dev/km\xffsg\n")
    with pytest.raises(ConfigError, match=rf"config file {path} is not UTF-8 text: byte 0xff at offset 18"):
        load_config(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"poll_interval": 5}, "poll_interval: unknown key 'poll_interval' (did you mean 'poll_interval_s'?)"),
        ({"pcie": {"windows": 5}}, "pcie.windows: unknown key 'windows' (did you mean 'window_s'?)"),
        ({"storage": {"mounts": [{"path": "/m", "timeut_s": 1}]}}, "did you mean 'timeout_s'?"),
    ],
)
def test_an_unknown_key_suggests_the_closest_known_one(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert message in str(err.value)


def test_an_exponent_without_a_dot_is_a_number(tmp_path: Path) -> None:
    """YAML 1.1 reads ``3e2`` as a string; where a number is meant it is one."""
    path = tmp_path / "agent.yaml"
    path.write_text("pcie:\n  window_s: 3e2\n")
    assert load_config(path).pcie.window_s == 300.0
    path.write_text("pcie:\n  window_s: 1e999\n")
    with pytest.raises(
        ConfigError, match=r"pcie\.window_s: must be a finite number greater than 0 and at most 86400, got inf"
    ):
        load_config(path)


def _documented_example() -> dict[str, Any]:
    import agent.config as module

    example = (module.__doc__ or "").split("Example with every key at its default::", 1)[1]
    data: dict[str, Any] = yaml.safe_load("\n".join(line[4:] for line in example.splitlines()))
    return data


def _field_names(cls: type[Any]) -> set[str]:
    """Every key of the config's schema, at any depth."""
    names: set[str] = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        for tp in (get_type_hints(cls)[f.name], *get_args(get_type_hints(cls)[f.name])):
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                names |= _field_names(tp)
    return names


def _mappings(value: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(value, dict) or path.endswith("overrides"):  # XIDs are the user's keys
        return []
    found = [(path, value)]
    for key, child in value.items():
        found += _mappings(child, f"{path}.{key}" if path else key)
    return found


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_any_misspelt_key_is_refused_by_name(data: st.DataObject) -> None:
    document = _documented_example()
    place, mapping = data.draw(st.sampled_from([m for m in _mappings(document, "") if m[1]]))
    key = data.draw(st.sampled_from(sorted(mapping)))
    at = data.draw(st.integers(0, len(key) - 1))
    typo = data.draw(st.sampled_from([key[:at] + key[at + 1 :], key[:at] + "x" + key[at:], key.upper()]))
    assume(typo and typo not in _field_names(AgentConfig))
    mapping[typo] = mapping.pop(key)
    dotted = f"{place}.{typo}" if place else typo
    with pytest.raises(ConfigError, match=re.escape(f"{dotted}: unknown key {typo!r}")):
        config_from_dict(document)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # Beyond the flag's cap: one poll, then silence while /healthz said healthy.
        ("poll_interval_s: 1.0e9\n", "poll_interval_s: must be a finite number greater than 0 and at most 3600"),
        # Beyond any timeout a thread can wait: OverflowError in the remediation thread.
        ("poll_interval_s: 1.0e300\n", "poll_interval_s: must be a finite number greater than 0 and at most 3600"),
        ("pcie: {gen_load_pct: 250}\n", "pcie.gen_load_pct: must be a whole number at least 0 and at most 100"),
        ("remediation: {reset_timeout_s: 1e12}\n", "remediation.reset_timeout_s: must be a finite number greater"),
        ("storage: {mounts: [{path: /m, timeout_s: 1e300}]}\n", "storage.mounts[0].timeout_s: must be a finite"),
        ("gpu: {expected_count: 99999999999999999999999}\n", "gpu.expected_count: must be a whole number at least 0"),
    ],
)
def test_a_value_beyond_its_bound_names_the_file_the_key_and_the_bound(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"config file {path}: ")
    assert says in str(err.value)


def _numeric_fields(cls: type[Any], prefix: str = "") -> list[tuple[str, dataclasses.Field[Any]]]:
    found: list[tuple[str, dataclasses.Field[Any]]] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if get_origin(hints[f.name]) in (dict, list):  # keys and items, not settings
            continue
        types_ = {hints[f.name], *get_args(hints[f.name])}
        for tp in types_:
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                found += _numeric_fields(tp, key)
        if types_ & {int, float} and bool not in types_:
            found.append((key, f))
    return found


def test_every_number_of_the_config_declares_its_bounds() -> None:
    """A numeric key without bounds would take 1e300 from the file, whatever its flag refuses."""
    from agent.config import MountConfig

    fields_ = _numeric_fields(AgentConfig) + _numeric_fields(MountConfig, "storage.mounts[]")
    assert fields_
    assert [key for key, f in fields_ if not isinstance(f.metadata.get(BOUNDS), Bounds)] == []


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**12)))
def test_the_poll_interval_flag_and_the_file_take_exactly_the_same_values(value: float) -> None:
    """--poll-interval and poll_interval_s are one setting, declared once: they agree on every value."""
    parse = bounds_of(AgentConfig, "poll_interval_s").flag_type()
    try:
        parse(repr(value))
        flag_ok = True
    except argparse.ArgumentTypeError:
        flag_ok = False
    try:
        config_from_dict({"poll_interval_s": value})
        file_ok = True
    except ConfigError:
        file_ok = False
    assert flag_ok == file_ok


def test_an_error_about_a_huge_value_stays_short() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"pcie": {"window_s": [list(range(100))] * 10_000}})
    assert len(str(err.value)) < 200
    with pytest.raises(ConfigError) as err:
        config_from_dict({"gpu": {"state_file": "x" * 1_000_000}})
    assert len(str(err.value)) < 200
