"""``gpuwarden demo``: flags, and the check that the output is a terminal before drawing the live view."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpuwarden.flags import FlagError, add_flag


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run the whole system on this machine: control plane, simulated GPU nodes, agents, scheduler",
        description=(
            "Start a local Kubernetes control plane, simulated GPU nodes with their agents, the scheduler with "
            "remediation, a queue tree, arriving work and scheduled hardware faults; show it live, then a summary. "
            "Needs no GPU and no cluster, only the binaries `make controlplane` builds."
        ),
    )
    add_flag(parser, "--duration", type=float, default=None, help="seconds to run (default: the scenario's, 300)")
    add_flag(parser, "--nodes", type=int, default=None, help="simulated GPU nodes (default: the scenario's, 16)")
    add_flag(
        parser,
        "--scenario",
        default="default",
        help="a shipped demo scenario name or a scenario YAML file (see demo/scenarios/default.yaml)",
    )
    add_flag(
        parser,
        "--dra",
        action="store_true",
        help=(
            "DRA nodes: no device plugin; each node's GPUs published by NVIDIA's DRA driver (simulated) in a "
            "ResourceSlice, with its health taints; whole-GPU pods get their GPUs through ResourceClaims"
        ),
    )
    add_flag(
        parser,
        "--no-tty",
        action="store_true",
        help="print plain periodic lines instead of the live view (the default when stdout is not a terminal)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Heavy imports (kubernetes, the agent, the scheduler, rich) only when the demo runs, not for --help.
    from agent.config import ConfigError  # noqa: PLC0415
    from demo.run import DemoOptions, run_demo  # noqa: PLC0415
    from demo.scenario import load_scenario  # noqa: PLC0415

    try:
        scenario = load_scenario(args.scenario)
    except ConfigError as exc:
        raise FlagError(f"--scenario: {exc}") from exc
    nodes = args.nodes if args.nodes is not None else scenario.cluster.nodes
    duration = args.duration if args.duration is not None else scenario.duration_s
    if nodes < 1:
        raise FlagError("--nodes must be at least 1")
    if duration <= 0:
        raise FlagError("--duration must be above 0")
    tty = not args.no_tty and sys.stdout.isatty()
    return run_demo(DemoOptions(scenario=scenario, duration_s=duration, nodes=nodes, tty=tty, dra=args.dra))
