"""A real Kubernetes control plane for gpuwarden's tests and benchmarks, and helpers to use it.

Tests get it from the session fixture in ``tests/conftest.py``; scripts use
:func:`running_control_plane`. Nodes here have no kubelet: the ``kubelet``
module writes what a kubelet would.

Modules, one job each: ``processes`` (finding the binaries, process groups,
reaping a killed run's leftovers, free ports), ``certificates`` (the PKI),
``controlplane`` (starting and stopping the servers, admin clients, kubectl),
``impersonation`` (acting as a ServiceAccount), ``kubelet`` (nodes and pods as
a kubelet reports them) and ``helpers`` (names, namespaces, pods, waiting).
Import from the package; the split is for reading, not for callers.

Environment: ``GPUWARDEN_CACHE`` (where ``make controlplane`` put the
binaries), ``ETCD``, ``KUBE_APISERVER``, ``KUBE_CONTROLLER_MANAGER`` and
``KUBECTL`` (existing binaries instead), ``GPUWARDEN_KEEP_CONTROLPLANE=1``
(keep the run folder with the servers' logs after the session, until the
next run reaps it).
"""

from tests.harness.certificates import generate_pki
from tests.harness.controlplane import ControlPlane, KubectlError, running_control_plane
from tests.harness.helpers import simple_pod, temporary_namespace, unique_name
from tests.harness.impersonation import impersonating_client, service_account_identity
from tests.harness.kubelet import (
    LABEL_ARCH,
    LABEL_HOSTNAME,
    LABEL_OS,
    TAINT_NOT_READY,
    complete_pod_deletion,
    create_gpu_node,
    kubelet_conditions,
    mark_pod_running,
)
from tests.harness.processes import (
    RUN_DIR_PREFIX,
    Binaries,
    ControlPlaneError,
    cache_dir,
    find_binaries,
    free_ports,
    reap_leftovers,
)
from tests.waiting import wait_for

__all__ = [
    "LABEL_ARCH",
    "LABEL_HOSTNAME",
    "LABEL_OS",
    "RUN_DIR_PREFIX",
    "TAINT_NOT_READY",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "KubectlError",
    "cache_dir",
    "complete_pod_deletion",
    "create_gpu_node",
    "find_binaries",
    "free_ports",
    "generate_pki",
    "impersonating_client",
    "kubelet_conditions",
    "mark_pod_running",
    "reap_leftovers",
    "running_control_plane",
    "service_account_identity",
    "simple_pod",
    "temporary_namespace",
    "unique_name",
    "wait_for",
]
