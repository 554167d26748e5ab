"""The XID catalogue: what each XID means and what to do about it.

One table, as data, so that reviewing a severity is reading one line and an
operator can override any entry from the agent's config file
(``xid.overrides``). It lives in the shared core because both parts judge
XIDs by it: the agent the XIDs it sees, the scheduler's remediation those
that NVIDIA's DRA driver reports as device taints.

``APPLICATION`` XIDs are faults of the program running on the GPU (a bad
kernel, a page fault, a watchdog on a hung context): the GPU itself is fine,
so they raise Events only, never a condition. ``HARDWARE`` XIDs mean the GPU,
its memory, its links or its firmware need attention: they set
``GpuXidError`` and latch until repair and re-validation clear them.

Severities and actions follow NVIDIA's published XID catalogue and GPU debug
guidelines, mapped onto our five actions; where NVIDIA says "ignore" or
"informational" for a hardware-originated XID we still keep it out of the
conditions (``APPLICATION`` kind, ``NONE`` action), because other signals
(row remapping, NVLink state) carry the actionable part.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from gpuwarden.contract import Action


class XidKind(StrEnum):
    APPLICATION = "application"
    HARDWARE = "hardware"
    # Operator override: drop the XID entirely (no Event, no condition).
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    kind: XidKind
    action: Action
    meaning: str


_A, _H = XidKind.APPLICATION, XidKind.HARDWARE

_ROWS: tuple[XidInfo, ...] = (
    XidInfo(8, _A, Action.RESTART_APP, "GPU stopped processing (channel idle timeout)"),
    XidInfo(13, _A, Action.RESTART_APP, "graphics engine exception, usually an out-of-bounds access in a kernel"),
    XidInfo(31, _A, Action.RESTART_APP, "GPU memory page fault, usually an illegal address in the application"),
    XidInfo(32, _A, Action.RESTART_APP, "invalid or corrupted push buffer stream"),
    XidInfo(38, _A, Action.NONE, "driver firmware error (informational)"),
    XidInfo(43, _A, Action.RESTART_APP, "GPU stopped processing; the application's channel was reset"),
    # Informational in NVIDIA's catalogue: the driver cleaning up channels
    # after another error (or a killed process). The XID before it is the one
    # to act on; restarting the application for this one would act twice.
    XidInfo(45, _A, Action.NONE, "preemptive cleanup of a channel after an earlier error (informational)"),
    XidInfo(46, _H, Action.RESET_GPU, "GPU stopped processing (GPU timeout)"),
    XidInfo(48, _H, Action.RESET_GPU, "double-bit ECC error in GPU memory"),
    XidInfo(54, _H, Action.REPLACE, "auxiliary power is not connected to the GPU board"),
    XidInfo(61, _H, Action.RESET_GPU, "internal micro-controller breakpoint or warning"),
    XidInfo(62, _H, Action.RESET_GPU, "internal micro-controller halt"),
    XidInfo(63, _A, Action.NONE, "row remapping or page retirement recorded (acted on through remap state)"),
    XidInfo(64, _H, Action.RESET_GPU, "row remapping or page retirement failed to record"),
    XidInfo(68, _A, Action.RESTART_APP, "video decoder (NVDEC) exception"),
    XidInfo(69, _A, Action.RESTART_APP, "graphics engine class error"),
    XidInfo(74, _H, Action.RESET_GPU, "NVLink error"),
    XidInfo(79, _H, Action.REBOOT, "GPU has fallen off the bus"),
    XidInfo(92, _A, Action.NONE, "high single-bit ECC error rate (informational)"),
    XidInfo(94, _A, Action.RESTART_APP, "contained memory error; only the affected application was stopped"),
    XidInfo(95, _H, Action.RESET_GPU, "uncontained memory error"),
    XidInfo(109, _H, Action.RESET_GPU, "context switch timeout"),
    XidInfo(110, _H, Action.RESET_GPU, "security fault"),
    XidInfo(119, _H, Action.RESET_GPU, "GSP firmware RPC timeout"),
    XidInfo(120, _H, Action.RESET_GPU, "GSP firmware error"),
    XidInfo(121, _A, Action.NONE, "chip-to-chip (C2C) link corrected error (informational)"),
    XidInfo(136, _H, Action.RESET_GPU, "NVLink training failed"),
    # A fault the remote MMU reports: an illegal NVLink peer-to-peer access
    # through the fabric address space. NVIDIA describes it as it does XID 31
    # (an MMU fault): typically an application bug, rarely a driver or hardware
    # one. The faulting application is stopped, so restarting it is the action;
    # the GPU stays in service: an Event, never a condition.
    XidInfo(137, _A, Action.RESTART_APP, "NVLink FLA privilege error: illegal peer-to-peer access by the application"),
    XidInfo(140, _H, Action.RESET_GPU, "unrecovered ECC error"),
    XidInfo(143, _H, Action.RESET_GPU, "GPU initialisation error"),
    XidInfo(144, _H, Action.RESET_GPU, "NVLink SAW error"),
    XidInfo(145, _H, Action.RESET_GPU, "NVLink RLW error"),
    XidInfo(146, _H, Action.RESET_GPU, "NVLink TLW error"),
    XidInfo(147, _H, Action.RESET_GPU, "NVLink TREX error"),
    XidInfo(148, _H, Action.RESET_GPU, "NVLink power control error"),
    XidInfo(149, _H, Action.RESET_GPU, "NVLink NETIR error"),
    XidInfo(150, _H, Action.RESET_GPU, "NVLink MSE error"),
    XidInfo(151, _H, Action.REBOOT, "confidential-computing key rotation error"),
    # The driver names the recovery it wants in the XID itself; RECOVERY_ACTIONS
    # below maps it, and this row's action is only the fallback for a report
    # that does not say (or says something we do not know).
    XidInfo(154, _H, Action.RESET_GPU, "GPU recovery action changed"),
    XidInfo(155, _H, Action.RESET_GPU, "NVLink software-defined error"),
    XidInfo(156, _H, Action.RESET_GPU, "resource retirement event; a reset applies it"),
    XidInfo(157, _H, Action.REPLACE, "resource retirement failure"),
    XidInfo(158, _H, Action.RESET_GPU, "GPU fatal timeout"),
)

XID_CATALOGUE: MappingProxyType[int, XidInfo] = MappingProxyType({row.xid: row for row in _ROWS})
"""XID number -> what it means and what to do; read-only."""


def lookup(xid: int, overrides: dict[int, XidInfo] | None = None) -> XidInfo | None:
    """The entry for ``xid``, an operator override first; ``None`` if unknown."""
    if overrides and xid in overrides:
        return overrides[xid]
    return XID_CATALOGUE.get(xid)


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    """One value of NVML's ``nvmlDeviceGpuRecoveryAction_t``, as XID 154 reports it.

    ``action`` ``None`` means there is nothing to recover: no fault.
    """

    code: int
    name: str
    action: Action | None


RECOVERY_ACTIONS: MappingProxyType[int, RecoveryAction] = MappingProxyType(
    {
        r.code: r
        for r in (
            RecoveryAction(0, "none", None),
            RecoveryAction(1, "GPU reset", Action.RESET_GPU),
            RecoveryAction(2, "node reboot", Action.REBOOT),
            # Drain P2P: every process doing peer-to-peer traffic must stop; no
            # reset, no reboot. Stopping the applications is RESTART_APP in our
            # ladder, and the fault stays a GpuXidError condition, so the
            # scheduler takes the GPU out of service and evicts its pods: that
            # eviction is the drain. Once drained the driver reports the next
            # action (none, or a reset) with another XID 154, which updates the
            # fault's action.
            RecoveryAction(3, "drain peer-to-peer traffic", Action.RESTART_APP),
            RecoveryAction(4, "drain peer-to-peer traffic, then GPU reset", Action.RESET_GPU),
            # Newer drivers. A PCIe bus reset still resets one GPU without a
            # reboot; recovering an IMEX domain (5) spans nodes, has no action of
            # ours and falls back to the catalogue's.
            RecoveryAction(6, "PCIe bus reset", Action.RESET_GPU),
            RecoveryAction(7, "system reboot", Action.REBOOT),
        )
    }
)
"""NVML recovery-action code -> what it asks of us; read-only."""


def recovery_action(code: int | None, fallback: Action) -> tuple[Action | None, str]:
    """XID 154's recommended action from the driver's recovery-action code,
    and words for the message; ``fallback`` (the catalogue's action) when the
    report did not say or names a code not in :data:`RECOVERY_ACTIONS`."""
    if code is None:
        return fallback, "the driver's recovery action was not given"
    known = RECOVERY_ACTIONS.get(code)
    if known is None:
        return fallback, f"driver recovery action {code:#x} (unknown)"
    return known.action, f"driver recovery action {code:#x} ({known.name})"
