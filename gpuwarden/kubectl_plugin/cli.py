"""``kubectl-gpuwarden``: flags, the connection to the cluster, and errors a person can act on.

kubectl runs any executable called ``kubectl-<name>`` on the PATH as
``kubectl <name>``, passing the rest of the command line and nothing else;
so this command takes kubectl's own ``--kubeconfig``, ``--context``,
``-n``/``--namespace``, ``--request-timeout`` and ``-o`` itself, after the
subcommand as people type them (``kubectl gpuwarden nodes -o json``).

A failure is one line on stderr and exit status 1, never a traceback: the
API server cannot be reached (and where it was looked for), a CRD is not
installed (and which manifest installs it), a pod does not exist, the
credentials are refused. The kubernetes client is imported only when a
command connects, so ``--help`` and ``simulate`` stay quick.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuwarden import contract, dra
from gpuwarden.flags import seconds
from gpuwarden.kubectl_plugin import render, views
from gpuwarden.logconfig import configure_logging, get_logger

if TYPE_CHECKING:
    from gpuwarden.kube import ApiError, KubeApi

log = get_logger(__name__)

PROG = "kubectl-gpuwarden"
FIELD_MANAGER = PROG  # never written with: the plugin only reads
DEFAULT_KUBECONFIG = Path.home() / ".kube" / "config"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# How far up a pod's owner chain ``why`` looks for the workload its PodGroup is derived from
# (the scheduler's grouping follows at most as many).
MAX_OWNER_CHAIN = 16

# What installs each custom resource the plugin reads, for the "CRD missing" error.
_CRDS: Mapping[str, tuple[str, str]] = {
    contract.GPUNODE_PLURAL: (
        f"{contract.GPUNODE_PLURAL}.{contract.API_GROUP}",
        "kubectl apply -k manifests/ (the agent's manifests)",
    ),
    contract.QUEUE_PLURAL: (
        f"{contract.QUEUE_PLURAL}.{contract.SCHEDULING_API_GROUP}",
        "kubectl apply -k manifests/scheduler/",
    ),
    contract.PODGROUP_PLURAL: (
        f"{contract.PODGROUP_PLURAL}.{contract.SCHEDULING_API_GROUP}",
        "kubectl apply -k manifests/scheduler/",
    ),
}


class PluginError(Exception):
    """What went wrong, in words a person can act on; printed as one line, exit status 1."""


@dataclass(frozen=True, slots=True)
class Connection:
    """A client for one cluster, where it points, and the namespace its context names."""

    api: KubeApi
    server: str
    namespace: str


def _kubeconfig_path(flag: str | None) -> str | None:
    """kubectl's order: the flag, then ``$KUBECONFIG`` (a list of files, merged), then ``~/.kube/config``."""
    if flag:
        return flag
    env = os.environ.get("KUBECONFIG")
    if env:
        return env
    return str(DEFAULT_KUBECONFIG) if DEFAULT_KUBECONFIG.exists() else None


def _context_namespace(path: str, context: str | None) -> str:
    from kubernetes import config  # noqa: PLC0415 -- see the module docstring

    contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"


def connect(kubeconfig: str | None, context: str | None, timeout_s: float) -> Connection:
    """A read-only client from the kubeconfig kubectl would use, else the pod's service account."""
    from gpuwarden.kube import KubeApi, load_api_client  # noqa: PLC0415 -- see the module docstring

    path = _kubeconfig_path(kubeconfig)
    try:
        api_client = load_api_client(path, context=context)
        if path is not None:
            namespace = _context_namespace(path, context)
        else:
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except Exception as exc:  # the kubernetes config loaders raise several unrelated types
        where = path or "(none: no --kubeconfig, $KUBECONFIG or ~/.kube/config, and not running in a pod)"
        raise PluginError(f"cannot use the kubeconfig {where}: {exc}") from exc
    server = str(api_client.configuration.host)
    return Connection(KubeApi(api_client, field_manager=FIELD_MANAGER, timeout_s=timeout_s), server, namespace)


def explain(err: ApiError, server: str) -> PluginError:
    """An API failure as the thing to fix: the server, the CRD, the credentials."""
    from gpuwarden.kube import resource_missing  # noqa: PLC0415 -- see the module docstring

    if err.status is None:
        return PluginError(f"cannot reach the API server at {server}: {err.detail}")
    plural = err.operation.removeprefix("list_").removeprefix("get_")
    if resource_missing(err) and plural in _CRDS:
        crd, install = _CRDS[plural]
        return PluginError(f"the {crd} CRD is not installed in the cluster at {server}; install it with {install}")
    if err.status == 401:
        return PluginError(f"the API server at {server} did not accept the credentials (HTTP 401): {err.detail}")
    if err.status == 403:
        return PluginError(f"not allowed ({err.operation}): {err.detail}")
    return PluginError(f"{err.operation} failed at {server}: HTTP {err.status}: {err.detail}")


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def _list_gpunodes(api: KubeApi) -> list[Any]:
    return api.list_cluster_objects(contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)


def _dra_objects(api: KubeApi, nodes: Sequence[str] | None = None, *, holders: bool = True) -> views.DraObjects:
    """NVIDIA's DRA driver's slices, the DeviceTaintRules and the ResourceClaims; none on a cluster without DRA.

    ``nodes``: only those nodes' slices (``why`` needs the devices of a
    pod's claims, not the cluster's). ``holders``: also list every
    namespace's ResourceClaims, to say who holds each device. A list this
    user may not read (403) or that the server does not serve (404) is
    shown as empty, as ``why`` does with owners: the nodes' own view is
    worth having without it.
    """
    from gpuwarden.kube import ApiError  # noqa: PLC0415 -- see the module docstring

    def listed(plural: str, field_selector: str = "") -> list[Any]:
        try:
            return api.list_cluster_objects(contract.DRA_API_GROUP, contract.DRA_API_VERSION, plural, field_selector)
        except ApiError as err:
            if err.status in (403, 404):
                log.debug("dra_unreadable", resource=plural, status=err.status)
                return []
            raise

    driver = f"spec.driver={contract.NVIDIA_DRA_DRIVER}"
    if nodes is None:
        slices = listed(contract.RESOURCESLICE_PLURAL, driver)
    else:
        slices = [s for node in nodes for s in listed(contract.RESOURCESLICE_PLURAL, f"{driver},spec.nodeName={node}")]
    if not dra.devices_by_node(slices):
        return views.DraObjects()  # the driver publishes nothing: the rest would show nothing either
    claims = listed("resourceclaims") if holders else []  # every namespace's
    return views.DraObjects.read(slices, listed(contract.DEVICETAINTRULE_PLURAL), claims)


def run_nodes(args: argparse.Namespace, conn: Connection, out: TextIO) -> int:
    objects = _dra_objects(conn.api)
    shown = views.node_views(conn.api.list_nodes(), _list_gpunodes(conn.api), args.names, objects)
    missing = sorted(set(args.names) - {v.name for v in shown})
    if missing:
        raise PluginError(f"node{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)}")
    if args.output == "table":
        render.nodes_table(shown, out, devices=bool(args.names), broad_rules=objects.broad_rules)
    else:
        render.dump(shown, args.output, out)
    return 0


def run_queues(args: argparse.Namespace, conn: Connection, out: TextIO) -> int:
    queues = conn.api.list_cluster_objects(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL
    )
    shown = views.queue_views(queues)
    if args.output == "table":
        render.queues_table(shown, out)
    else:
        render.dump(shown, args.output, out)
    return 0


def _owner(api: KubeApi, namespace: str, ref: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object an owner reference names, read by the usual plural (kind in lower case plus ``s``).

    The scheduler derives a PodGroup from the topmost workload of a known
    kind (Job, JobSet, PyTorchJob, ...), all of which follow that rule. An
    owner that cannot be read (a core kind, not served, not allowed) ends
    the walk; ``why`` then shows the pod without its group rather than fail.
    """
    from gpuwarden.kube import ApiError  # noqa: PLC0415 -- see the module docstring

    api_version, kind, name = (str(ref.get(k) or "") for k in ("apiVersion", "kind", "name"))
    group, _, version = api_version.rpartition("/")
    if not group or not kind or not name:
        return None
    try:
        return api.get_namespaced_object(group, version, f"{kind.lower()}s", namespace, name)
    except ApiError as err:
        if err.status in (403, 404):
            log.debug("owner_unreadable", kind=kind, name=name, status=err.status)
            return None
        raise


def find_group(api: KubeApi, namespace: str, pod: Mapping[str, Any], podgroups: Sequence[Any]) -> Any:
    """The pod's PodGroup: the one its annotation names, else the one its workload owns."""
    meta = pod.get("metadata") or {}
    explicit = (meta.get("annotations") or {}).get(contract.ANNOTATION_POD_GROUP)
    if explicit:
        return next((g for g in podgroups if (g.get("metadata") or {}).get("name") == explicit), None)
    obj: Mapping[str, Any] | None = pod
    uids = [str(meta.get("uid") or "")]
    for _ in range(MAX_OWNER_CHAIN):
        found = views.group_owned_by(podgroups, uids)
        if found is not None or obj is None:
            return found
        ref = views.controller_owner(obj)
        if ref is None:
            return None
        uids = [str(ref.get("uid") or "")]
        obj = _owner(api, namespace, ref)
    return None


def _events(api: KubeApi, namespace: str, kind: str, name: str) -> list[Any]:
    return api.list_events(namespace, f"involvedObject.kind={kind},involvedObject.name={name}")


def _pod_claims(api: KubeApi, namespace: str, pod: Mapping[str, Any]) -> list[views.ClaimView]:
    """The pod's ResourceClaims with their devices and those devices' taints (nothing read for a pod with none)."""
    names = views.pod_claim_names(pod)
    if not names:
        return []
    from gpuwarden.kube import ApiError  # noqa: PLC0415 -- see the module docstring

    claims: dict[str, Any] = {}
    for _, claim_name in names:
        if not claim_name:
            continue
        try:
            found = api.get_namespaced_object(
                contract.DRA_API_GROUP, contract.DRA_API_VERSION, "resourceclaims", namespace, claim_name
            )
        except ApiError as err:
            if err.status != 403:
                raise
            found = None
        if found is not None:
            claims[claim_name] = found
    # The driver names each node's pool after it: the pools of the claims' devices are the nodes to read.
    allocated = dra.claim_holders(claims.values())
    pools = sorted({pool for driver, pool, _ in allocated if driver == contract.NVIDIA_DRA_DRIVER})
    objects = _dra_objects(api, pools, holders=False) if pools else views.DraObjects()
    return views.claim_views(pod, claims, objects)


def run_why(args: argparse.Namespace, conn: Connection, out: TextIO) -> int:
    namespace = args.namespace or conn.namespace
    pod = conn.api.get_pod(namespace, args.pod)
    events = _events(conn.api, namespace, "Pod", args.pod)
    group = None
    if pod is not None:
        podgroups = conn.api.list_namespaced_objects(
            contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.PODGROUP_PLURAL, namespace
        )
        group = find_group(conn.api, namespace, pod, podgroups)
        if group is not None:
            events += _events(conn.api, namespace, contract.PODGROUP_KIND, group["metadata"]["name"])
    elif not events:
        raise PluginError(f'pods "{args.pod}" not found in namespace {namespace}')
    claims = _pod_claims(conn.api, namespace, pod) if pod is not None else []
    report = views.why_report(
        namespace, args.pod, pod=pod, group=group, events=events, now=datetime.now(UTC), claims=claims
    )
    if args.output == "table":
        render.why_text(report, out)
    else:
        render.dump(report, args.output, out)
    return 0


def run_simulate(args: argparse.Namespace, out: TextIO) -> int:
    """The engine on a snapshot, through the ``gpuwarden`` command's own ``scheduler --snapshot``.

    The scheduler prints to stdout itself; ``out`` is accepted for symmetry
    with the connected commands.
    """
    from gpuwarden import cli  # noqa: PLC0415 -- loads the entry points only when simulating

    if not Path(args.file).is_file():
        raise PluginError(f"no such snapshot file: {args.file}")
    if "scheduler" not in {name for name, _ in cli.registered_commands()}:
        raise PluginError("simulate needs the gpuwarden scheduler, which this installation does not include")
    fmt = {"table": "text", "json": "json", "yaml": "yaml"}[args.output]
    out.flush()
    return cli.main(["--log-level", "warning", "scheduler", "--snapshot", args.file, "--decisions-format", fmt])


# --------------------------------------------------------------------------
# Parser and entry point
# --------------------------------------------------------------------------

Connected = Callable[[argparse.Namespace, Connection, TextIO], int]


def _common(connected: bool) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-o", "--output", choices=render.OUTPUTS, default="table", help="output format")
    if connected:
        common.add_argument("--kubeconfig", default=None, help="kubeconfig file (else $KUBECONFIG, ~/.kube/config)")
        common.add_argument("--context", default=None, help="kubeconfig context to use (else its current context)")
        common.add_argument(
            "--request-timeout",
            type=seconds(high=600.0),
            default=10.0,
            help="seconds to wait for each API request (default: 10)",
        )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl gpuwarden",
        description="Read what gpuwarden's agent and scheduler wrote: GPU node health and remediation, "
        "the queue tree, why a pod waits; or run the scheduler's engine on a snapshot file.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    connected = _common(connected=True)
    nodes = sub.add_parser(
        "nodes",
        parents=[connected],
        help="GPU nodes: healthy GPUs, active conditions, remediation state, InfiniBand ports",
    )
    nodes.add_argument("names", nargs="*", metavar="NODE", help="only these nodes (default: every GPU node)")
    nodes.set_defaults(connected=run_nodes)
    queues = sub.add_parser(
        "queues",
        parents=[connected],
        help=(
            "the queue tree: quota, limit, guaranteed, fair share and allocation per resource, "
            "GPU-seconds lost to faults"
        ),
    )
    queues.set_defaults(connected=run_queues)
    why = sub.add_parser(
        "why",
        parents=[connected],
        help="why a pod is pending or was evicted: its PodGroup's conditions and reservations, recent Events",
    )
    why.add_argument("pod", metavar="POD")
    why.add_argument("-n", "--namespace", default=None, help="the pod's namespace (else the context's)")
    why.set_defaults(connected=run_why)
    simulate = sub.add_parser(
        "simulate",
        parents=[_common(connected=False)],
        help="run the scheduler's engine on a snapshot file, no cluster (gpuwarden scheduler --snapshot FILE)",
    )
    simulate.add_argument("file", metavar="FILE", help="snapshot YAML (format: scheduler/snapshot_io.py)")
    simulate.set_defaults(offline=run_simulate)
    return parser


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run the parsed command; raises :class:`PluginError` for anything a person must fix."""
    from gpuwarden.kube import ApiError  # noqa: PLC0415 -- see the module docstring

    offline: Callable[[argparse.Namespace, TextIO], int] | None = getattr(args, "offline", None)
    if offline is not None:
        return offline(args, out)
    command: Connected = args.connected
    conn = connect(args.kubeconfig, args.context, args.request_timeout)
    try:
        return command(args, conn, out)
    except ApiError as err:
        log.debug("api_error", operation=err.operation, status=err.status, detail=err.detail)
        raise explain(err, conn.server) from err


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging("auto", "warning")
    try:
        return run(args, sys.stdout)
    except PluginError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
