"""The names shared by the agent and the scheduler, and nothing else.

DESIGN.md's contract lives here as constants so that a typo is an import error
rather than a condition nobody reads. Every other module imports these names;
no other module spells the strings. Changing a value here is an API change for
every cluster that runs gpuwarden: alert rules, dashboards and workloads
written against KAI match on them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# --------------------------------------------------------------------------
# API groups, versions and kinds
# --------------------------------------------------------------------------

API_GROUP: Final = "gpuwarden.io"
API_VERSION: Final = "v1alpha1"
SCHEDULING_API_GROUP: Final = "scheduling.gpuwarden.io"
SCHEDULING_API_VERSION: Final = "v1alpha1"

GPUNODE_KIND: Final = "GPUNode"
GPUNODE_PLURAL: Final = "gpunodes"
# Remediation's requests to a node's agent (GPUNode spec.remediation, written
# by the scheduler) and the agent's answers (status.remediation): resets and
# validations, each answer echoing its request's requestedAt.
GPUNODE_REMEDIATION: Final = "remediation"
# The Warning Event (reason) on a whole-GPU pod that the kubelet's device
# manager started on a GPU out of service (quarantined, or faulted) while
# gpuwarden had assigned it another; the scheduler evicts it at once.
EVENT_POD_ON_QUARANTINED_GPU: Final = "PodOnQuarantinedGpu"
# Who holds each GPU, as the node's kubelet assigned it (its PodResources
# API), written by the agent per GPU in GPUNode status.gpus[]: "pods" lists
# the holders (namespace, name, uid, container, resource, schedulerName; uid
# and schedulerName are absent while the agent cannot read the pod),
# "allocatable" whether the device plugin offers the GPU (absent when the
# kubelet did not say), "podsOmitted" how many holders past the bound were
# left out. status.podResources says whether the last read succeeded
# ("ok", and "reason"/"message" when not: the holders are then as last read).
# All absent where the agent reads no PodResources socket.
GPUNODE_GPU_PODS: Final = "pods"
GPUNODE_GPU_ALLOCATABLE: Final = "allocatable"
GPUNODE_GPU_PODS_OMITTED: Final = "podsOmitted"
GPUNODE_POD_RESOURCES: Final = "podResources"
HOLDER_NAMESPACE: Final = "namespace"
HOLDER_NAME: Final = "name"
HOLDER_UID: Final = "uid"
HOLDER_CONTAINER: Final = "container"
HOLDER_RESOURCE: Final = "resource"
HOLDER_SCHEDULER_NAME: Final = "schedulerName"
# At most this many holders are listed per GPU (time-slicing replicas can be many).
GPUNODE_MAX_PODS_PER_GPU: Final = 64
REMEDIATION_RESETS: Final = "resets"
REMEDIATION_VALIDATIONS: Final = "validations"
REMEDIATION_REQUESTED_AT: Final = "requestedAt"
RESET_WAITING: Final = "Waiting"
RESET_SUCCEEDED: Final = "Succeeded"
RESET_FAILED: Final = "Failed"

QUEUE_KIND: Final = "Queue"
QUEUE_PLURAL: Final = "queues"
PODGROUP_KIND: Final = "PodGroup"
PODGROUP_PLURAL: Final = "podgroups"

# The name pods put in spec.schedulerName to be placed by gpuwarden.
SCHEDULER_NAME: Final = "gpuwarden"

# The Kubernetes component name on Events the agent writes.
AGENT_COMPONENT: Final = "gpuwarden-agent"
SCHEDULER_COMPONENT: Final = "gpuwarden-scheduler"

# --------------------------------------------------------------------------
# NodeConditions (status True means the problem is present)
# --------------------------------------------------------------------------


class ConditionType(StrEnum):
    """Node condition types owned by the agent; it never writes any other."""

    GPU_XID_ERROR = "GpuXidError"
    GPU_MEMORY_DEGRADED = "GpuMemoryDegraded"
    GPU_NVLINK_DEGRADED = "GpuNvlinkDegraded"
    GPU_PCIE_DEGRADED = "GpuPcieDegraded"
    INFINIBAND_DEGRADED = "InfinibandDegraded"
    GPU_MISSING = "GpuMissing"
    STORAGE_DEGRADED = "StorageDegraded"


# Reason written with status False: one per condition type so that
# `kubectl describe node` reads naturally ("GpuXidError False NoXidError").
HEALTHY_REASONS: Final[dict[ConditionType, str]] = {
    ConditionType.GPU_XID_ERROR: "NoFatalXid",
    ConditionType.GPU_MEMORY_DEGRADED: "GpuMemoryHealthy",
    ConditionType.GPU_NVLINK_DEGRADED: "NvlinkHealthy",
    ConditionType.GPU_PCIE_DEGRADED: "PcieHealthy",
    ConditionType.INFINIBAND_DEGRADED: "InfinibandHealthy",
    ConditionType.GPU_MISSING: "AllGpusPresent",
    ConditionType.STORAGE_DEGRADED: "StorageHealthy",
}


class Reason(StrEnum):
    """Reasons written with status True.

    XID reasons are built by :func:`xid_reason` ("Xid79") because the set of
    XIDs is open-ended; the others are fixed.
    """

    ROW_REMAP_PENDING = "RowRemapPending"
    ROW_REMAP_FAILURE = "RowRemapFailure"
    RETIRED_PAGES_PENDING = "RetiredPagesPending"
    RETIRED_PAGES_LIMIT = "RetiredPagesLimit"
    NVLINK_DOWN = "NvlinkDown"
    NVLINK_ERROR_RATE = "NvlinkErrorRate"
    PCIE_WIDTH_DEGRADED = "PcieWidthDegraded"
    PCIE_GEN_DEGRADED = "PcieGenDegraded"
    PCIE_REPLAY_RATE = "PcieReplayRate"
    IB_PORT_DOWN = "IbPortDown"
    IB_PORT_MISSING = "IbPortMissing"
    IB_RATE_DEGRADED = "IbRateDegraded"
    IB_LINK_DOWNED = "IbLinkDowned"
    GPU_COUNT_MISMATCH = "GpuCountMismatch"
    GPU_LOST = "GpuLost"
    MOUNT_HUNG = "MountHung"
    MOUNT_MISSING = "MountMissing"
    # Several reasons at once on one condition (several GPUs with different
    # faults): the message lists each.
    MULTIPLE_FAULTS = "MultipleFaults"


XID_REASON_PREFIX: Final = "Xid"


def xid_reason(xid: int) -> str:
    """The condition reason for an XID, e.g. ``Xid79``."""
    return f"{XID_REASON_PREFIX}{xid}"


class Action(StrEnum):
    """Recommended action, in increasing order of cost.

    The order matters: when several faults sit on one node, the node's action
    is the most expensive of them (see :func:`worst_action`).
    """

    NONE = "NONE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    REBOOT = "REBOOT"
    REPLACE = "REPLACE"


_ACTION_ORDER: Final = {a: i for i, a in enumerate(Action)}


def worst_action(actions: list[Action] | tuple[Action, ...]) -> Action:
    """The most expensive of ``actions``; ``NONE`` for an empty list."""
    return max(actions, key=_ACTION_ORDER.__getitem__, default=Action.NONE)


# --------------------------------------------------------------------------
# Resources, labels and annotations
# --------------------------------------------------------------------------

# MiB of GPU memory on healthy GPUs, in node capacity/allocatable.
RESOURCE_GPU_MEMORY: Final = f"{API_GROUP}/gpu-memory"
# Whole GPUs as advertised by NVIDIA's device plugin.
RESOURCE_NVIDIA_GPU: Final = "nvidia.com/gpu"

LABEL_QUEUE: Final = f"{API_GROUP}/queue"
LABEL_NODE_POOL: Final = f"{API_GROUP}/node-pool"
LABEL_KAI_QUEUE: Final = "kai.scheduler/queue"

ANNOTATION_GPU_FRACTION: Final = f"{API_GROUP}/gpu-fraction"
ANNOTATION_GPU_MEMORY: Final = f"{API_GROUP}/gpu-memory"
ANNOTATION_GPU_FRACTION_NUM_DEVICES: Final = f"{API_GROUP}/gpu-fraction-num-devices"
# KAI's spellings, read for workloads written for KAI.
ANNOTATION_KAI_GPU_FRACTION: Final = "gpu-fraction"
ANNOTATION_KAI_GPU_MEMORY: Final = "gpu-memory"
ANNOTATION_KAI_GPU_FRACTION_NUM_DEVICES: Final = "gpu-fraction-num-devices"
# Bounds on those annotations, the same in the webhook and the scheduler. A
# fraction is a plain decimal of at most GPU_FRACTION_DECIMALS places (queues
# are charged in thousandths of a GPU, so finer digits would mean nothing),
# at least MIN_GPU_FRACTION and at most 1. GPU memory is whole MiB, at most
# MAX_GPU_MEMORY_MIB: 1 TiB, over three times the largest GPU made today
# (288 GB), so the bound holds before the webhook knows the cluster's GPUs.
# A slice spans at most MAX_GPU_FRACTION_NUM_DEVICES GPUs of one node.
GPU_FRACTION_DECIMALS: Final = 3
MIN_GPU_FRACTION: Final = "0.001"
MAX_GPU_MEMORY_MIB: Final = 1024 * 1024
MAX_GPU_FRACTION_NUM_DEVICES: Final = 64

# The pod group a pod belongs to (set by users or by the scheduler's
# pod-grouper), and the GPU assignment the scheduler made at bind time.
ANNOTATION_POD_GROUP: Final = f"{SCHEDULING_API_GROUP}/pod-group"
ANNOTATION_GPU_ASSIGNMENT: Final = f"{API_GROUP}/gpu-assignment"
# The scheduler replica (its leader-election identity) that decided a bind,
# an eviction or a slice ConfigMap. The admission policy
# gpuwarden-scheduler-fence refuses the write when the Lease names another
# holder; a Binding's annotations are copied onto the pod, so every bound pod
# says which replica bound it.
ANNOTATION_LEASE_HOLDER: Final = f"{SCHEDULING_API_GROUP}/lease-holder"

# The GPU slice a pod holds, as its containers see it: before binding a slice
# pod the scheduler writes these keys into a ConfigMap owned by the pod (named
# after it, with this suffix), and the admission webhook injects that
# ConfigMap into the pod's containers with envFrom. HAMi-core, on the node,
# reads the CUDA_* variables; CUDA_DEVICE_MEMORY_LIMIT is suffixed _0, _1, ...
# per device for a slice on more than one GPU.
SLICE_CONFIGMAP_SUFFIX: Final = "-gpu-slice"
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_MEMORY_LIMIT: Final = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_CUDA_DEVICE_SM_LIMIT: Final = "CUDA_DEVICE_SM_LIMIT"
ENV_GPU_FRACTION: Final = "GPUWARDEN_GPU_FRACTION"
# The runtime class that preloads HAMi-core: the webhook sets it on slice
# pods that name none, and the scheduler places no slice pod without one
# (both take it from their --runtime-class flag, this by default).
SLICE_RUNTIME_CLASS: Final = "nvidia"
# The scheduler's admission webhook: its configuration, Service and certificate Secret.
WEBHOOK_COMPONENT: Final = "gpuwarden-webhook"

# Remediation state, persisted on the Node so a restarted scheduler loses
# nothing (DESIGN.md, Remediation).
ANNOTATION_REMEDIATION_STATE: Final = f"{API_GROUP}/remediation-state"
TAINT_QUARANTINE: Final = f"{API_GROUP}/quarantined"
# The node's remediation state in one word, for `kubectl get nodes -L
# gpuwarden.io/state`; the values are RemediationState's, "gpu-" before them
# when only single GPUs are out.
LABEL_REMEDIATION_STATE: Final = f"{API_GROUP}/state"
# What an escalated node needs from people: an Action's value (REBOOT, REPLACE).
LABEL_REPAIR_NEEDED: Final = f"{API_GROUP}/repair-needed"
# Set by a person (any value, e.g. a ticket number) once the escalated repair
# is done; remediation then re-validates the hardware and removes it.
ANNOTATION_ESCALATION_CLEARED: Final = f"{API_GROUP}/escalation-cleared"
# What remediation fences off for placement, derived from the state above and
# written with it, in a form the scheduler's placement (and people) read at a
# glance: the GPUs quarantined one by one ("2,5"), and "true" while the whole
# node is drained. A fenced GPU takes no new work from gpuwarden at once.
ANNOTATION_QUARANTINED_GPUS: Final = f"{API_GROUP}/quarantined-gpus"
ANNOTATION_DRAINING: Final = f"{API_GROUP}/draining"
# Dynamic Resource Allocation (resource.k8s.io/v1, GA since Kubernetes 1.34).
# NVIDIA's DRA driver publishes every GPU of a node as a device of the pool
# named after the node, in ResourceSlices of this driver. For each GPU
# remediation quarantines one by one, the scheduler keeps a DeviceTaintRule
# (NoSchedule, key TAINT_QUARANTINE) selecting that device, so that every
# DRA-aware scheduler keeps new claims off it; it is removed when the GPU
# returns. Each rule carries the managed-by label below and, for people, the
# node and GPU in ANNOTATION_DEVICE_TAINT_GPU ("node/index").
DRA_API_GROUP: Final = "resource.k8s.io"
DRA_API_VERSION: Final = "v1"
RESOURCESLICE_PLURAL: Final = "resourceslices"
DEVICETAINTRULE_PLURAL: Final = "devicetaintrules"
RESOURCECLAIM_PLURAL: Final = "resourceclaims"
DEVICECLASS_PLURAL: Final = "deviceclasses"
NVIDIA_DRA_DRIVER: Final = "gpu.nvidia.com"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
ANNOTATION_DEVICE_TAINT_GPU: Final = f"{API_GROUP}/gpu"
# On a Namespace, set by its admins (the scheduler cannot write Namespaces):
# remediation's delete-after-timeout drain may delete this namespace's pods.
# The scheduler's admission policy refuses its pod deletes everywhere else.
LABEL_DRAIN_POLICY: Final = f"{API_GROUP}/drain-policy"


class RemediationState(StrEnum):
    """Where one quarantined scope (a GPU or a whole node) is in remediation."""

    HEALTHY = "healthy"
    QUARANTINED = "quarantined"
    DRAINING = "draining"
    REPAIRING = "repairing"
    VALIDATING = "validating"
    ESCALATED = "escalated"
    FAILED = "failed"


# Prometheus metric namespace.
METRICS_PREFIX: Final = "gpuwarden"

# --------------------------------------------------------------------------
# Scheduler decisions visible through the API (Events, PodGroup status)
# --------------------------------------------------------------------------

# The node pool of a node without the LABEL_NODE_POOL label, and of a queue
# that names none.
DEFAULT_NODE_POOL: Final = "default"


class EvictionAction(StrEnum):
    """The scheduler action that evicted a pod; Events and metrics carry it."""

    HEALTH_EVICTION = "HealthEviction"
    RECLAIM = "Reclaim"
    PREEMPT = "Preempt"
    CONSOLIDATE = "Consolidate"
    STALE_GANG = "StaleGang"
    # Remediation draining a quarantined node of pods no gpuwarden action owns.
    REMEDIATION_DRAIN = "RemediationDrain"


class UnschedulableReason(StrEnum):
    """Why a pod group is still pending, as written to its PodGroup status."""

    UNKNOWN_QUEUE = "UnknownQueue"
    # The queue exists but its spec does not parse (its Invalid condition says why).
    INVALID_QUEUE = "InvalidQueue"
    NOT_LEAF_QUEUE = "NotLeafQueue"
    INVALID_REQUEST = "InvalidRequest"
    OVER_LIMIT = "OverLimit"
    NON_PREEMPTIBLE_OVER_QUOTA = "NonPreemptibleOverQuota"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    NO_ELIGIBLE_NODES = "NoEligibleNodes"
    GANG_INCOMPLETE = "GangIncomplete"
    # A GPU slice pod without what the admission webhook injects (its slice
    # ConfigMap's envFrom, the runtime class): bound, it would see whole GPUs.
    SLICE_NOT_ADMITTED = "SliceNotAdmitted"
    # A placement rule the scheduler cannot judge (a volume claim not bound
    # yet, a pod affinity namespace selector with labels): bound anyway, the
    # pod could break it, so it waits saying which.
    UNSUPPORTED_PLACEMENT = "UnsupportedPlacement"


# --------------------------------------------------------------------------
# Scheduling objects
# --------------------------------------------------------------------------
# Field names of the Queue and PodGroup custom objects
# (manifests/scheduler/crds/crd-*.yaml), as the API server stores them. The CRDs
# spell them too; tests check that both agree.

# Queue .spec
QUEUE_SPEC_PARENT: Final = "parentQueue"
QUEUE_SPEC_PRIORITY: Final = "priority"
QUEUE_SPEC_NODE_POOL: Final = "nodePool"
QUEUE_SPEC_RESOURCES: Final = "resources"
QUEUE_RESOURCE_QUOTA: Final = "quota"
QUEUE_RESOURCE_LIMIT: Final = "limit"
QUEUE_RESOURCE_OVER_QUOTA_WEIGHT: Final = "overQuotaWeight"
# The resources a queue may govern, the keys under .spec.resources and under
# every per-resource status field. A GPU amount is a number of GPUs (0.5 is
# half of one); cpu and memory are Kubernetes quantities ("500m", 8, "64Gi").
QUEUE_RESOURCE_GPU: Final = "gpu"
QUEUE_RESOURCE_CPU: Final = "cpu"
QUEUE_RESOURCE_MEMORY: Final = "memory"

# Queue .status: one amount per resource in each of these.
QUEUE_STATUS_FAIR_SHARE: Final = "fairShare"
# What reclaim wins back for the queue: its quota as far as its fair share backs it.
QUEUE_STATUS_GUARANTEED: Final = "guaranteed"
QUEUE_STATUS_ALLOCATED: Final = "allocated"
QUEUE_STATUS_ALLOCATED_NON_PREEMPTIBLE: Final = "allocatedNonPreemptible"
QUEUE_STATUS_REQUESTED: Final = "requested"
# GPU-seconds of the queue's running work that hardware faults evicted, since the queue existed.
QUEUE_STATUS_GPU_SECONDS_LOST: Final = "gpuSecondsLostToFaults"

# PodGroup .spec
PODGROUP_SPEC_MIN_MEMBER: Final = "minMember"
PODGROUP_SPEC_QUEUE: Final = "queue"
PODGROUP_SPEC_PRIORITY_CLASS_NAME: Final = "priorityClassName"
PODGROUP_SPEC_PREEMPTIBILITY: Final = "preemptibility"

# PodGroup .status
PODGROUP_STATUS_PHASE: Final = "phase"
PODGROUP_STATUS_SCHEDULED: Final = "scheduled"
# Room held for the group across cycles (scheduler/cluster/reservations.py).
PODGROUP_STATUS_RESERVATIONS: Final = "reservations"

# Both kinds keep metav1.Condition-shaped entries here.
STATUS_CONDITIONS: Final = "conditions"
STATUS_OBSERVED_GENERATION: Final = "observedGeneration"


class Preemptibility(StrEnum):
    """PodGroup .spec.preemptibility; left out, it follows the priority class."""

    PREEMPTIBLE = "preemptible"
    NON_PREEMPTIBLE = "non-preemptible"


class QueueConditionType(StrEnum):
    """Queue condition types; status True means the problem is present, as
    with the agent's NodeConditions."""

    # The queue's quota is more than what backs it (the pool's healthy
    # capacity for a top-level queue, the parent's quota otherwise); the
    # message names the resource and the shortfall.
    QUOTA_NOT_BACKED = "QuotaNotBacked"
    # Part of what the queue's quota promises at its current demand
    # (min(quota, requested)) is not guaranteed: the quotas of its level add
    # up to more than backs the level. The message says how much and why.
    QUOTA_NOT_GUARANTEED = "QuotaNotGuaranteed"
    # The queue cannot take work: its spec does not parse, or its place in
    # the tree is broken (unknown parent, a loop, a parent in another pool).
    INVALID = "Invalid"


class QueueConditionReason(StrEnum):
    """Reasons on Queue conditions."""

    QUOTA_EXCEEDS_CAPACITY = "QuotaExceedsCapacity"
    QUOTA_EXCEEDS_PARENT = "QuotaExceedsParent"
    QUOTA_BACKED = "QuotaBacked"
    # QuotaNotGuaranteed: True, False.
    QUOTAS_EXCEED_BACKING = "QuotasExceedBacking"
    QUOTA_GUARANTEED = "QuotaGuaranteed"
    INVALID_SPEC = "InvalidSpec"
    INVALID_TREE = "InvalidTree"
    VALID = "Valid"


class PodGroupConditionType(StrEnum):
    """PodGroup condition types.

    ``Unschedulable`` is True while the group waits; its reason is one of
    :class:`UnschedulableReason` and its message the engine's explanation.
    ``EvictionBlocked`` is present (True) while evictions of its pods are
    refused; its message names the pods and what refused them.
    """

    UNSCHEDULABLE = "Unschedulable"
    # True while an eviction the scheduler decided for the group's pods is
    # refused (a PodDisruptionBudget): it is retried, never bypassed.
    EVICTION_BLOCKED = "EvictionBlocked"


# Reason on Unschedulable False: the gang (minMember pods) is placed.
PODGROUP_SCHEDULED_REASON: Final = "Scheduled"


class PodGroupPhase(StrEnum):
    """PodGroup .status.phase.

    Pending: fewer than minMember pods placed. Running: at least minMember
    placed, running or succeeded. Succeeded / Failed: no pod is left to run;
    Failed when some failed and fewer than minMember succeeded (a failure
    the workload retried past does not fail a gang that completed).
    """

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
