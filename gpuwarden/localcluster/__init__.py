"""A real Kubernetes control plane on one machine, and the kubelet's side of the API written by hand.

Why it is in the product: ``gpuwarden demo`` runs the whole system on a
laptop, with no cluster, on the same etcd, kube-apiserver and
kube-controller-manager the tests use (built by ``make controlplane``), so
what a newcomer sees is what the tests check. The tests reach it through
``tests.harness``, which re-exports it beside what only tests use; the core
rule holds here as everywhere in ``gpuwarden/``: it imports neither the agent
nor the scheduler.

Modules, one job each: ``processes`` (finding the binaries, process groups,
reaping a killed run's leftovers, free ports), ``certificates`` (the PKI),
``controlplane`` (starting and stopping the servers, admin clients, kubectl),
``impersonation`` (acting as a ServiceAccount) and ``kubelet`` (nodes and
pods as a kubelet reports them). Import from the package.

Environment: ``GPUWARDEN_CACHE`` (where ``make controlplane`` put the
binaries), ``ETCD``, ``KUBE_APISERVER``, ``KUBE_CONTROLLER_MANAGER`` and
``KUBECTL`` (existing binaries instead), ``GPUWARDEN_KEEP_CONTROLPLANE=1``
(keep the run folder with the servers' logs after the run, until the next
run reaps it).
"""

from gpuwarden.localcluster.certificates import generate_pki
from gpuwarden.localcluster.controlplane import (
    DEFAULT_CONTROLLERS,
    ControlPlane,
    KubectlError,
    running_control_plane,
)
from gpuwarden.localcluster.impersonation import impersonating_client, service_account_identity
from gpuwarden.localcluster.kubelet import (
    LABEL_ARCH,
    LABEL_HOSTNAME,
    LABEL_OS,
    TAINT_NOT_READY,
    complete_pod_deletion,
    create_gpu_node,
    kubelet_conditions,
    mark_pod_finished,
    mark_pod_running,
)
from gpuwarden.localcluster.processes import (
    FIRST_BUILD_HINT,
    RUN_DIR_PREFIX,
    Binaries,
    ControlPlaneError,
    ManagedProcess,
    cache_dir,
    find_binaries,
    free_ports,
    reap_leftovers,
)

__all__ = [
    "DEFAULT_CONTROLLERS",
    "FIRST_BUILD_HINT",
    "LABEL_ARCH",
    "LABEL_HOSTNAME",
    "LABEL_OS",
    "RUN_DIR_PREFIX",
    "TAINT_NOT_READY",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "KubectlError",
    "ManagedProcess",
    "cache_dir",
    "complete_pod_deletion",
    "create_gpu_node",
    "find_binaries",
    "free_ports",
    "generate_pki",
    "impersonating_client",
    "kubelet_conditions",
    "mark_pod_finished",
    "mark_pod_running",
    "reap_leftovers",
    "running_control_plane",
    "service_account_identity",
]
