"""Drain policies and the machine's settings."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from scheduler.remediation.policy import (
    DeviceTaintEffect,
    DrainMode,
    DrainPolicies,
    DrainPolicy,
    PodDrainAction,
    Settings,
    SettingsError,
)


def test_each_drain_mode_decides_by_the_time_since_the_drain_began() -> None:
    immediate = DrainPolicy()
    finish = DrainPolicy(DrainMode.ALLOW_COMPLETION, 600)
    forced = DrainPolicy(DrainMode.DELETE_AFTER_TIMEOUT, 300)
    assert [immediate.pod_action(t) for t in (0, 10**6)] == [PodDrainAction.EVICT] * 2
    assert [finish.pod_action(t) for t in (0, 599, 600)] == [
        PodDrainAction.WAIT,
        PodDrainAction.WAIT,
        PodDrainAction.EVICT,
    ]
    assert [forced.pod_action(t) for t in (0, 300)] == [PodDrainAction.EVICT, PodDrainAction.DELETE]


def test_a_namespace_without_its_own_policy_gets_the_default() -> None:
    special = DrainPolicy(DrainMode.ALLOW_COMPLETION, 60)
    policies = DrainPolicies(namespaces=MappingProxyType({"training": special}))
    assert policies.for_namespace("training") == special and policies.for_namespace("web") == DrainPolicy()


def test_settings_from_a_config_section() -> None:
    settings = Settings.from_mapping(
        {
            "dry_run": True,
            "repeat_window_s": 86400,
            "max_reset_attempts": 2,
            "drain": {
                "default": {"mode": "allow-completion", "timeout_s": 1800},
                "namespaces": {"batch": {"mode": "delete-after-timeout", "timeout_s": 600}},
            },
            "breaker": {"max_out_fraction": 0.2, "max_out_nodes": 5, "max_concurrent_drains": 3},
            "device_taint_effect": "NoExecute",
        }
    )
    assert settings.device_taint_effect is DeviceTaintEffect.NO_EXECUTE
    assert settings.dry_run and settings.repeat_window_s == 86400 and settings.max_reset_attempts == 2
    assert settings.drain.for_namespace("batch") == DrainPolicy(DrainMode.DELETE_AFTER_TIMEOUT, 600)
    assert settings.drain.default == DrainPolicy(DrainMode.ALLOW_COMPLETION, 1800)
    assert (settings.breaker.max_out_fraction, settings.breaker.max_out_nodes) == (0.2, 5)
    assert Settings.from_mapping({}) == Settings()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"repeat_window": 5}, "unknown key(s) repeat_window"),
        ({"device_taint_effect": "NoEvict"}, "device_taint_effect: 'NoEvict' is not one of NoSchedule, NoExecute"),
        ({"reset_timeout_s": "10m"}, "remediation.reset_timeout_s must be a number"),
        ({"reset_timeout_s": 0}, "reset_timeout_s must be a finite number greater than 0"),
        ({"max_reset_attempts": 0}, "max_reset_attempts must be a whole number at least 1"),
        # Accepted once, and then an OverflowError in the datetime arithmetic of a pass.
        (
            {"repeat_window_s": 1.0e300},
            "remediation.repeat_window_s must be a finite number greater than 0 and at most",
        ),
        ({"validation_timeout_s": float("inf")}, "remediation.validation_timeout_s must be a finite number"),
        ({"history_limit": 10**9}, "remediation.history_limit must be a whole number at least 1 and at most 1000"),
        ({"drain": {"default": {"mode": "allow-completion", "timeout_s": 1e300}}}, "timeout_s must be"),
        ({"dry_run": "yes"}, "dry_run must be true or false"),
        ({"drain": {"default": {"mode": "gently"}}}, "remediation.drain.default.mode: 'gently' is not one of"),
        ({"drain": {"default": {"mode": "allow-completion"}}}, "needs a timeout_s above 0"),
        ({"drain": {"namespaces": {"a": {"timeout_s": -1}}}}, "remediation.drain.namespaces.a"),
        ({"drain": {"namespaces": []}}, "remediation.drain.namespaces must be a mapping"),
        ({"breaker": {"max_out_fraction": 2}}, "remediation.breaker.max_out_fraction"),
        ({"breaker": {"max_out_nodes": 1.5}}, "max_out_nodes must be an integer"),
        (
            {"drain_timeout_s": 600, "drain": {"default": {"mode": "allow-completion", "timeout_s": 600}}},
            "must be longer than every drain policy's timeout",
        ),
    ],
)
def test_bad_settings_stop_with_the_key_named(data: dict[str, object], says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_mapping(data)
    assert says in str(caught.value)
