"""The shipped Grafana dashboard: a valid dashboard whose every query names a metric gpuwarden exports.

A dashboard panel over a metric nobody exports shows "No data" forever and
looks like a healthy fleet; so each PromQL expression is read for the
metric names it uses, and each must be a family of the agent, the
scheduler or remediation (their ``FAMILIES`` tables, which the README's
metric tables are checked against too).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from agent.publish.metrics import FAMILIES as AGENT_FAMILIES
from scheduler.cluster.metrics import FAMILIES as SCHEDULER_FAMILIES
from scheduler.remediation.metrics import FAMILIES as REMEDIATION_FAMILIES

DASHBOARD = Path(__file__).resolve().parent.parent / "manifests" / "monitoring" / "gpuwarden-dashboard.json"
DATASOURCE = "${datasource}"
GRID_WIDTH = 24
# What a histogram family exports besides its name.
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
_METRIC = re.compile(r"\bgpuwarden_[a-z0-9_]+\b")


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _exported() -> set[str]:
    names: set[str] = set()
    for doc in (*AGENT_FAMILIES, *SCHEDULER_FAMILIES, *REMEDIATION_FAMILIES):
        names.add(doc.name)
        if doc.kind == "histogram":
            names.update(doc.name + suffix for suffix in HISTOGRAM_SERIES)
    return names


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["definition"]


def test_every_queried_metric_is_one_gpuwarden_exports() -> None:
    exported = _exported()
    unknown = sorted(
        f"{where}: {name}"
        for where, expr in _queries(_dashboard())
        for name in _METRIC.findall(expr)
        if name not in exported
    )
    assert unknown == []
    # The check reads something: every expression names at least one gpuwarden metric.
    assert all(_METRIC.search(expr) for _, expr in _queries(_dashboard()))


def test_it_is_a_dashboard_with_a_datasource_variable_unique_ids_and_panels_that_query() -> None:
    dashboard = _dashboard()
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    queried = [p for p in panels if p["type"] != "row"]
    assert len(queried) >= 20
    for panel in queried:
        where = panel["title"]
        assert panel["datasource"]["uid"] == DATASOURCE, where
        assert panel["targets"], where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        assert all(t["datasource"]["uid"] == DATASOURCE and t["expr"].strip() for t in panel["targets"]), where
        assert panel.get("description"), f"{where}: say what the panel shows"
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
    # Every $variable a query uses is defined.
    used = {m for _, expr in _queries(dashboard) for m in re.findall(r"\$(\w+)", expr)}
    assert used - {"__rate_interval", "__range", "__interval"} <= set(variables)


def test_it_covers_what_an_operator_watches() -> None:
    used = {name for _, expr in _queries(_dashboard()) for name in _METRIC.findall(expr)}
    wanted = {
        "gpuwarden_gpu_healthy",  # fleet health
        "gpuwarden_node_condition",
        "gpuwarden_xid_events_total",  # XIDs over time by code
        "gpuwarden_gpu_remapped_rows_total",
        "gpuwarden_nvlink_up",
        "gpuwarden_pcie_link_width",
        "gpuwarden_infiniband_port_rate_bytes_per_second",
        "gpuwarden_scheduler_queue_fair_share",  # fair share against allocation
        "gpuwarden_scheduler_queue_allocated",
        "gpuwarden_remediation_nodes",  # remediation states and time in state
        "gpuwarden_remediation_workflow_state_since_timestamp_seconds",
        "gpuwarden_queue_gpu_seconds_lost_to_faults_total",  # work lost to faults
        "gpuwarden_scheduler_cycle_duration_seconds_bucket",
        "gpuwarden_scheduler_pending_pods",
    }
    assert wanted - used == set()


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expression, with Grafana's variables given values as Grafana would."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: run `make tools` (installs Debian's prometheus package)"
    values = {"$__rate_interval": "2m", "$__range": "6h", "$__interval": "30s", "$node": ".*", "$queue": ".*"}
    rules = []
    for i, (_, expr) in enumerate(q for q in _queries(_dashboard()) if not q[0].startswith("variable ")):
        filled = expr
        for name, value in values.items():
            filled = filled.replace(name, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": filled})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout
