"""The connected agent's settings and their flags.

Kept apart from :mod:`agent.daemon` so that parsing ``gpuwarden agent``'s
flags (``--help``, ``--once``) does not import the kubernetes client.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from agent.config import ConfigError
from gpuwarden import serving
from gpuwarden.flags import Bounds, add_flag, bounded, bounds_of, check_bounds, port_number
from gpuwarden.serving import MetricsSecurity

# Node Events go where the kubelet puts its own: the default namespace. The
# API server accepts core/v1 Events about a cluster-scoped object (a Node) in
# no other namespace, so this is not a setting.
DEFAULT_EVENTS_NAMESPACE = "default"
DEFAULT_METRICS_PORT = 9402


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """How the connected agent publishes; every field has a flag (see :func:`add_flags`)."""

    node_name: str
    heartbeat_period_s: float = bounded(60.0, Bounds(0.0, 3600.0))
    metrics_host: str = "0.0.0.0"
    # None: no HTTP endpoint (tests and the benchmark that run many agents).
    metrics_port: int | None = bounded(DEFAULT_METRICS_PORT, Bounds(0, 65535, allow_low=True, integer=True))
    # Plain HTTP by default; TLS and delegated authorization on request (gpuwarden.serving).
    metrics_security: MetricsSecurity = field(default_factory=MetricsSecurity)
    api_timeout_s: float = bounded(10.0, Bounds(0.0, 600.0))
    backoff_base_s: float = bounded(0.5, Bounds(0.0, 600.0))
    backoff_cap_s: float = bounded(30.0, Bounds(0.0, 3600.0))

    def __post_init__(self) -> None:
        # The flags parse with these bounds already; this holds them for
        # settings built in code too (the demo, tests), so no source escapes.
        for key, problem in check_bounds(self):
            raise ConfigError(f"{key}: {problem}")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The connected agent's flags, added to ``gpuwarden agent``."""
    group = parser.add_argument_group("publishing to Kubernetes and Prometheus")
    add_flag(
        group,
        "--standalone",
        action="store_true",
        help="poll and log reports without connecting to Kubernetes or serving metrics",
    )
    add_flag(group, "--kubeconfig", default=None, help="kubeconfig file; in-cluster service account when unset")
    add_flag(group, "--metrics-address", default="0.0.0.0", help="address for /metrics, /healthz, /readyz")
    add_flag(
        group,
        "--metrics-port",
        type=port_number,
        default=DEFAULT_METRICS_PORT,
        help="port for /metrics, /healthz, /readyz",
    )
    serving.add_flags(group)
    add_flag(
        group,
        "--heartbeat-period",
        type=bounds_of(DaemonSettings, "heartbeat_period_s").flag_type("number of seconds"),
        default=60.0,
        help="seconds between condition heartbeats (lastHeartbeatTime) when nothing changes",
    )
    add_flag(
        group,
        "--api-timeout",
        type=bounds_of(DaemonSettings, "api_timeout_s").flag_type("number of seconds"),
        default=10.0,
        help="seconds before a Kubernetes API request fails",
    )


def settings_from_args(args: argparse.Namespace) -> DaemonSettings:
    # Numbers are range-checked by their flag types (gpuwarden.flags), from the
    # command line and the environment alike.
    if not args.node_name:
        raise ConfigError("--node-name: empty; set it, or NODE_NAME from the downward API")
    return DaemonSettings(
        node_name=args.node_name,
        heartbeat_period_s=args.heartbeat_period,
        metrics_host=args.metrics_address,
        metrics_port=args.metrics_port,
        metrics_security=serving.security_from_args(args),
        api_timeout_s=args.api_timeout,
    )
