"""Fixtures of the scheduler's cluster tests (made in :mod:`.kube_objects`, :mod:`.owner_crds` and :mod:`.fencing`)."""

from tests.scheduler.cluster.fencing import fenced_replicas
from tests.scheduler.cluster.kube_objects import cluster, queue, scheduler_rbac
from tests.scheduler.cluster.owner_crds import owner_crds

__all__ = ["cluster", "fenced_replicas", "owner_crds", "queue", "scheduler_rbac"]
