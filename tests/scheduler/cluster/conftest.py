"""Fixtures of the scheduler's cluster tests (made in :mod:`tests.scheduler.cluster.objects`)."""

from tests.scheduler.cluster.objects import cluster, queue

__all__ = ["cluster", "queue"]
