"""Snapshot to working state: the first step of every session.

Pools and nodes (with their health verdict and tier), the queue tree, jobs
and their pods; running pods are seated on their nodes and charged to their
queues, and fair share is computed from the capacity and the demand seen.
Bad input never stops the build: a pod with a malformed GPU annotation, a
job naming an unknown queue, a running pod on a node that does not exist are
logged and recorded on the job, and everything else is built as usual.
"""

from __future__ import annotations

from gpuwarden.contract import UnschedulableReason
from gpuwarden.logconfig import get_logger
from scheduler.engine.fairshare import QueueTree, TreeQueue, build_tree, fair_shares
from scheduler.engine.health import judge
from scheduler.engine.holders import holder_key, kubelet_gpus, reported_gpus
from scheduler.engine.model import UNLIMITED, Job, Node, PendingReason, Queue, Snapshot, Task, TaskStatus
from scheduler.engine.predicates import shape_of
from scheduler.engine.reservations import seat_reservations
from scheduler.engine.resources import CPU, GPU, MEMORY, MILLI, GpuRequest, parse_gpu_request
from scheduler.engine.state import (
    TIER_DEGRADED,
    TIER_HEALTHY,
    Cluster,
    JobState,
    NodeState,
    PoolState,
    QueueState,
    TaskState,
    milli_of,
)

log = get_logger(__name__)


def borrowing(spec: Queue) -> tuple[bool, bool, bool]:
    """Per resource, whether the queue may go over its quota.

    ``overQuotaWeight: 0`` means the queue never borrows: fair share gives it
    nothing beyond quota, and placement holds it there too, even when the
    rest of the cluster is idle (the quota acts as a limit). A resource
    without a quota (ungoverned) has nothing to borrow beyond.
    """
    gpu, cpu, memory = (s.over_quota_weight > 0 or s.quota == UNLIMITED for s in spec.resources)
    return (gpu, cpu, memory)


def make_node(spec: Node, pool: PoolState, pidx: int) -> NodeState:
    """The working state of one node, empty: its health verdict, GPUs and tier."""
    verdict = judge(spec)
    if verdict.node_fatal is not None:
        excluded: str | None = verdict.node_fatal
    elif not spec.schedulable:
        excluded = "cordoned"
    else:
        excluded = None
    gpu_index = [g.index for g in spec.gpus]
    gpu_mem = [g.memory_mib for g in spec.gpus]
    # A MIG device is out with the GPU it is carved from.
    bad_reason = [
        verdict.node_fatal
        or verdict.bad_gpus.get(g.index)
        or (verdict.bad_gpus.get(g.parent) if g.parent is not None else None)
        for g in spec.gpus
    ]
    # A GPU in MIG mode is handed out as MIG devices: it takes neither
    # whole-GPU pods nor slices itself, and is no part of the capacity fair
    # share divides. The MIG devices DRA publishes are GPUs of their own
    # (``parent`` set), which only claim pods that select them take.
    gpu_ok = [r is None and not g.mig_enabled for r, g in zip(bad_reason, spec.gpus, strict=True)]
    return NodeState(
        spec=spec,
        pool=pool,
        pidx=pidx,
        free_cpu=spec.cpu_milli,
        free_mem=spec.memory_mib,
        gpu_index=gpu_index,
        gpu_mem=gpu_mem,
        gpu_free=list(gpu_mem),
        gpu_whole=[0] * len(gpu_mem),
        gpu_slices=[0] * len(gpu_mem),
        gpu_ok=gpu_ok,
        gpu_bad_reason=bad_reason,
        dense=gpu_index == list(range(len(gpu_index))),
        free_whole=sum(gpu_ok),
        mig=any(g.mig_enabled or g.parent is not None for g in spec.gpus),
        accepts=excluded is None,
        excluded=excluded,
        node_fatal=verdict.node_fatal,
        degraded=verdict.degraded,
        tier=TIER_DEGRADED if verdict.degraded else TIER_HEALTHY,
        trap=any(r is not None and g.offered is True for r, g in zip(bad_reason, spec.gpus, strict=True)),
    )


def add_capacity(node: NodeState, sign: int = 1) -> None:
    """Count an empty node's offer in its pool's capacity (``sign`` -1 takes it out)."""
    if node.accepts:
        cap = node.pool.capacity
        gpus = node.spec.gpus
        cap[GPU] += sign * (
            sum(g.milli_gpus for g, ok in zip(gpus, node.gpu_ok, strict=True) if ok)
            if node.mig
            else MILLI * sum(node.gpu_ok)
        )
        cap[CPU] += sign * node.spec.cpu_milli
        cap[MEMORY] += sign * node.spec.memory_mib


def _build_pools(snapshot: Snapshot) -> tuple[dict[str, PoolState], dict[str, NodeState]]:
    config = snapshot.config
    pools: dict[str, PoolState] = {}
    nodes: dict[str, NodeState] = {}
    for spec in sorted(snapshot.nodes, key=lambda n: n.name):
        if spec.name in nodes:
            log.warning("duplicate node in snapshot; keeping the first", node=spec.name)
            continue
        pool = pools.get(spec.pool)
        if pool is None:
            pool = PoolState(spec.pool, config.strategy(spec.pool))
            pools[spec.pool] = pool
        node = make_node(spec, pool, len(pool.nodes))
        pool.nodes.append(node)
        nodes[spec.name] = node
        if spec.gpus:
            gpu_mem = node.gpu_mem
            pool.reference_gpu_mem = max(pool.reference_gpu_mem, *gpu_mem)
            low = min(gpu_mem)
            pool.min_gpu_mem = low if pool.min_gpu_mem == 0 else min(pool.min_gpu_mem, low)
            pool.max_gpus = max(pool.max_gpus, len(gpu_mem))
        add_capacity(node)
    return pools, nodes


def _build_queues(snapshot: Snapshot, pools: dict[str, PoolState]) -> tuple[dict[str, QueueState], QueueTree]:
    invalid = dict(snapshot.invalid_queues)
    tree = build_tree(snapshot.queues, invalid)
    for name, problem in sorted(tree.errors.items()):
        if name not in invalid:  # those the caller reported when it read them
            log.warning("queue unusable", queue=name, problem=problem)
    states: dict[str, QueueState] = {}

    for pool_name in sorted(tree.roots):
        if pool_name not in pools:
            pools[pool_name] = PoolState(pool_name, snapshot.config.strategy(pool_name))
        for root in tree.roots[pool_name]:
            _add_queue(root, None, states)
    return states, tree


def _add_queue(node: TreeQueue, parent: QueueState | None, states: dict[str, QueueState]) -> None:
    """The state of ``node`` and its subtree, into ``states``.

    Not a closure: a recursive inner function is a reference cycle of its
    own, and the scheduler process finds cyclic garbage only while it is
    young (see scheduler.collector).
    """
    spec = node.spec
    state = QueueState(
        tree=node,
        pool=spec.node_pool,
        parent=parent,
        quota=[s.quota for s in spec.resources],
        limit=[s.limit for s in spec.resources],
        borrows=borrowing(spec),
    )
    state.path = [*parent.path, state] if parent is not None else [state]
    states[spec.name] = state
    for child in node.children:
        _add_queue(child, state, states)


def build_cluster(snapshot: Snapshot) -> Cluster:
    """The working state of ``snapshot``, with its placement indexes."""
    cluster, _, _ = build_state(snapshot)
    return cluster


def build_state(snapshot: Snapshot) -> tuple[Cluster, JobBuilder, QueueTree]:
    """:func:`build_cluster`, the builder that can add jobs to it later, and the queue tree.

    The builder remembers the parsed GPU requests and which pods are seated,
    which is what :mod:`scheduler.engine.incremental` needs to update the
    state by the jobs that changed instead of building it again.
    """
    pools, nodes = _build_pools(snapshot)
    queues, tree = _build_queues(snapshot, pools)
    cluster = Cluster(
        pools=pools,
        nodes=nodes,
        queues=queues,
        jobs=[],
        now=snapshot.now,
        stale_gang_grace_s=snapshot.config.stale_gang_grace_s,
        reservation_ttl_s=snapshot.config.reservation_ttl_s,
    )
    cluster.find_sick()
    builder = JobBuilder(cluster, tree.errors, invalid=frozenset(name for name, _ in snapshot.invalid_queues))
    deferred: list[Deferred] = []
    builder.deferred = deferred
    for key, spec in _unique_jobs(snapshot):
        builder.add(key, spec)
    builder.deferred = None
    builder.irregular += seat_deferred(deferred)
    share_out(cluster, tree)
    seat_reservations(cluster, snapshot.reservations)
    cluster.set_bystanders(snapshot.bystanders)
    cluster.index_all()
    return cluster, builder, tree


def share_out(cluster: Cluster, tree: QueueTree) -> None:
    """Every queue's fair share and request, from the pools' capacity and the jobs' demand."""
    demand: dict[str, list[int]] = {}
    for queue in cluster.queues.values():
        queue.share = [0, 0, 0]
        queue.request = [0, 0, 0]
        if queue.jobs:
            demand[queue.name] = list(queue.demand)  # kept by JobBuilder.add and the engine's removals
    rows = fair_shares(tree, {name: p.capacity for name, p in cluster.pools.items()}, demand)
    for name, row in rows.items():
        state = cluster.queues[name]
        state.share = list(row.fair_share)
        state.request = list(row.request)


class JobBuilder:
    """Turns a snapshot's jobs into job states, seating and charging their running pods.

    One builder serves a cluster for as long as it lives: GPU requests are
    parsed once per distinct (GPUs, annotations) -- 150,000 pods have a
    handful -- and a pod seen twice (same namespace and name, or same uid)
    is seated and charged once, since counting it twice would hide capacity
    it does not use. ``irregular`` counts what made the state depend on the
    order jobs were added in (a duplicate pod kept from the first job, a
    running pod's missing GPUs guessed from what was free): a state with
    such input is only ever rebuilt, never updated.
    """

    def __init__(self, cluster: Cluster, queue_errors: dict[str, str], invalid: frozenset[str] = frozenset()) -> None:
        self.cluster = cluster
        self.queue_errors = queue_errors
        self.invalid = invalid
        self.parsed: dict[object, GpuRequest | str] = {}
        self.by_pool: dict[str, dict[object, tuple[GpuRequest, int, str | None]]] = {}
        self.seen_pods: set[tuple[str, str]] = set()
        self.seen_uids: set[str] = set()
        self.irregular = 0
        # While a build adds its jobs: running pods seated once all the
        # others are (seat_running).
        self.deferred: list[Deferred] | None = None

    def add(self, key: str, spec: Job) -> JobState:
        """Add one job; the caller keeps ``cluster.jobs`` and ``queue.jobs`` in key order."""
        cluster = self.cluster
        queue = cluster.queues.get(spec.queue)
        error: PendingReason | None = None
        if queue is None:
            why = self.queue_errors.get(spec.queue, f"queue {spec.queue} does not exist")
            code = (
                UnschedulableReason.INVALID_QUEUE if spec.queue in self.invalid else UnschedulableReason.UNKNOWN_QUEUE
            )
            error = PendingReason(code, why)
        elif not queue.tree.is_leaf:
            error = PendingReason(
                UnschedulableReason.NOT_LEAF_QUEUE, f"queue {spec.queue} has child queues; only leaf queues take jobs"
            )
            queue = None
        pool = cluster.pools[queue.pool] if queue is not None else None
        job = JobState(spec=spec, key=key, queue=queue, pool=pool, preemptible=spec.is_preemptible, error=error)
        if queue is not None:
            queue.jobs.append(job)
        cluster.jobs.append(job)
        nodes = cluster.nodes
        seen_pods = self.seen_pods
        seen_uids = self.seen_uids
        parsed = self.parsed
        has_pending = False
        tasks = spec.tasks if len(spec.tasks) == 1 else sorted(spec.tasks, key=_task_name)
        # Per job: everything asked (demand) and what running pods hold.
        want_gpu = want_cpu = want_mem = 0
        held_gpu = held_cpu = held_mem = 0
        known = self.by_pool.setdefault(pool.name if pool is not None else "", {})
        for tspec in tasks:
            ident = (tspec.namespace, tspec.name)
            if ident in seen_pods or (tspec.uid and tspec.uid in seen_uids):
                log.warning("duplicate pod in snapshot; keeping the first", job=key, pod=tspec.name, uid=tspec.uid)
                self.irregular += 1
                continue
            seen_pods.add(ident)
            if tspec.uid:
                seen_uids.add(tspec.uid)
            ann = tspec.annotations
            akey: object = (tspec.gpus, tuple(ann.items())) if ann else tspec.gpus
            hit = known.get(akey)
            if hit is None:
                parsed_request = parsed.get(akey)
                if parsed_request is None:
                    parsed_request = parse_gpu_request(tspec.gpus, ann)
                    parsed[akey] = parsed_request
                if isinstance(parsed_request, str):
                    log.warning("invalid GPU request", job=spec.key, pod=tspec.name, problem=parsed_request)
                    if job.error is None:
                        job.error = PendingReason(
                            UnschedulableReason.INVALID_REQUEST, f"pod {tspec.name}: {parsed_request}"
                        )
                    request, milli, never = _NO_GPU, 0, None
                else:
                    request, milli = parsed_request, milli_of(parsed_request, pool)
                    never = _never_fits(request, pool)
                    known[akey] = (request, milli, never)
                    if never is not None:
                        log.warning("GPU request fits no node of its pool", job=spec.key, pod=tspec.name, problem=never)
            else:
                request, milli, never = hit
            if tspec.gpu_milli is not None and request.whole:
                milli = tspec.gpu_milli  # MIG devices through DRA: shares of GPUs, not whole ones
            status = tspec.status
            cpu = tspec.cpu_milli
            mem = tspec.memory_mib
            task = TaskState(tspec, job, request, cpu, mem, milli, status is not PENDING, status is RELEASING)
            task.rank = len(job.tasks)
            job.tasks.append(task)
            want_gpu += milli
            want_cpu += cpu
            want_mem += mem
            placement = tspec.placement
            if placement is not None and placement.anti_affinity:
                cluster.anti_holders += 1
            if status is PENDING:
                task.shape = shape_of(task)
                has_pending = True
                if tspec.unplaceable and job.error is None:
                    job.error = PendingReason(
                        UnschedulableReason.UNSUPPORTED_PLACEMENT,
                        f"pod {tspec.name} is not placed: {tspec.unplaceable}",
                    )
                if tspec.refusal and job.error is None:
                    job.error = PendingReason(
                        UnschedulableReason.SLICE_NOT_ADMITTED, f"pod {tspec.name} is not placed: {tspec.refusal}"
                    )
                if never is not None and job.error is None:
                    job.error = PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, f"pod {tspec.name} {never}")
            else:
                seated = seat_running(nodes, task, self.deferred)
                if seated is not None:
                    held_gpu += milli
                    held_cpu += cpu
                    held_mem += mem
                    if seated:
                        self.irregular += 1
        job.demand = (want_gpu, want_cpu, want_mem)
        if queue is not None:
            queue.demand[GPU] += want_gpu
            queue.demand[CPU] += want_cpu
            queue.demand[MEMORY] += want_mem
        if queue is not None and (held_gpu or held_cpu or held_mem):
            Cluster.charge(queue, job.preemptible, held_gpu, held_cpu, held_mem)
        job.has_pending = has_pending
        if has_pending:
            cluster.pending_jobs.append(job)
        if spec.below_min_member_since is not None:
            cluster.dated_gangs.append(job)
        return job

    def forget(self, job: JobState) -> None:
        """Take a job's pods out of the seen pods (the caller unseats and uncharges them)."""
        for task in job.tasks:
            spec = task.spec
            if spec.placement is not None and spec.placement.anti_affinity:
                self.cluster.anti_holders -= 1
            self.seen_pods.discard((spec.namespace, spec.name))
            if spec.uid:
                self.seen_uids.discard(spec.uid)


_NO_GPU = GpuRequest()
PENDING = TaskStatus.PENDING
RELEASING = TaskStatus.RELEASING


def _never_fits(request: GpuRequest, pool: PoolState | None) -> str | None:
    """Why no node of ``pool`` could hold ``request`` even if it were empty.

    Such a pod would otherwise read "no node has room" cycle after cycle,
    and reclaim, preemption and consolidation would evict for it in vain;
    the person who wrote the request is the one who can act.
    """
    if pool is None or not pool.nodes:
        return None
    most = pool.max_gpus
    if request.whole > most:
        return f"asks for {request.whole} GPUs on one node; the largest node of pool {pool.name} has {most}"
    if request.is_slice and request.devices > most:
        return (
            f"asks for a GPU slice on {request.devices} GPUs of one node; "
            f"the largest node of pool {pool.name} has {most}"
        )
    if request.memory_mib is not None and request.memory_mib > pool.reference_gpu_mem:
        return (
            f"asks for {request.memory_mib} MiB of GPU memory per device; "
            f"the largest GPU in pool {pool.name} has {pool.reference_gpu_mem} MiB"
        )
    return None


def _task_name(task: Task) -> str:
    return task.name


def _unique_jobs(snapshot: Snapshot) -> list[tuple[str, Job]]:
    """Jobs in key order, one per key.

    Two jobs with one key (a watch cache that listed a pod group twice)
    would have their running pods charged twice and their pending pods
    placed twice. One is kept: the same one whatever the input order (the
    least by its full value), so that shuffling a snapshot never changes
    its decisions.
    """
    chosen: dict[str, Job] = {}
    for spec in snapshot.jobs:
        key = spec.key
        other = chosen.get(key)
        if other is None:
            chosen[key] = spec
            continue
        log.warning("duplicate job in snapshot; keeping one", job=key)
        if repr(spec) < repr(other):
            chosen[key] = spec
    return [(key, chosen[key]) for key in sorted(chosen)]


# A running pod whose GPUs depend on the pods around it, held back until
# every other running pod is seated (seat_running): its node and the pod.
Deferred = tuple[NodeState, TaskState]


def seat_running(nodes: dict[str, NodeState], task: TaskState, deferred: list[Deferred] | None = None) -> bool | None:
    """Put a running pod where the snapshot says it is; None if it cannot be.

    Where the node's kubelet reports the GPUs a whole-GPU pod holds, those
    are where it is, not the assignment (:mod:`scheduler.engine.holders`).

    True when some of its GPUs had to be guessed (:func:`_complete_assignment`).
    With ``deferred`` a pod whose GPUs depend on the others waits there
    (:func:`seat_deferred`, which counts its guesses): a guess made before
    every pod that names its GPUs is seated could take one of theirs, and
    seat two pods on one GPU while another looks free; and whether the pod
    the kubelet reports on a GPU of an unlisted pod's assignment still
    exists is known only once every pod is seated.
    """
    spec = task.spec
    node = nodes.get(spec.node) if spec.node is not None else None
    if node is None:
        log.warning("running pod on a node not in the snapshot", job=task.job.key, pod=spec.name, node=spec.node)
        return None
    positions, why, guessed, unlisted = _where(node, task, None)
    if deferred is not None and (guessed or unlisted):
        deferred.append((node, task))
        return False
    if guessed:
        positions = _complete_assignment(node, task, positions, why, None)
    _seat(node, task, positions)
    return guessed


def seat_deferred(deferred: list[Deferred]) -> int:
    """Seat the pods :func:`seat_running` held back, their missing GPUs taken from what is left; how many were guessed.

    A GPU the kubelet reports held counts against an unlisted pod's
    assignment only when the pod reported there is one of the node's
    running pods: a holder that has finished (or was deleted) since the
    agent's last read holds nothing, and the pod bound to its GPU since is
    where gpuwarden put it.
    """
    guessed = 0
    live: dict[int, frozenset[int]] = {}
    waiting: dict[int, list[TaskState]] = {}
    for node, task in deferred:
        waiting.setdefault(id(node), []).append(task)
    for node, task in deferred:
        reported = live.get(id(node))
        if reported is None:
            reported = live[id(node)] = _live_reported(node, waiting[id(node)])
        positions, why, was_guessed, _ = _where(node, task, reported)
        if was_guessed:
            guessed += 1
            positions = _complete_assignment(node, task, positions, why, reported)
        _seat(node, task, positions)
    deferred.clear()
    return guessed


def _live_reported(node: NodeState, waiting: list[TaskState]) -> frozenset[int]:
    """The GPUs the node's kubelet reports held by one of its running pods (seated, or ``waiting`` to be)."""
    held = node.spec.kubelet_holders
    if not held:
        return frozenset()
    keys: set[str] = set()
    for t in (*node.tasks, *waiting):
        if t.spec.uid:
            keys.add(t.spec.uid)
        keys.add(holder_key(t.spec.namespace, t.spec.name))
    return frozenset(i for key, indices in held.items() if key in keys for i in indices)


def _where(
    node: NodeState, task: TaskState, reported: frozenset[int] | None
) -> tuple[tuple[int, ...], str, bool, bool]:
    """Where the snapshot puts a running pod on ``node``: (GPU positions, why a guess, whether one, whether
    the kubelet leaves it unlisted while it reports some pod on a GPU of its assignment).

    ``reported`` are the GPUs the kubelet reports held by others (None: every GPU it reports held).
    """
    spec = task.spec
    gpu = task.gpu
    indices = spec.gpu_indices
    why = "its GPU assignment names fewer GPUs than it requests"
    unlisted = False
    if node.spec.kubelet_holders and not gpu.is_slice:
        # The kubelet's word over the assignment for whole GPUs (scheduler.engine.holders).
        real = kubelet_gpus(node.spec, spec)
        if real is not None:
            indices = real
        elif indices:
            # Not listed (started since the agent's last read): its assignment
            # less the GPUs the kubelet reports other pods holding, which keep
            # their devices for life. The pod it swapped with is listed there.
            if reported is None:
                reported = reported_gpus(node.spec)
            kept = tuple(i for i in indices if i not in reported)
            if len(kept) < len(indices):
                unlisted = True
                why = f"the kubelet reports another pod on its assigned GPU {', '.join(map(str, indices))}"
                indices = kept
    positions: tuple[int, ...] = indices
    # Fast path: devices numbered 0..n-1 (as they nearly always are), so an
    # index is its own position.
    if indices and not (node.dense and min(indices) >= 0 and max(indices) < len(node.gpu_index)):
        found: list[int] = []
        for index in indices:
            p = node.position(index)
            if p is None:
                log.warning("running pod holds a GPU the node does not list", pod=spec.name, node=node.name, gpu=index)
                continue
            found.append(p)
        positions = tuple(found)
    wanted = gpu.devices if gpu.is_slice else gpu.whole
    count = len(positions)
    guessed = count < wanted or (count > 1 and len(set(positions)) < count)
    return positions, why, guessed, unlisted


def _seat(node: NodeState, task: TaskState, positions: tuple[int, ...]) -> None:
    gpu = task.gpu
    if gpu.is_slice:
        mem = node.gpu_mem
        Cluster.seat(task, node, positions, tuple([gpu.slice_on(mem[p]) for p in positions]))
    else:
        Cluster.seat(task, node, positions, ())


def _complete_assignment(
    node: NodeState, task: TaskState, positions: tuple[int, ...], why: str, reported: frozenset[int] | None
) -> tuple[int, ...]:
    """A running pod's GPUs when the snapshot names too few (or one twice).

    The pod holds the devices it asked for whatever the snapshot says;
    leaving them free would let this session bind a second pod onto a GPU in
    use. The missing ones are taken from GPUs nobody holds (usable ones
    first, then the most free memory for a slice; for a whole GPU, ones the
    kubelet reports nobody on first; ``reported`` are the GPUs it reports
    held, None for all it lists): the count is right even if the indices
    are a guess, and the log says so.
    """
    gpu = task.gpu
    wanted = gpu.devices if gpu.is_slice else gpu.whole
    distinct = list(dict.fromkeys(positions))
    missing = wanted - len(distinct)
    if missing > 0:
        taken = set(distinct)
        if gpu.is_slice:
            spare = [p for p in range(len(node.gpu_mem)) if p not in taken and not node.gpu_whole[p]]
            spare.sort(key=lambda p: (not node.gpu_ok[p], -node.gpu_free[p], p))
        else:
            spare = [
                p
                for p in range(len(node.gpu_mem))
                if p not in taken and not node.gpu_whole[p] and not node.gpu_slices[p]
            ]
            held = reported if reported is not None else reported_gpus(node.spec)
            spare.sort(key=lambda p: (not node.gpu_ok[p], node.gpu_index[p] in held, p))
        distinct.extend(spare[:missing])
        log.warning(
            "running pod's GPUs partly unknown; counting unassigned GPUs as held",
            why=why,
            job=task.job.key,
            pod=task.spec.name,
            node=node.name,
            named=[node.gpu_index[p] for p in positions],
            counted=sorted(node.gpu_index[p] for p in distinct),
            requested=wanted,
        )
    return tuple(sorted(distinct))
