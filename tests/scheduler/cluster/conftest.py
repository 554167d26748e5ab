"""Fixtures of the scheduler's cluster tests, made in the modules imported below."""

from tests.scheduler.cluster.dra_fixtures import claim_controller, claims_released, device_classes, dra_nodes
from tests.scheduler.cluster.fencing import fenced_replicas
from tests.scheduler.cluster.kube_objects import cluster, queue, scheduler_rbac
from tests.scheduler.cluster.owner_crds import owner_crds

__all__ = [
    "claim_controller",
    "claims_released",
    "cluster",
    "device_classes",
    "dra_nodes",
    "fenced_replicas",
    "owner_crds",
    "queue",
    "scheduler_rbac",
]
