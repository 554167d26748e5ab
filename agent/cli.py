"""``gpuwarden agent``: the per-node health agent (flags and entry point).

``--once`` polls the node once and prints the report (text or JSON): with
``--backend sim`` it needs no GPU and no cluster, which is what ``make run``
does. Without ``--once`` the agent polls until SIGTERM/SIGINT and hands every
report to its report handlers (:func:`build_monitor` is shared with the
publishing side, which adds its own handlers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Any

from agent.config import AgentConfig, ConfigError, load_config
from agent.hardware import build_hardware
from agent.model import HealthReport
from agent.monitor import Monitor
from agent.publish.settings import add_flags as add_publish_flags
from agent.samples import NodeSample
from gpuwarden.contract import HEALTHY_REASONS, ConditionType, Reason
from gpuwarden.flags import add_flag, bounds_of
from gpuwarden.logconfig import get_logger
from gpuwarden.serving import security_from_args

log = get_logger(__name__)


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "agent",
        help="run the per-node GPU health agent",
        description="Detect GPU, InfiniBand and shared-storage faults on this node and judge them.",
    )
    add_flag(parser, "--backend", choices=["nvml", "sim"], default="nvml", help="hardware backend")
    add_flag(
        parser,
        "--scenario",
        default="default",
        help="sim backend: a shipped scenario name or a scenario YAML file",
    )
    add_flag(parser, "--config", default=None, help="agent config file (YAML); defaults apply without one")
    add_flag(
        parser,
        "--node-name",
        # NODE_NAME: the usual downward-API variable (spec.nodeName) in a DaemonSet.
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="name of this Kubernetes node",
    )
    add_flag(
        parser,
        "--poll-interval",
        # The config file's poll_interval_s, so both refuse the same values.
        type=bounds_of(AgentConfig, "poll_interval_s").flag_type("number of seconds"),
        default=None,
        help="seconds between polls (overrides config)",
    )
    add_flag(parser, "--kmsg-path", default=None, help="kernel log to read (overrides config)")
    add_flag(parser, "--sysfs-root", default=None, help="sysfs root for InfiniBand (overrides config)")
    add_flag(
        parser,
        "--pod-resources-socket",
        default=None,
        help="the kubelet's PodResources socket: which pod holds which GPU (overrides config; '' turns it off)",
    )
    add_flag(parser, "--once", action="store_true", help="poll once, print the report and exit")
    add_flag(parser, "--output", choices=["text", "json"], default="text", help="--once report format")
    add_publish_flags(parser)
    parser.set_defaults(func=run)


def effective_config(args: argparse.Namespace) -> AgentConfig:
    """The config file with command-line overrides applied."""
    cfg = load_config(args.config)
    overrides: dict[str, Any] = {}
    if args.poll_interval is not None:  # range-checked by its flag type, with the file's bounds
        overrides["poll_interval_s"] = args.poll_interval
    if args.kmsg_path is not None:
        overrides["kmsg_path"] = args.kmsg_path
    if args.sysfs_root is not None:
        overrides["sysfs_root"] = args.sysfs_root
    if args.pod_resources_socket is not None:
        overrides["pod_resources"] = dataclasses.replace(cfg.pod_resources, socket=args.pod_resources_socket or None)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def build_monitor(args: argparse.Namespace) -> Monitor:
    """Config, hardware and monitor from the agent's flags."""
    cfg = effective_config(args)
    hardware = build_hardware(args.backend, cfg, scenario=args.scenario)
    return Monitor(cfg, hardware, args.node_name)


# ---------------------------------------------------------------------------
# Printing a report
# ---------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def report_json(report: HealthReport, sample: NodeSample | None = None) -> str:
    body: dict[str, Any] = {"report": _jsonable(report), "action": report.action.value}
    if sample is not None:
        body["sample"] = _jsonable(sample)
    return json.dumps(body, indent=2)


def format_report(report: HealthReport) -> str:
    """The report as a person reads it: inventory, conditions, events.

    A condition no rule could judge this poll, with no fault held, is
    ``Unknown``: "GpuMissing False AllGpusPresent" while NVML is down would
    claim GPUs nobody could see. (A published Node keeps such a condition as
    it was; one poll has nothing to keep.)
    """
    lines = [f"gpuwarden agent report: node {report.node} at {report.time.isoformat(timespec='seconds')}"]
    for err in report.errors:
        lines.append(f"  ! {err}")
    lines.append("")
    lines.append(f"GPUs ({len(report.gpus)}):")
    if not report.gpus:
        lines.append("  none visible" if not report.errors else "  unknown (see errors above)")
    for g in report.gpus:
        health = "healthy" if g.healthy else "UNHEALTHY " + ",".join(f.reason for f in g.faults)
        if not g.healthy and not g.faults:
            health = "UNHEALTHY lost"
        mig = " MIG" if g.mig_enabled else ""
        lines.append(f"  {g.index:>2}  {g.model}  {g.uuid}  {g.pci_bus_id}  {g.memory_total_mib} MiB{mig}  {health}")
    lines.append(f"  healthy GPU memory: {report.healthy_gpu_memory_mib} MiB")
    lines.append("")
    lines.append(f"InfiniBand ports ({len(report.ib_ports)}):")
    for p in report.ib_ports:
        rate = f"{p.rate_gbps:g} Gb/s" if p.rate_gbps is not None else "rate unknown"
        health = "healthy" if p.healthy else "UNHEALTHY " + ",".join(f.reason for f in p.faults)
        netdev = f"  {p.netdev}" if p.netdev else ""
        lines.append(f"  {p.device}/{p.port}  {p.state} {p.phys_state}  {rate}  {p.link_layer}{netdev}  {health}")
    lines.append("")
    lines.append("Conditions:")
    for ctype in ConditionType:
        faults = report.faults_for(ctype)
        if not faults and ctype in report.unjudged:
            lines.append(f"  {ctype.value:<20} Unknown  not judged: its source failed (see errors above)")
            continue
        if not faults:
            lines.append(f"  {ctype.value:<20} False  {HEALTHY_REASONS[ctype]}")
            continue
        reasons = {f.reason for f in faults}
        reason = next(iter(reasons)) if len(reasons) == 1 else Reason.MULTIPLE_FAULTS.value
        lines.append(f"  {ctype.value:<20} True   {reason}")
        for f in faults:
            latched = " [latched]" if f.latched else ""
            lines.append(f"      {f.message} (since {f.since.isoformat(timespec='seconds')}){latched}")
    if report.events:
        lines.append("")
        lines.append("Events:")
        for e in report.events:
            lines.append(f"  {e.type.value:<7} {e.reason:<18} {e.message}")
    lines.append("")
    lines.append(f"Recommended node action: {report.action.value}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def log_report(report: HealthReport, sample: NodeSample) -> None:
    """Report handler of a bare agent: a log line per report."""
    log.info(
        "health_report",
        gpus=len(report.gpus),
        ib_ports=len(report.ib_ports),
        faults=len(report.faults),
        action=report.action.value,
        errors=list(report.errors),
    )


def run(args: argparse.Namespace, handlers: list[Callable[[HealthReport, NodeSample], None]] | None = None) -> int:
    # Flags that contradict each other are a usage error before any hardware is opened.
    security_from_args(args)
    try:
        monitor = build_monitor(args)
    except ConfigError as exc:
        print(f"gpuwarden agent: {exc}", file=sys.stderr)
        return 2
    with monitor:
        if args.once:
            report, sample = monitor.step()
            out = report_json(report, sample) if args.output == "json" else format_report(report)
            print(out)
            return 0
        if handlers is None and not args.standalone:
            # Connected mode; the kubernetes client is imported only here.
            from agent.daemon import run_daemon  # noqa: PLC0415 -- keeps --once free of the kubernetes client

            return run_daemon(args, monitor)
        stop = threading.Event()

        def _stop(signum: int, _frame: object) -> None:
            log.info("agent_stopping", signal=signal.Signals(signum).name)
            stop.set()
            monitor.wake()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        chain = handlers if handlers is not None else [log_report]

        def on_report(report: HealthReport, sample: NodeSample) -> None:
            for handler in chain:
                handler(report, sample)

        log.info(
            "agent_started", node=args.node_name, backend=args.backend, poll_interval_s=monitor.config.poll_interval_s
        )
        monitor.run(stop, on_report)
    return 0
