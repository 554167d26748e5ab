"""The real GPU backend: NVML through ``nvidia-ml-py`` (imported as ``pynvml``).

The ``pynvml`` module is a constructor parameter (default: the installed
one), so tests hand in a stand-in that mirrors the library at its boundary and
no test patches ``sys.modules``.

NVML's failure modes shape this module:

* ``NotSupported`` (or ``FunctionNotFound`` on older drivers) means "this GPU
  has no such thing": the field is ``None`` and is not asked again for that
  GPU, which also keeps the poll cheap.
* ``GPU_IS_LOST`` means the GPU fell off the bus: its sample is flagged
  ``lost`` with the identity last seen, so the rules can name it. A GPU whose
  handle or UUID cannot be read for another reason (``RESET_REQUIRED``,
  ``Unknown``) is flagged the same way, with NVML's error in ``errors``.
* ``Uninitialized``, ``LibraryNotFound``, ``DriverNotLoaded`` and a driver/
  library mismatch mean NVML is unusable: :class:`BackendUnavailableError`, which
  the GPU probe reports and retries with backoff.
* Anything else fails one field of one GPU, is listed in the sample's
  ``errors`` and logged; the rest of the sample stands.

Remediation resets a GPU with ``nvidia-smi --gpu-reset -i <PCI bus id>``
(NVML's Python binding has no reset call) under a timeout. nvidia-smi
refuses to reset a GPU that any process holds open, and an NVML client such
as this agent is one: NVML is shut down for the reset and initialised again
after it, events registered anew.

XID, ECC and retirement events come through an NVML event set that
:meth:`NvmlBackend.wait_event` blocks on from the event thread. The set is a
C object: freeing it (``close``, after NVML broke) while that thread is still
inside ``nvmlEventSetWait`` on it would be a use-after-free in the driver
library, a segfault that takes the whole agent down. So the wait and the free
are serialised by their own lock; ``close`` waits at most one wait timeout.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from agent.samples import (
    XID_RECOVERY_ACTION,
    EventSource,
    GpuEvent,
    GpuEventKind,
    GpuSample,
    NvlinkSample,
    PcieSample,
    RemappedRows,
    RetiredPages,
    normalize_bus_id,
)
from agent.sources.base import BackendUnavailableError, GpuBackend, GpuResetError
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class _GpuLostError(Exception):
    """Internal: the GPU being sampled answered GPU_IS_LOST."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _last_line(text: str) -> str:
    """The last non-empty line of a command's output: what nvidia-smi says last is its verdict."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:512] if lines else ""


def _handle_key(handle: Any) -> int | None:
    """A stable key for an NVML device handle (the pointer's address)."""
    try:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return addr


class NvmlBackend(GpuBackend):
    """GPUs through NVML; see the module docstring for error handling."""

    name = "nvml"

    def __init__(self, nvml: Any = None, *, nvidia_smi: str = "nvidia-smi", reset_timeout_s: float = 30.0) -> None:
        self._nvidia_smi = nvidia_smi
        self._reset_timeout_s = reset_timeout_s
        if nvml is None:
            import pynvml as nvml_module  # noqa: PLC0415 - tests inject a stand-in instead

            nvml = nvml_module
        self._nv: Any = nvml
        nv = self._nv
        self._not_supported: tuple[type[BaseException], ...] = (
            nv.NVMLError_NotSupported,
            nv.NVMLError_FunctionNotFound,
        )
        self._unavailable: tuple[type[BaseException], ...] = (
            nv.NVMLError_Uninitialized,
            nv.NVMLError_LibraryNotFound,
            nv.NVMLError_DriverNotLoaded,
            nv.NVMLError_LibRmVersionMismatch,
        )
        self._event_kinds: dict[int, GpuEventKind] = {
            nv.nvmlEventTypeXidCriticalError: GpuEventKind.XID,
            nv.nvmlEventTypeDoubleBitEccError: GpuEventKind.ECC_DOUBLE_BIT,
            nv.nvmlEventTypeSingleBitEccError: GpuEventKind.ECC_SINGLE_BIT,
            nv.nvmlEventTypeDramRetirementEvent: GpuEventKind.RETIREMENT,
            nv.nvmlEventTypeDramRetirementFailure: GpuEventKind.RETIREMENT_FAILURE,
        }
        self._wanted_events = 0
        for mask in self._event_kinds:
            self._wanted_events |= mask
        self._lock = threading.Lock()
        # Held while NVML waits on the event set and while the set is freed.
        self._event_lock = threading.Lock()
        self._open = False
        self._event_set: Any = None
        self._handles: dict[int, Any] = {}
        self._by_handle: dict[int | None, int] = {}
        # index -> (uuid, bus id, name): what a lost GPU is reported as.
        self._identity: dict[int, tuple[str, str, str]] = {}
        # uuid -> static facts read once: memory total, max PCIe gen/width.
        self._static: dict[str, dict[str, Any]] = {}
        self._unsupported: dict[int, set[str]] = {}
        self._link_count: dict[int, int] = {}

    # ------------------------------------------------------------------ open

    def open(self) -> None:
        with self._lock:
            self._open_locked()

    def _open_locked(self) -> None:
        nv = self._nv
        if self._open:
            return
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise BackendUnavailableError(f"NVML could not initialise: {exc}") from exc
        self._open = True
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self._shutdown_locked()
            raise BackendUnavailableError(f"NVML could not count GPUs: {exc}") from exc
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("nvml_event_set_unavailable", error=str(exc), effect="XIDs come from the kernel log only")
            self._event_set = None
        for index in range(count):
            self._register_events(index)
        log.info("nvml_opened", gpus=count, events=self._event_set is not None)

    def _register_events(self, index: int) -> None:
        nv = self._nv
        try:
            handle = self._handle(index)
        except nv.NVMLError as exc:
            log.warning("nvml_handle_failed", gpu=index, error=str(exc))
            return
        if self._event_set is None:
            return
        try:
            supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
            mask = supported & self._wanted_events
            if mask:
                nv.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
        except nv.NVMLError as exc:
            log.info("nvml_events_not_registered", gpu=index, error=str(exc))

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._nv.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
            self._by_handle[_handle_key(handle)] = index
        return handle

    def close(self) -> None:
        with self._lock:
            self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        if not self._open:
            return
        nv = self._nv
        with self._event_lock:
            if self._event_set is not None:
                try:
                    nv.nvmlEventSetFree(self._event_set)
                except nv.NVMLError as exc:
                    log.debug("nvml_event_set_free_failed", error=str(exc))
                self._event_set = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.debug("nvml_shutdown_failed", error=str(exc))
        self._open = False
        self._handles.clear()
        self._by_handle.clear()
        self._unsupported.clear()
        self._link_count.clear()

    # ---------------------------------------------------------------- sample

    def sample(self) -> tuple[GpuSample, ...]:
        nv = self._nv
        with self._lock:
            if not self._open:
                raise BackendUnavailableError("NVML is not initialised")
            try:
                count = nv.nvmlDeviceGetCount()
            except self._unavailable as exc:
                raise BackendUnavailableError(f"NVML became unusable: {exc}") from exc
            except nv.NVMLError as exc:
                raise BackendUnavailableError(f"NVML could not count GPUs: {exc}") from exc
            return tuple([self._sample_one(i) for i in range(count)])

    def _field(self, index: int, name: str, errors: list[str], fn: Callable[..., T], *args: Any) -> T | None:
        unsupported = self._unsupported.setdefault(index, set())
        if name in unsupported:
            return None
        nv = self._nv
        try:
            return fn(*args)
        except self._not_supported:
            unsupported.add(name)
            return None
        except nv.NVMLError_GpuIsLost as exc:
            raise _GpuLostError from exc
        except self._unavailable as exc:
            raise BackendUnavailableError(f"NVML became unusable: {exc}") from exc
        except nv.NVMLError as exc:
            errors.append(f"{name}: {exc}")
            log.warning("nvml_field_failed", gpu=index, field=name, error=str(exc))
            return None

    def _lost_sample(self, index: int, why: str) -> GpuSample:
        uuid, bus, name = self._identity.get(index, ("", "", ""))
        static = self._static.get(uuid, {})
        return GpuSample(
            index=index,
            uuid=uuid,
            pci_bus_id=bus,
            name=name,
            memory_total_bytes=static.get("memory_total"),
            lost=True,
            errors=(why,),
        )

    def _sample_one(self, index: int) -> GpuSample:
        nv = self._nv
        errors: list[str] = []
        try:
            try:
                handle = self._handle(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError_GpuIsLost as exc:
                raise _GpuLostError from exc
            except self._unavailable as exc:
                raise BackendUnavailableError(f"NVML became unusable: {exc}") from exc
            except nv.NVMLError as exc:
                # The GPU cannot even be named (RESET_REQUIRED, Unknown,
                # NoPermission): it is out of service like a lost one. Raising
                # instead would cost every other GPU its sample, this poll and
                # every poll after, and the broken GPU would never be reported.
                log.error("gpu_unusable", gpu=index, error=str(exc))
                return self._lost_sample(index, f"NVML cannot reach it: {exc}")
            static = self._static.get(uuid)
            if static is None:
                static = self._read_static(index, handle, errors)
                self._static[uuid] = static
            self._identity[index] = (uuid, static["bus"], static["name"])
            mem = self._field(index, "memory", errors, nv.nvmlDeviceGetMemoryInfo, handle)
            mig = self._field(index, "mig_mode", errors, nv.nvmlDeviceGetMigMode, handle)
            util = self._field(index, "utilization", errors, nv.nvmlDeviceGetUtilizationRates, handle)
            remap = self._field(index, "remapped_rows", errors, nv.nvmlDeviceGetRemappedRows, handle)
            retired = None if remap is not None else self._retired(index, handle, errors)
            return GpuSample(
                index=index,
                uuid=uuid,
                pci_bus_id=static["bus"],
                name=static["name"],
                memory_total_bytes=int(mem.total) if mem is not None else static.get("memory_total"),
                memory_used_bytes=int(mem.used) if mem is not None else None,
                mig_enabled=None if mig is None else int(mig[0]) == nv.NVML_DEVICE_MIG_ENABLE,
                utilization_gpu_pct=None if util is None else int(util.gpu),
                remapped_rows=None
                if remap is None
                else RemappedRows(int(remap[0]), int(remap[1]), bool(remap[2]), bool(remap[3])),
                retired_pages=retired,
                nvlinks=self._nvlinks(index, handle, errors),
                pcie=self._pcie(index, handle, static, errors),
                errors=tuple(errors),
            )
        except _GpuLostError:
            log.error("gpu_lost", gpu=index, uuid=self._identity.get(index, ("",))[0] or None)
            return self._lost_sample(index, "NVML: GPU is lost (fallen off the bus)")

    def _read_static(self, index: int, handle: Any, errors: list[str]) -> dict[str, Any]:
        nv = self._nv
        name = self._field(index, "name", errors, nv.nvmlDeviceGetName, handle)
        pci = self._field(index, "pci_info", errors, nv.nvmlDeviceGetPciInfo, handle)
        mem = self._field(index, "memory", errors, nv.nvmlDeviceGetMemoryInfo, handle)
        max_gen = self._field(index, "pcie_max_gen", errors, nv.nvmlDeviceGetMaxPcieLinkGeneration, handle)
        max_width = self._field(index, "pcie_max_width", errors, nv.nvmlDeviceGetMaxPcieLinkWidth, handle)
        return {
            "name": _text(name) if name is not None else "",
            "bus": normalize_bus_id(_text(pci.busId)) if pci is not None else "",
            "memory_total": int(mem.total) if mem is not None else None,
            "max_gen": None if max_gen is None else int(max_gen),
            "max_width": None if max_width is None else int(max_width),
        }

    def _retired(self, index: int, handle: Any, errors: list[str]) -> RetiredPages | None:
        nv = self._nv
        sbe = self._field(
            index,
            "retired_sbe",
            errors,
            nv.nvmlDeviceGetRetiredPages,
            handle,
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        if sbe is None:
            return None
        dbe = self._field(
            index,
            "retired_dbe",
            errors,
            nv.nvmlDeviceGetRetiredPages,
            handle,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pending = self._field(index, "retired_pending", errors, nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        return RetiredPages(
            single_bit_ecc=len(sbe),
            double_bit_ecc=len(dbe or ()),
            pending=pending == nv.NVML_FEATURE_ENABLED,
        )

    def _nvlinks(self, index: int, handle: Any, errors: list[str]) -> tuple[NvlinkSample, ...]:
        nv = self._nv
        count = self._link_count.get(index)
        if count is None:
            count = 0
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    nv.nvmlDeviceGetNvLinkState(handle, link)
                except nv.NVMLError_GpuIsLost as exc:
                    raise _GpuLostError from exc
                except nv.NVMLError:
                    break
                count = link + 1
            self._link_count[index] = count
        counters = (
            ("nvlink_replay", nv.NVML_NVLINK_ERROR_DL_REPLAY),
            ("nvlink_recovery", nv.NVML_NVLINK_ERROR_DL_RECOVERY),
            ("nvlink_crc_flit", nv.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            ("nvlink_crc_data", nv.NVML_NVLINK_ERROR_DL_CRC_DATA),
        )
        links = []
        for link in range(count):
            state = self._field(index, f"nvlink_state/{link}", errors, nv.nvmlDeviceGetNvLinkState, handle, link)
            values = [
                self._field(index, name, errors, nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, code)
                for name, code in counters
            ]
            links.append(
                NvlinkSample(
                    link=link,
                    active=state == nv.NVML_FEATURE_ENABLED,
                    replay_errors=values[0],
                    recovery_errors=values[1],
                    crc_flit_errors=values[2],
                    crc_data_errors=values[3],
                )
            )
        return tuple(links)

    def _pcie(self, index: int, handle: Any, static: dict[str, Any], errors: list[str]) -> PcieSample | None:
        nv = self._nv
        gen = self._field(index, "pcie_gen", errors, nv.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        width = self._field(index, "pcie_width", errors, nv.nvmlDeviceGetCurrPcieLinkWidth, handle)
        replay = self._field(index, "pcie_replay", errors, nv.nvmlDeviceGetPcieReplayCounter, handle)
        if gen is None and width is None and replay is None and static["max_gen"] is None:
            return None
        return PcieSample(
            current_gen=gen,
            max_gen=static["max_gen"],
            current_width=width,
            max_width=static["max_width"],
            replay_counter=replay,
        )

    # ----------------------------------------------------------- remediation

    def running_processes(self, index: int) -> tuple[int, ...]:
        nv = self._nv
        with self._lock:
            if not self._open:
                raise BackendUnavailableError("NVML is not initialised")
            try:
                handle = self._handle(index)
            except self._unavailable as exc:
                raise BackendUnavailableError(f"NVML became unusable: {exc}") from exc
            except nv.NVMLError as exc:
                raise GpuResetError(f"NVML cannot reach GPU {index}: {exc}") from exc
            pids: set[int] = set()
            for kind in ("Compute", "Graphics"):
                pids.update(int(p.pid) for p in self._processes(index, handle, kind))
            return tuple(sorted(pids))

    def _processes(self, index: int, handle: Any, kind: str) -> list[Any]:
        """One kind of running process on a GPU; none where the GPU has no such kind.

        The unversioned call is the newest struct version; a driver older
        than the bindings lacks it (the bindings then raise their
        ``NVMLLibraryMismatchError``), and the ``_v2`` call is what it has.
        """
        nv = self._nv
        name = f"nvmlDeviceGet{kind}RunningProcesses"
        mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
        calls = [getattr(nv, name)]
        if hasattr(nv, f"{name}_v2"):
            calls.append(getattr(nv, f"{name}_v2"))
        for call in calls:
            try:
                return list(call(handle))
            except self._not_supported:
                return []
            except self._unavailable as exc:
                raise BackendUnavailableError(f"NVML became unusable: {exc}") from exc
            except nv.NVMLError as exc:
                raise GpuResetError(f"NVML cannot list the {kind.lower()} processes on GPU {index}: {exc}") from exc
            except Exception as exc:
                if mismatch is None or not isinstance(exc, mismatch):
                    raise
        raise GpuResetError(f"NVML cannot list the {kind.lower()} processes on GPU {index}: no call the driver has")

    def reset(self, index: int) -> str:
        with self._lock:
            if not self._open:
                raise BackendUnavailableError("NVML is not initialised")
            bus = self._identity.get(index, ("", "", ""))[1]
            if not bus:
                raise GpuResetError(f"GPU {index} has not been sampled, so its PCI bus id is unknown")
            command = [self._nvidia_smi, "--gpu-reset", "-i", bus]
            shown = " ".join(command)
            # nvidia-smi refuses a GPU any process holds open, this one included.
            self._shutdown_locked()
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=self._reset_timeout_s, check=False
                )
            except FileNotFoundError as exc:
                raise GpuResetError(f"{self._nvidia_smi} not found: {exc}") from exc
            except subprocess.TimeoutExpired as exc:
                raise GpuResetError(f"{shown} did not finish within {self._reset_timeout_s:g}s (killed)") from exc
            except OSError as exc:
                raise GpuResetError(f"{shown} could not run: {exc}") from exc
            finally:
                try:
                    self._open_locked()
                except BackendUnavailableError as exc:
                    # The next sample reports it and the probe retries.
                    log.error("nvml_reopen_after_reset_failed", gpu=index, error=str(exc))
            output = _last_line(done.stdout + "\n" + done.stderr)
            if done.returncode != 0:
                raise GpuResetError(f"{shown} exited with status {done.returncode}: {output or 'no output'}")
            log.info("gpu_reset_done", gpu=index, pci_bus_id=bus, output=output)
            return f"{shown}: {output}" if output else shown

    # ---------------------------------------------------------------- events

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        nv = self._nv
        with self._event_lock:  # the set cannot be freed while NVML waits on it
            event_set = self._event_set if self._open else None
            failure: str | None = None
            if event_set is not None:
                try:
                    data = nv.nvmlEventSetWait(event_set, max(0, int(timeout_s * 1000)))
                except nv.NVMLError_Timeout:
                    return None
                except self._unavailable as exc:
                    raise BackendUnavailableError(f"NVML became unusable: {exc}") from exc
                except nv.NVMLError as exc:
                    failure = str(exc)
                else:
                    return self._event_from(data)
        if failure is not None:
            # GPU_IS_LOST and the like: the poll reports the GPU; do not spin.
            log.warning("nvml_event_wait_failed", error=failure)
        threading.Event().wait(timeout_s)
        return None

    def _event_from(self, data: Any) -> GpuEvent | None:
        """A :class:`GpuEvent` from NVML's event data; None for types not asked for."""
        nv = self._nv
        kind = self._event_kinds.get(int(data.eventType))
        if kind is None:
            return None
        index = self._by_handle.get(_handle_key(data.device))
        uuid, bus, _ = self._identity.get(index, ("", "", "")) if index is not None else ("", "", "")
        if not uuid:
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError as exc:
                log.debug("nvml_event_device_unknown", error=str(exc))
        if not bus:
            # An event before the first sample: the bus id is what the kernel
            # log names the GPU by, so without it the two reports of one XID
            # could not be matched.
            try:
                bus = normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(data.device).busId))
            except nv.NVMLError as exc:
                log.debug("nvml_event_bus_unknown", error=str(exc))
        xid = int(data.eventData) if kind is GpuEventKind.XID else None
        return GpuEvent(
            kind=kind,
            source=EventSource.NVML,
            time=datetime.now(UTC),
            pci_bus_id=bus or None,
            uuid=uuid or None,
            xid=xid,
            recovery_action=self._recovery_action(data.device) if xid == XID_RECOVERY_ACTION else None,
        )

    def _recovery_action(self, device: Any) -> int | None:
        """The recovery action the driver asks for now (XID 154 says it
        changed), from NVML's ``GET_GPU_RECOVERY_ACTION`` field: the event
        itself carries only the XID number. ``None`` where the driver or the
        bindings do not have the field; the kernel log's line then says it."""
        nv = self._nv
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            return None
        try:
            (value,) = nv.nvmlDeviceGetFieldValues(device, [field_id])
        except nv.NVMLError as exc:
            log.debug("nvml_recovery_action_unavailable", error=str(exc))
            return None
        if int(value.nvmlReturn) != nv.NVML_SUCCESS:
            log.debug("nvml_recovery_action_unavailable", nvml_return=int(value.nvmlReturn))
            return None
        return int(value.value.uiVal)
