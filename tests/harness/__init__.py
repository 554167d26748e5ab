"""A real Kubernetes control plane for gpuwarden's tests and benchmarks, and helpers to use it.

Tests get it from the session fixture in ``tests/conftest.py``; scripts use
:func:`running_control_plane`. Nodes here have no kubelet: ``create_gpu_node``,
``mark_pod_running`` and the like write what a kubelet would.

The control plane and the kubelet's writes live in the product
(:mod:`gpuwarden.localcluster`), since ``gpuwarden demo`` runs on them too;
this package re-exports them beside what only tests use: ``helpers`` (names,
namespaces, pods) and waiting (:mod:`tests.waiting`). Import from the
package; the split is for reading, not for callers.

Environment: ``GPUWARDEN_CACHE`` (where ``make controlplane`` put the
binaries), ``ETCD``, ``KUBE_APISERVER``, ``KUBE_CONTROLLER_MANAGER`` and
``KUBECTL`` (existing binaries instead), ``GPUWARDEN_KEEP_CONTROLPLANE=1``
(keep the run folder with the servers' logs after the session, until the
next run reaps it).
"""

from gpuwarden.localcluster import (
    LABEL_ARCH,
    LABEL_HOSTNAME,
    LABEL_OS,
    RUN_DIR_PREFIX,
    TAINT_NOT_READY,
    Binaries,
    ControlPlane,
    ControlPlaneError,
    KubectlError,
    ManagedProcess,
    cache_dir,
    complete_pod_deletion,
    create_gpu_node,
    find_binaries,
    free_ports,
    generate_pki,
    impersonating_client,
    kubelet_conditions,
    mark_pod_finished,
    mark_pod_running,
    reap_leftovers,
    running_control_plane,
    service_account_identity,
)
from tests.harness.helpers import kube_scheduler, pod_bound_token, simple_pod, temporary_namespace, unique_name
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
    "ManagedProcess",
    "cache_dir",
    "complete_pod_deletion",
    "create_gpu_node",
    "find_binaries",
    "free_ports",
    "generate_pki",
    "impersonating_client",
    "kube_scheduler",
    "kubelet_conditions",
    "mark_pod_finished",
    "mark_pod_running",
    "pod_bound_token",
    "reap_leftovers",
    "running_control_plane",
    "service_account_identity",
    "simple_pod",
    "temporary_namespace",
    "unique_name",
    "wait_for",
]
