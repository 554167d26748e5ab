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

# The pod group a pod belongs to (set by users or by the scheduler's
# pod-grouper), and the GPU assignment the scheduler made at bind time.
ANNOTATION_POD_GROUP: Final = f"{SCHEDULING_API_GROUP}/pod-group"
ANNOTATION_GPU_ASSIGNMENT: Final = f"{API_GROUP}/gpu-assignment"

# Remediation state, persisted on the Node so a restarted scheduler loses
# nothing (DESIGN.md, Remediation).
ANNOTATION_REMEDIATION_STATE: Final = f"{API_GROUP}/remediation-state"
TAINT_QUARANTINE: Final = f"{API_GROUP}/quarantined"

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


class UnschedulableReason(StrEnum):
    """Why a pod group is still pending, as written to its PodGroup status."""

    UNKNOWN_QUEUE = "UnknownQueue"
    NOT_LEAF_QUEUE = "NotLeafQueue"
    INVALID_REQUEST = "InvalidRequest"
    OVER_LIMIT = "OverLimit"
    NON_PREEMPTIBLE_OVER_QUOTA = "NonPreemptibleOverQuota"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    NO_ELIGIBLE_NODES = "NoEligibleNodes"
    GANG_INCOMPLETE = "GangIncomplete"
