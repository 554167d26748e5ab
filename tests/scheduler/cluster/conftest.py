"""Fixtures of the scheduler's cluster tests (made in :mod:`.kube_objects` and :mod:`.owner_crds`)."""

from tests.scheduler.cluster.kube_objects import cluster, queue, scheduler_rbac
from tests.scheduler.cluster.owner_crds import owner_crds

__all__ = ["cluster", "owner_crds", "queue", "scheduler_rbac"]
