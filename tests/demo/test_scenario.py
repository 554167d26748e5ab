"""The demo's scenario file: its agents' settings hold the agent's own bounds, checked when it loads."""

from __future__ import annotations

import pytest

from agent.config import ConfigError
from demo.scenario import load_scenario, scenario_from_dict


@pytest.mark.parametrize(
    ("cluster", "says"),
    [
        ({"poll_interval_s": 1e9}, "cluster.poll_interval_s: must be a finite number at least 0.1 and at most 3600"),
        ({"poll_interval_s": 0.01}, "cluster.poll_interval_s: must be a finite number at least 0.1"),
        ({"heartbeat_period_s": 1e300}, "cluster.heartbeat_period_s: must be a finite number greater than 0"),
    ],
)
def test_an_agent_setting_beyond_the_agents_bounds_is_refused_at_load(cluster: dict[str, float], says: str) -> None:
    with pytest.raises(ConfigError, match=r"^demo scenario: ") as err:
        scenario_from_dict({"cluster": cluster})
    assert says in str(err.value)


def test_the_shipped_default_scenario_is_within_the_bounds() -> None:
    scenario = load_scenario("default")
    assert 0.1 <= scenario.cluster.poll_interval_s <= 3600
