"""The three spellings of a view: a table for people, JSON and YAML for scripts.

JSON and YAML are ``dataclasses.asdict`` of the views, so a script sees
every field the table is built from, under the same names; the table picks
the columns that fit a terminal and leaves long messages to their own
lines, as ``kubectl describe`` does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal, TextIO

import yaml

from gpuwarden.kubectl_plugin.views import DeviceView, NodeView, QueueView, WhyReport

Output = Literal["table", "json", "yaml"]
OUTPUTS: list[str] = ["table", "json", "yaml"]


def table(rows: Sequence[Sequence[str]], out: TextIO, indent: str = "") -> None:
    """Left-aligned columns two spaces apart, kubectl's layout; nothing for no rows."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(indent + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


def dump(data: Any, output: Output, out: TextIO) -> None:
    """``data`` (views, or lists of them) as JSON or YAML."""
    plain = [asdict(d) for d in data] if isinstance(data, list) else asdict(data)
    if output == "json":
        json.dump(plain, out, indent=2)
        out.write("\n")
    else:
        yaml.safe_dump(plain, out, sort_keys=False)


def _ratio(part: int | None, whole: int | None) -> str:
    return "-" if part is None or whole is None else f"{part}/{whole}"


def _dra(devices: Sequence[DeviceView] | None) -> str:
    """The node's DRA devices in one cell: how many, and how many of them carry a taint."""
    if devices is None:
        return "-"
    tainted = sum(1 for d in devices if d.taints)
    return f"{len(devices)}({tainted}tainted)" if tainted else str(len(devices))


def nodes_table(
    views: Sequence[NodeView], out: TextIO, *, devices: bool = False, broad_rules: Sequence[str] = ()
) -> None:
    """The fleet, a row per node; with ``devices``, each node's DRA devices below it (their taints, their claims)."""
    if not views:
        out.write("No GPU nodes found (no GPUNode objects, no DRA GPUs and no gpuwarden conditions).\n")
        return
    rows = [["NODE", "POOL", "GPUS", "IB", "STATE", "REPAIR", "QUARANTINED", "DRA", "CONDITIONS"]]
    for v in views:
        state = v.state + (",cordoned" if v.cordoned else "")
        conditions = ",".join(f"{c.type}({c.reason})" if c.reason else c.type for c in v.conditions)
        rows.append(
            [
                v.name,
                v.pool,
                _ratio(v.gpus_healthy, v.gpus_total),
                _ratio(v.ib_up, v.ib_total),
                state,
                v.repair_needed or "-",
                v.quarantined_gpus or "-",
                _dra(v.dra_devices),
                conditions or "-",
            ]
        )
    table(rows, out)
    for v in views if devices else ():
        if not v.dra_devices:
            continue
        out.write(f"\nDRA devices of {v.name}:\n")
        device_rows = [["DEVICE", "TYPE", "UUID", "CLAIMS", "TAINTS"]]
        for d in v.dra_devices:
            device_rows.append(
                [d.name, d.kind or "-", d.uuid or "-", ",".join(d.claims) or "-", "; ".join(d.taints) or "-"]
            )
        table(device_rows, out, indent="  ")
    if broad_rules:
        out.write(f"\nDeviceTaintRules that select more than one device: {', '.join(broad_rules)}\n")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def queues_table(views: Sequence[QueueView], out: TextIO) -> None:
    if not views:
        out.write("No queues found.\n")
        return
    rows = [
        [
            "QUEUE",
            "RESOURCE",
            "QUOTA",
            "LIMIT",
            "WEIGHT",
            "GUARANTEED",
            "FAIR SHARE",
            "ALLOCATED",
            "REQUESTED",
            "GPU-S LOST",
        ]
    ]
    for v in views:
        for i, r in enumerate(v.resources):
            first = i == 0
            rows.append(
                [
                    "  " * v.depth + v.name if first else "",
                    r.resource,
                    r.quota if r.quota is not None else "-",
                    r.limit if r.limit is not None else ("none" if r.governed else "-"),
                    r.over_quota_weight or "-",
                    r.guaranteed or "-",
                    r.fair_share or "-",
                    r.allocated or "-",
                    r.requested or "-",
                    _seconds(v.gpu_seconds_lost_to_faults) if first else "",
                ]
            )
    table(rows, out)
    problems = [(v.name, p) for v in views for p in v.problems]
    if problems:
        out.write("\n")
        for name, p in problems:
            out.write(f"queue {name}: {p.type} ({p.reason}): {p.message}\n")


def why_text(report: WhyReport, out: TextIO) -> None:
    out.write(f"Pod {report.namespace}/{report.pod}: {report.verdict}\n\n")
    if report.exists:
        out.write(f"  phase: {report.phase}\n")
        out.write(f"  node: {report.node or '(not bound)'}\n")
        out.write(f"  schedulerName: {report.scheduler_name or '(default)'}\n")
    out.write(f"  queue: {report.queue or '(none named)'}\n")
    for c in report.pod_conditions:
        out.write(f"  pod condition {c.type}={c.status} {c.reason}: {c.message}\n")
    group = report.pod_group
    out.write("\nPodGroup: ")
    if group is None:
        # Not made yet, or never: a pod placed at once whose group is its own needs none.
        out.write("none found (a pod whose group is its own gets one only when it has to wait)\n")
    else:
        size = group.min_member if group.min_member is not None else "?"
        out.write(f"{group.name} (queue {group.queue or '?'}, minMember {size}, phase {group.phase})\n")
        for c in group.conditions:
            out.write(f"  {c.type}={c.status} {c.reason}")
            out.write(f": {c.message}\n" if c.message else "\n")
        if group.reservations:
            out.write("  reservations (room held until the group binds there):\n")
            rows = [["NODE", "GPUS", "MiB/GPU", "EXPIRES"]]
            for r in group.reservations:
                rows.append(
                    [
                        r.node,
                        ",".join(map(str, r.gpus)) or "-",
                        ",".join(map(str, r.gpu_memory_mib)) or "-",
                        r.expires or "-",
                    ]
                )
            table(rows, out, indent="    ")
    if report.claims:
        out.write("\nResourceClaims (DRA):\n")
        for claim in report.claims:
            what = claim.claim or "(not made yet)"
            if not claim.allocated:
                out.write(f"  {claim.name}: {what}, not allocated\n")
                continue
            out.write(f"  {claim.name}: {what}, allocated {', '.join(claim.devices) or '(no devices)'}\n")
    out.write("\nEvents:")
    if not report.events:
        out.write(" none in the last hour\n")
        return
    out.write("\n")
    rows = [["LAST SEEN", "TYPE", "REASON", "OBJECT", "COUNT", "FROM", "MESSAGE"]]
    for e in report.events:
        rows.append([e.last_seen, e.type, e.reason, e.object, str(e.count), e.source or "-", e.message])
    table(rows, out, indent="  ")
