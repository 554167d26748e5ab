"""Fixtures of the kubectl plugin's tests: the scheduler's CRDs, fake GPU nodes and queues.

The plugin reads what the agent and the scheduler write, so its tests make
those objects the way the scheduler's own cluster tests do.
"""

from tests.scheduler.cluster.kube_objects import cluster, queue
from tests.scheduler.conftest import gpunode_crd, scheduler_crds

__all__ = ["cluster", "gpunode_crd", "queue", "scheduler_crds"]
