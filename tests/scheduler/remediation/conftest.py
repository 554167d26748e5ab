"""Fixtures of the remediation controller's tests: the scheduler's fake GPU nodes and queues, the runner."""

from tests.scheduler.cluster.kube_objects import cluster, queue, scheduler_rbac
from tests.scheduler.remediation.e2e import runner, sim_gpu_nodes

__all__ = ["cluster", "queue", "runner", "scheduler_rbac", "sim_gpu_nodes"]
