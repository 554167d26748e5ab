"""Raw samples: what the sources read, before any judgement.

The sources and probes fill these plain, immutable records; the health rules read them to
decide on faults, and the metrics publisher reads them to export gauges and
counters. Nothing here says whether a value is good or bad.

Conventions, so that every reader interprets a sample the same way:

* ``None`` means "this hardware has no such thing, or the driver does not
  report it" (NVML ``NotSupported``, a missing sysfs file). It is never a
  fault and never zero.
* Counters are the hardware's cumulative values as read; rates are the rules'
  business (they keep the history).
* PCI bus ids are normalised by :func:`normalize_bus_id` to NVML's own
  spelling, ``00000000:3B:00.0``, because the kernel log prints the same GPU
  as ``0000:3b:00`` and both must map to one GPU. NVML's form is the one a
  person pastes into ``nvidia-smi -i`` and the one ``nvidia-smi --query-gpu=
  pci.bus_id`` and dcgm-exporter's ``pci_bus_id`` label show, so messages,
  the GPUNode and the logs can be matched against them as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum


def normalize_bus_id(bus_id: str) -> str:
    """``0000:3b:00`` / ``PCI:0000:3b:00`` / ``3b:00.0`` -> ``00000000:3B:00.0``.

    The result is NVML's ``busId`` spelling: an eight-digit domain, upper-case
    hex, and the PCI function (0 when the text has none: the kernel log drops
    it, and a GPU is function 0). Text that is not a bus id is returned
    stripped, so a lookup simply misses instead of raising.
    """
    text = bus_id.strip()
    if text[:4].lower() == "pci:":
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return text
    domain, bus, devfn = parts
    device, _, function = devfn.partition(".")
    try:
        d, b, dev, fn = int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16)
    except ValueError:
        return text
    return f"{d:08X}:{b:02X}:{dev:02X}.{fn:X}"


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """``nvmlDeviceGetRemappedRows``: Ampere and later.

    ``pending`` means a remap is recorded but takes effect only after a GPU
    reset; ``failure`` means the GPU ran out of spare rows for a bank.
    """

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Dynamic page retirement: pre-Ampere GPUs (Volta and older).

    ``pending`` means retired pages wait for a reboot or GPU reset to be
    blacklisted.
    """

    single_bit_ecc: int
    double_bit_ecc: int
    pending: bool


@dataclass(frozen=True, slots=True)
class NvlinkSample:
    """One NVLink of one GPU: state and the data-link error counters."""

    link: int
    active: bool
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None

    @property
    def error_total(self) -> int:
        """Sum of the counters this link reports (unsupported ones count 0)."""
        return sum(
            v
            for v in (self.replay_errors, self.recovery_errors, self.crc_flit_errors, self.crc_data_errors)
            if v is not None
        )


@dataclass(frozen=True, slots=True)
class PcieSample:
    """PCIe link of one GPU: current against maximum, and the replay counter."""

    current_gen: int | None = None
    max_gen: int | None = None
    current_width: int | None = None
    max_width: int | None = None
    replay_counter: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything NVML told us about one GPU in one poll.

    ``lost`` is True when NVML answered ``GPU_IS_LOST`` (the GPU fell off the
    bus) or could not name the GPU at all: the identity fields then hold what
    was last known about it, the rest are ``None`` and ``errors`` says why.
    Otherwise ``errors`` lists fields that failed for a reason other than
    "not supported" (they are logged; the sample keeps what did work).
    """

    index: int
    uuid: str
    pci_bus_id: str  # normalised, see normalize_bus_id
    name: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    mig_enabled: bool | None = None
    utilization_gpu_pct: int | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    nvlinks: tuple[NvlinkSample, ...] = ()
    pcie: PcieSample | None = None
    lost: bool = False
    errors: tuple[str, ...] = ()

    @property
    def memory_total_mib(self) -> int:
        return (self.memory_total_bytes or 0) // (1024 * 1024)

    @property
    def memory_used_mib(self) -> int | None:
        return None if self.memory_used_bytes is None else self.memory_used_bytes // (1024 * 1024)


class GpuEventKind(StrEnum):
    """What an asynchronous GPU event says happened."""

    XID = "xid"
    # "GPU has fallen off the bus" printed without an XID number.
    FALLEN_OFF_BUS = "fallen_off_bus"
    ECC_SINGLE_BIT = "ecc_single_bit"
    ECC_DOUBLE_BIT = "ecc_double_bit"
    # Row remap / page retirement recorded, or failed to record.
    RETIREMENT = "retirement"
    RETIREMENT_FAILURE = "retirement_failure"


XID_RECOVERY_ACTION = 154
"""XID "GPU recovery action changed": the one XID that carries a value of its
own, the recovery action the driver asks for (``GpuEvent.recovery_action``)."""

# XID 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
_RECOVERY_RE = re.compile(
    r"recovery action changed from\s+\S+(?:\s+\([^)]*\))?\s+to\s+(?:0x(?P<hex>[0-9a-f]+)|(?P<dec>[0-9]+))\b",
    re.IGNORECASE | re.ASCII,
)


def parse_recovery_action(text: str) -> int | None:
    """The recovery action an XID 154 line changed *to*, as NVML numbers it.

    The driver's kernel-log text is the only place that names it besides
    NVML's field, so the kmsg parser and the sim's NVML both read it here.
    ``None`` when the text does not say (a driver wording we do not know);
    the rules then fall back to the catalogue's action.
    """
    m = _RECOVERY_RE.search(text)
    if m is None:
        return None
    return int(m.group("hex"), 16) if m.group("hex") is not None else int(m.group("dec"))


class EventSource(StrEnum):
    NVML = "nvml"
    KMSG = "kmsg"


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One asynchronous GPU event, from the NVML event set or the kernel log.

    ``pci_bus_id`` (normalised) identifies the GPU; NVML events also carry
    ``uuid``. ``time`` is when it happened as best known: the kernel's record
    time for kmsg lines (so a restarted agent keeps the real time), arrival
    time for NVML events.

    ``recovery_action`` is, for XID 154, the recovery action the driver now
    asks for, as NVML numbers it (``nvmlDeviceGpuRecoveryAction_t``: 0 none,
    1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset, ...):
    read from the kernel-log text or from NVML's recovery-action field;
    ``None`` when neither said.

    ``supplement`` marks the other source's report of an event already
    delivered, passed on only because it carries what the first report
    lacked (XID 154's recovery action): the rules update the fault from it but
    make no second Event, and it is not counted again.

    ``history`` marks a kernel-log record that a previous run of the agent
    already read in this boot (a restart replays the ring buffer from its
    start): it still feeds the rules, so a latched fault is raised again from
    it, but it makes no Event and is not counted, so a restart neither
    re-announces last week's XIDs nor makes the XID counters jump.
    """

    kind: GpuEventKind
    source: EventSource
    time: datetime
    pci_bus_id: str | None = None
    uuid: str | None = None
    xid: int | None = None
    message: str = ""
    recovery_action: int | None = None
    supplement: bool = False
    history: bool = False

    @property
    def announced(self) -> bool:
        """Already told to people, by this run (a supplement) or the previous one (history)."""
        return self.supplement or self.history

    def completed_by(self, twin: GpuEvent) -> GpuEvent | None:
        """This report with what ``twin`` (the other source's report of the
        same occurrence) adds to it, or ``None`` when it adds nothing.

        Only XID 154's recovery action is worth the merge: NVML's event has no
        text, and the kernel log's line may be the only place it is said.
        """
        if twin.recovery_action is None or self.recovery_action is not None:
            return None
        return replace(self, recovery_action=twin.recovery_action, message=self.message or twin.message)

    def as_supplement(self) -> GpuEvent:
        """This report marked as completing one the rules already had."""
        return replace(self, supplement=True)


@dataclass(frozen=True, slots=True)
class XidCount:
    """How many times one XID was seen on one GPU since the agent started."""

    pci_bus_id: str | None
    uuid: str | None
    gpu_index: int | None
    xid: int
    count: int


# ---------------------------------------------------------------------------
# InfiniBand / RoCE
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IbCounters:
    """Port error counters from ``ports/<n>/counters/`` (cumulative)."""

    link_downed: int | None = None
    symbol_error: int | None = None
    link_error_recovery: int | None = None
    port_rcv_errors: int | None = None


@dataclass(frozen=True, slots=True)
class IbPortSample:
    """One port of one HCA: sysfs state and rate, plus its netdev's link.

    ``state`` and ``phys_state`` are the names sysfs prints after the number
    (``4: ACTIVE`` -> ``ACTIVE``, ``5: LinkUp`` -> ``LinkUp``). The ``netdev_*``
    fields come from netlink (pyroute2) for the RoCE or IPoIB interface behind
    the port, when there is one.
    """

    device: str
    port: int
    state: str
    phys_state: str
    rate_gbps: float | None
    link_layer: str
    counters: IbCounters = field(default_factory=IbCounters)
    netdev: str | None = None
    netdev_oper_state: str | None = None  # IFLA_OPERSTATE: UP, DOWN, LOWERLAYERDOWN, ...
    netdev_speed_mbps: int | None = None  # ethtool link speed
    netdev_admin_up: bool | None = None  # IFF_UP: someone meant the netdev to be up


# ---------------------------------------------------------------------------
# Shared storage
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountSample:
    """The latest responsiveness check of one configured mount point.

    ``mounted`` is False when the path is not a mount point (the shared
    filesystem is missing and jobs would write to the root disk); ``responsive``
    is False while a ``statvfs`` has been outstanding longer than the timeout.
    """

    path: str
    mounted: bool
    responsive: bool
    latency_s: float | None = None
    error: str | None = None


# ---------------------------------------------------------------------------
# One poll
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Devices held by pods (the kubelet's PodResources API)
# ---------------------------------------------------------------------------


class PodResourcesFailure(StrEnum):
    """Why the kubelet's PodResources API could not be read (the metric's ``reason``)."""

    MISSING = "missing"  # no socket at the configured path
    REFUSED = "refused"  # a socket nobody listens on, or no permission to connect
    TIMEOUT = "timeout"  # no answer within the timeout (a hung kubelet)
    UNIMPLEMENTED = "unimplemented"  # the kubelet does not serve the call (an older kubelet, a gate off)
    INVALID = "invalid"  # an answer that is not the v1 service's (not gRPC, undecodable)
    ERROR = "error"  # any other error status from the kubelet


@dataclass(frozen=True, slots=True)
class HeldDevices:
    """Devices of one resource held by one container, as the kubelet's ``List`` names them.

    ``resource`` is the extended resource (``nvidia.com/gpu``) for a device
    plugin's devices, ``dra:<driver>`` for a DRA claim's; ``device_ids`` are
    the plugin's device IDs (GPU UUIDs for NVIDIA's plugin, ``<uuid>::<n>``
    for a time-sliced replica), or for DRA the device name followed by its
    CDI device names.
    """

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodResourcesSample:
    """One read of the kubelet's PodResources API.

    ``held`` is every device of every container ``List`` reported, GPUs or
    not (the mapping to GPUs is :mod:`agent.allocations`'s); it means
    something only when ``listed`` (``List`` answered). ``allocatable``
    holds the device IDs ``GetAllocatableResources`` reported, ``None`` when
    that call failed or the kubelet does not serve it (nothing is then said
    about which GPUs are offered). ``failure`` and ``error`` say why a call
    failed (the first that did); ``failures`` counts failed calls by reason
    since the agent started.
    """

    held: tuple[HeldDevices, ...] = ()
    listed: bool = False
    allocatable: frozenset[str] | None = None
    failure: PodResourcesFailure | None = None
    error: str | None = None
    failures: tuple[tuple[PodResourcesFailure, int], ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True, slots=True)
class NodeSample:
    """All raw samples of one poll.

    ``gpus`` holds every GPU NVML enumerated (lost ones flagged);
    ``gpu_source_error`` is set when NVML could not be used at all this poll
    (library missing, driver not loaded), in which case ``gpus`` is empty and
    means "unknown", not "no GPUs"; ``ib_source_error`` and
    ``mounts_source_error`` say the same of InfiniBand and storage. ``events``
    are the GPU events that arrived
    since the previous poll, de-duplicated across NVML and the kernel log;
    ``xid_counts`` are cumulative since the agent started. ``errors`` names
    every probe that failed this poll. ``scheduled`` is False for a poll a
    GPU event woke early: hysteresis counts only scheduled polls, so "absent
    for three polls" means three poll intervals however many XIDs arrive.
    """

    time: datetime
    gpus: tuple[GpuSample, ...] = ()
    gpu_source_error: str | None = None
    events: tuple[GpuEvent, ...] = ()
    xid_counts: tuple[XidCount, ...] = ()
    ib_ports: tuple[IbPortSample, ...] = ()
    ib_source_error: str | None = None
    mounts: tuple[MountSample, ...] = ()
    mounts_source_error: str | None = None
    errors: tuple[str, ...] = ()
    scheduled: bool = True
    # None when no PodResources socket is configured; its failures are not
    # in ``errors``: they hold no condition, only the pods published per GPU.
    pod_resources: PodResourcesSample | None = None
