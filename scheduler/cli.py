"""``gpuwarden scheduler`` and ``gpuwarden fairshare`` subcommands.

``fairshare FILE`` prints the fair-share table for a queue tree and demand.
``scheduler --snapshot FILE`` runs one full session over a snapshot file and
prints the decisions; it is the offline face of the scheduler process, whose
connected mode (watching a cluster) adds its own flags to this subcommand.
Both read the YAML formats documented in :mod:`scheduler.snapshot_io`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpuwarden import serving
from gpuwarden.contract import SCHEDULER_COMPONENT, SLICE_RUNTIME_CLASS
from gpuwarden.flags import add_flag, number, port_number, positive_int, seconds
from gpuwarden.logconfig import get_logger
from gpuwarden.yamlfile import load_yaml
from scheduler.cluster.webhook import cli as webhook_cli
from scheduler.engine.fairshare import TreeQueue, build_tree, fair_shares
from scheduler.engine.model import UNLIMITED, Decisions, Queue, SchedulerConfig
from scheduler.engine.resources import MEMORY, MIB_PER_GIB, MILLI, RESOURCE_NAMES, RESOURCES
from scheduler.engine.session import run_session
from scheduler.remediation.policy import ControllerSettings, Settings, SettingsError
from scheduler.snapshot_io import SnapshotError, load_fairshare, load_snapshot

log = get_logger(__name__)


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "scheduler",
        help="run the gpuwarden scheduler",
        description="Schedule pods with schedulerName gpuwarden in the cluster (connected, the default), "
        "or with --snapshot run one session over a snapshot file and print its decisions.",
    )
    add_flag(parser, "--snapshot", default=None, help="snapshot YAML file to schedule once, offline (no cluster)")
    add_flag(
        parser,
        "--decisions-format",
        choices=["text", "json", "yaml"],
        default="text",
        help="how to print the decisions",
    )
    connected = parser.add_argument_group("connected mode")
    add_flag(connected, "--kubeconfig", default=None, help="kubeconfig file; in-cluster service account when unset")
    add_flag(connected, "--default-queue", default="default", help="queue of pods and owners that name none")
    add_flag(connected, "--period", type=seconds(high=600.0), default=1.0, help="seconds between cycles at most")
    add_flag(
        connected,
        "--quiet-settle",
        type=seconds(high=10.0, allow_low=True),
        default=0.02,
        help="seconds an idle leader waits after a change that needs no cycle of its own (a bind's echo, a pod "
        "starting) before it runs one to fold such changes in, so the next arrival's cycle pays only for "
        "itself; at least four times the last cycle's time (0: they wait for the next cycle)",
    )
    add_flag(connected, "--lease-namespace", default="gpuwarden", help="namespace of the leader-election Lease")
    add_flag(connected, "--lease-name", default=SCHEDULER_COMPONENT, help="name of the leader-election Lease")
    add_flag(
        connected,
        "--lease-duration",
        type=seconds(low=2.0, high=600.0, allow_low=True),
        default=15.0,
        help="seconds a lease holds unrenewed (the renew deadline is two thirds of it)",
    )
    add_flag(connected, "--bind-workers", type=positive_int, default=16, help="binds sent at once")
    add_flag(
        connected,
        "--bookkeeping-defer",
        type=seconds(high=600.0, allow_low=True),
        default=30.0,
        help="seconds at most that derived PodGroups and first statuses of fully placed groups wait while "
        "cycles are binding (0: written every cycle)",
    )
    add_flag(
        connected,
        "--bookkeeping-qps",
        type=number(high=10_000.0, allow_low=True, what="rate"),
        default=200.0,
        help="PodGroup creates and status patches per second, written behind the cycles, so that a flush of "
        "deferred bookkeeping never takes the API server from binds at once; a quarter of it while cycles "
        "are binding (0: unpaced)",
    )
    add_flag(
        connected,
        "--slice-compute",
        choices=["none", "proportional"],
        default="none",
        help="CUDA_DEVICE_SM_LIMIT of a GPU slice: none (memory is capped, compute time-sliced) or "
        "proportional (the SM share follows the memory share)",
    )
    add_flag(
        connected,
        "--runtime-class",
        default=SLICE_RUNTIME_CLASS,
        help="the runtime class the admission webhook sets on GPU slice pods (its --runtime-class): a slice "
        "pod without a runtimeClassName, or without its slice ConfigMap's envFrom, is not placed; empty: the "
        "webhook sets none",
    )
    add_flag(
        connected,
        "--evictions-per-second",
        type=number(high=10_000.0, what="rate"),
        default=10.0,
        help=(
            "eviction rate limit of scheduling: reclaim, preemption, consolidation (a gang's pods leave together, "
            "as do the victims evicted for one job)"
        ),
    )
    add_flag(
        connected,
        "--remediation-evictions-per-second",
        type=number(high=10_000.0, what="rate"),
        default=None,
        help="eviction rate limit of remediation's drains, a budget of its own so that a drain never holds up "
        "scheduling's evictions nor they a drain (unset: the --evictions-per-second rate)",
    )
    add_flag(
        connected,
        "--reservation-timeout",
        type=seconds(high=86_400.0),
        default=300.0,
        help="seconds room freed for a pod group by evictions stays held for it (until it binds)",
    )
    add_flag(
        connected,
        "--remediation",
        choices=["on", "dry-run", "off"],
        default="on",
        help="quarantine, drain, repair and return sick GPUs and nodes (dry-run: record and report only)",
    )
    add_flag(
        connected,
        "--remediation-config",
        default=None,
        help="YAML file with remediation settings (timeouts, drain policies per namespace, breaker)",
    )
    add_flag(connected, "--escalation-webhook", default=None, help="URL that escalated repairs are POSTed to as JSON")
    add_flag(connected, "--metrics-address", default="0.0.0.0", help="address /metrics, /healthz, /readyz listen on")
    add_flag(connected, "--metrics-port", type=port_number, default=9403, help="port of /metrics, /healthz, /readyz")
    serving.add_flags(connected)
    add_flag(
        connected,
        "--stall-seconds",
        type=seconds(high=3600.0),
        default=60.0,
        help="/healthz fails after this long without a finished cycle (leader) or loop turn (standby)",
    )
    parser.set_defaults(func=run)

    fair: argparse.ArgumentParser = sub.add_parser(
        "fairshare",
        help="print the fair-share table for a queue tree and demand",
        description="Compute fair share per node pool, queue and resource from a YAML file.",
    )
    fair.add_argument("file", help="YAML file with capacity, queues and demand")
    fair.set_defaults(func=run_fairshare)
    webhook_cli.register(sub)


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


def _amount(resource: int, value: int) -> str:
    """Engine units to the units people write: GPUs, cores, GiB."""
    if value == UNLIMITED:
        return "unlimited"
    divisor = MIB_PER_GIB if resource == MEMORY else MILLI
    return f"{value / divisor:g}"


_UNITS = ("GPUs", "cores", "GiB")


def print_fairshare(
    queues: Sequence[Queue],
    capacity: dict[str, tuple[int, int, int]],
    demand: dict[str, tuple[int, int, int]],
    out: TextIO,
) -> None:
    tree = build_tree(queues)
    for name, problem in sorted(tree.errors.items()):
        out.write(f"warning: queue {name} left out: {problem}\n")
    for name in sorted(demand):
        node = tree.queues.get(name)
        if node is None:
            out.write(f"warning: demand for unknown queue {name} ignored\n")
        elif not node.is_leaf:
            out.write(f"warning: demand for {name} ignored: only leaf queues take work\n")
    rows = fair_shares(tree, capacity, demand)
    for pool in sorted(tree.roots):
        cap = capacity.get(pool, (0, 0, 0))
        described = ", ".join(f"{_amount(r, cap[r])} {_UNITS[r]}" for r in RESOURCES)
        out.write(f"\nNode pool {pool} (healthy capacity: {described})\n\n")
        table = [["QUEUE", "RESOURCE", "QUOTA", "LIMIT", "WEIGHT", "REQUEST", "FAIR SHARE"]]
        pool_rows = [r for r in rows.values() if r.pool == pool]
        order = {n: i for i, n in enumerate(_tree_order(tree.roots[pool]))}
        for row in sorted(pool_rows, key=lambda r: order[r.queue]):
            for r in RESOURCES:
                table.append(
                    [
                        ("  " * row.depth + row.queue) if r == 0 else "",
                        f"{RESOURCE_NAMES[r]} ({_UNITS[r]})",
                        _amount(r, row.quota[r]),
                        _amount(r, row.limit[r]),
                        f"{row.weight[r]:g}",
                        _amount(r, row.request[r]),
                        _amount(r, row.fair_share[r]),
                    ]
                )
        _table(table, out)


def _tree_order(roots: list[TreeQueue]) -> list[str]:
    names: list[str] = []

    def walk(node: TreeQueue) -> None:
        names.append(node.name)
        for child in node.children:
            walk(child)

    for root in roots:
        walk(root)
    return names


def run_fairshare(args: argparse.Namespace) -> int:
    try:
        data = load_fairshare(Path(args.file))
    except SnapshotError as exc:
        sys.stderr.write(f"gpuwarden fairshare: {exc}\n")
        return 2
    print_fairshare(data.queues, data.capacity, data.demand, sys.stdout)
    return 0


# --------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------


def print_decisions(decisions: Decisions, out: TextIO) -> None:
    out.write(f"Binds ({len(decisions.binds)})\n")
    if decisions.binds:
        rows = [["JOB", "POD", "NODE", "GPUS", "SLICE (MiB/GPU)", "PIPELINED"]]
        for b in decisions.binds:
            rows.append(
                [
                    b.job,
                    b.pod,
                    b.node,
                    ",".join(map(str, b.gpu_indices)) or "-",
                    ",".join(map(str, b.gpu_memory_mib)) if b.gpu_memory_mib else "-",
                    "yes" if b.pipelined else "no",
                ]
            )
        _table(rows, out)
    out.write(f"\nEvictions ({len(decisions.evictions)})\n")
    if decisions.evictions:
        rows = [["JOB", "POD", "NODE", "ACTION", "FOR", "REASON"]]
        for e in decisions.evictions:
            rows.append([e.job, e.pod, e.node, e.action.value, e.beneficiary or "-", e.reason])
        _table(rows, out)
    out.write(f"\nPending ({len(decisions.pending)})\n")
    for p in decisions.pending:
        for reason in p.reasons:
            out.write(f"  {p.job} (queue {p.queue}): {reason.code.value}: {reason.message}\n")
    out.write("\nQueues\n")
    rows = [["POOL", "QUEUE", "RESOURCE", "FAIR SHARE", "ALLOCATED", "REQUEST"]]
    for q in decisions.queue_shares:
        share = (q.fair_share.gpu, q.fair_share.cpu, q.fair_share.memory)
        alloc = (q.allocated.gpu, q.allocated.cpu, q.allocated.memory)
        req = (q.request.gpu, q.request.cpu, q.request.memory)
        for r in RESOURCES:
            rows.append(
                [
                    q.pool if r == 0 else "",
                    q.queue if r == 0 else "",
                    _UNITS[r],
                    _amount(r, share[r]),
                    _amount(r, alloc[r]),
                    _amount(r, req[r]),
                ]
            )
    _table(rows, out)


def run(args: argparse.Namespace) -> int:
    if args.snapshot is None:
        return run_connected(args)
    try:
        snapshot = load_snapshot(Path(args.snapshot))
    except SnapshotError as exc:
        sys.stderr.write(f"gpuwarden scheduler: {exc}\n")
        return 2
    decisions = run_session(snapshot)
    log.info(
        "session done",
        binds=len(decisions.binds),
        evictions=len(decisions.evictions),
        pending=len(decisions.pending),
    )
    if args.decisions_format == "json":
        json.dump(asdict(decisions), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif args.decisions_format == "yaml":
        # Through JSON: the decisions hold enums (str subclasses) that YAML's safe dumper refuses.
        yaml.safe_dump(json.loads(json.dumps(asdict(decisions))), sys.stdout, sort_keys=True)
    else:
        print_decisions(decisions, sys.stdout)
    return 0


def run_connected(args: argparse.Namespace) -> int:
    """Schedule the cluster until SIGTERM or SIGINT (leader-elected; standbys keep a warm cache)."""
    # The kubernetes client is imported only here, so that parsing flags
    # (and the offline modes) stays cheap.
    from gpuwarden.kube import load_api_client  # noqa: PLC0415
    from gpuwarden.servingcert import ServingCertificateError  # noqa: PLC0415
    from scheduler.cluster.leader import LeaderElectionConfig  # noqa: PLC0415
    from scheduler.cluster.sliceconfig import SliceCompute  # noqa: PLC0415
    from scheduler.runner import RunnerSettings, SchedulerRunner, connections_needed  # noqa: PLC0415

    duration = args.lease_duration
    security = serving.security_from_args(args)  # a usage error before anything connects
    settings = RunnerSettings(
        period_s=args.period,
        quiet_settle_s=args.quiet_settle or None,
        default_queue=args.default_queue,
        lease=LeaderElectionConfig(
            namespace=args.lease_namespace,
            name=args.lease_name,
            lease_duration_s=duration,
            renew_deadline_s=duration * 2 / 3,
            retry_period_s=duration * 2 / 15,
        ),
        bind_workers=args.bind_workers,
        bookkeeping_defer_s=args.bookkeeping_defer,
        bookkeeping_qps=args.bookkeeping_qps,
        slice_compute=SliceCompute(args.slice_compute),
        slice_runtime_class=args.runtime_class or None,
        evictions_per_s=args.evictions_per_second,
        remediation_evictions_per_s=args.remediation_evictions_per_second,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_address,
        metrics_security=security,
        stall_s=args.stall_seconds,
        config=SchedulerConfig(reservation_ttl_s=args.reservation_timeout),
    )
    try:
        remediation = _remediation_settings(args.remediation, args.remediation_config, args.escalation_webhook)
    except SettingsError as err:
        sys.stderr.write(f"gpuwarden scheduler: {err}\n")
        return 2
    settings = replace(settings, remediation=remediation)
    try:
        api_client = load_api_client(args.kubeconfig, connections=connections_needed(settings))
    except Exception as exc:  # the kubernetes config loaders raise several unrelated types
        sys.stderr.write(f"gpuwarden scheduler: cannot use the kubeconfig {args.kubeconfig or '(in-cluster)'}: {exc}\n")
        return 2
    try:
        runner = SchedulerRunner(api_client, settings)
    except (ServingCertificateError, OSError) as exc:
        sys.stderr.write(f"gpuwarden scheduler: cannot serve /metrics on port {args.metrics_port}: {exc}\n")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("scheduler_started", identity=settings.lease.identity, lease=f"{args.lease_namespace}/{args.lease_name}")
    runner.run(stop)
    log.info("scheduler_stopped", cycles=runner.cycles)
    return 0


def _remediation_settings(mode: str, config: str | None, webhook: str | None) -> ControllerSettings | None:
    """The remediation controller's settings from the flags; SettingsError names what is wrong."""
    if mode == "off":
        return None
    data: dict[str, object] = {}
    if config is not None:
        loaded = load_yaml(config, "remediation config", SettingsError)
        if loaded is not None and not isinstance(loaded, dict):
            raise SettingsError(f"{config}: the remediation config must be a mapping of settings")
        data = dict(loaded or {})
    if mode == "dry-run":
        data["dry_run"] = True
    return ControllerSettings(machine=Settings.from_mapping(data), webhook_url=webhook or None)
