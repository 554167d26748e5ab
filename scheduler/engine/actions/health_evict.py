"""Health eviction: get work off hardware that is failing or being drained.

Runs first, so that the capacity it frees (and the pods it sends back to
pending) are seen by every later action. A pod is evicted when its node has a
fatal fault or is being drained by remediation, or when it holds a GPU with a
fatal fault (see :mod:`scheduler.engine.health` for which faults are fatal).
A gang (``min_member`` > 1) hit anywhere loses all its pods: the survivors
could not make progress without the lost member, and room for it is held on
healthy GPUs at once (the job's reservation) so its recreated pods are
placed again without queueing. A pod the kubelet's device manager put on
a GPU that is out of service while gpuwarden had assigned it another (the
device plugin still offered the bad one: gpuwarden cannot steer a
device-plugin node's kubelet) is evicted the same way, its reason says so,
and its job gets room elsewhere, gang or not. A member still terminating
on the failed hardware counts as a hit too: when a disruption budget refused
some of the gang's evictions, the rest are asked again every session until
they go, instead of waiting for the stale-gang grace.
"""

from __future__ import annotations

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches
from scheduler.engine.holders import misplaced_gpus
from scheduler.engine.scoring import find_place
from scheduler.engine.state import Cluster, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement
from scheduler.engine.victims import evictable


def run(cluster: Cluster, caches: SessionCaches) -> None:
    stmt = Statement(cluster)
    hit: dict[int, tuple[TaskState, str]] = {}
    jobs: dict[int, JobState] = {}
    gone: dict[int, str] = {}  # gangs with a member already leaving the failed hardware
    # Jobs with a pod the device manager put on a GPU out of service, and that node.
    misplaced: dict[int, NodeState] = {}
    for node in cluster.sick:
        if node.node_fatal is not None:
            why = f"node {node.name}: {node.node_fatal}"
            for task in node.tasks:
                if evictable(task):
                    hit[id(task)] = (task, why)
                    jobs.setdefault(id(task.job), task.job)
                elif task.releasing:
                    gone.setdefault(id(task.job), why)
            continue
        bad = node.gpu_bad_reason
        for task in node.tasks:
            if not (evictable(task) or task.releasing):
                continue
            for p in task.gpu_pos:
                if bad[p] is not None:
                    why = f"GPU {node.gpu_index[p]} on node {node.name}: {node.gpu_bad_reason[p]}"
                    if task.releasing:
                        gone.setdefault(id(task.job), why)
                    else:
                        wrong = misplaced_gpus(node.spec, task.spec) if node.spec.kubelet_holders else ()
                        if wrong:
                            why = (
                                f"{why}; the kubelet's device manager gave it this GPU, gpuwarden assigned "
                                f"GPU {', '.join(map(str, task.spec.gpu_indices))}"
                            )
                            misplaced.setdefault(id(task.job), node)
                        hit[id(task)] = (task, why)
                        jobs.setdefault(id(task.job), task.job)
                    break
    if gone:
        for job in cluster.jobs:
            if id(job) in gone and job.spec.min_member > 1 and id(job) not in jobs:
                jobs[id(job)] = job
    for job in sorted(jobs.values(), key=lambda j: j.key):
        first = next((why for t, why in hit.values() if t.job is job), None) or gone[id(job)]
        for task in job.tasks:
            if not evictable(task):
                continue
            if id(task) in hit:
                _, why = hit[id(task)]
                stmt.evict(task, EvictionAction.HEALTH_EVICTION, why, None)
            elif job.spec.min_member > 1:
                stmt.evict(task, EvictionAction.HEALTH_EVICTION, f"gang member lost to a fault ({first})", None)
        if id(job) in gone:
            continue
        if job.spec.min_member > 1 or id(job) in misplaced:
            _keep_room(cluster, caches, stmt, job, misplaced.get(id(job)))
    stmt.commit()


def _keep_room(
    cluster: Cluster, caches: SessionCaches, stmt: Statement, job: JobState, avoid: NodeState | None = None
) -> None:
    """Hold room on healthy GPUs for a gang that lost its place, whole or not at all.

    Its controller recreates the pods; the room found here becomes the job's
    reservation (scheduler.engine.reservations), so the gang is placed again
    at once instead of queueing behind everyone else. A gang with a member
    still terminating is left to find room when it comes back. A job whose
    pod the device manager put on a GPU out of service gets room too, gang
    or not, and only off that node (``avoid``): its device manager, which
    gpuwarden cannot steer, may choose that GPU again, and room held there
    would send the pod back into the same eviction. Where no other node
    fits, no room is held; the Kubernetes side keeps the job off that node
    for a while (:mod:`scheduler.cluster.misplaced`), so it waits instead.
    """
    mark = stmt.mark()
    for task in job.tasks:
        if task.was_running and task.node is None and task.eviction is not None:
            found = find_place(cluster, caches, task, avoid)
            if found is None:
                stmt.rollback(mark)
                return
            stmt.allocate(task, *found)
