"""Fixtures of the scheduler's cluster tests (made in :mod:`tests.scheduler.cluster.kube_objects`)."""

from tests.scheduler.cluster.kube_objects import cluster, queue

__all__ = ["cluster", "queue"]
