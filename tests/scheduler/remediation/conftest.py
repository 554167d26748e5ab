"""Fixtures of the remediation controller's tests: the scheduler's fake GPU nodes and queues."""

from tests.scheduler.cluster.kube_objects import cluster, queue

__all__ = ["cluster", "queue"]
