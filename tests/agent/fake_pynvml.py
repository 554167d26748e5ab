"""A stand-in for the ``pynvml`` module, at the library boundary.

It mirrors the real ``nvidia-ml-py`` where the agent touches it, so the NVML
backend's code paths run unchanged:

* the same function names and argument order;
* the real exception classes and constants, taken from the installed
  ``pynvml`` (``NVMLError(code)`` maps to ``NVMLError_NotSupported`` etc. by the
  real class's own logic), so the stand-in cannot drift from the library;
* the real return shapes: ctypes structures (``nvmlPciInfo_t``,
  ``c_nvmlMemory_t``, ``c_nvmlUtilization_t``, ``c_nvmlEventData_t``), device
  handles that are ``c_nvmlDevice_t`` pointers, the 4-tuple of
  ``nvmlDeviceGetRemappedRows``, the ``[current, pending]`` list of
  ``nvmlDeviceGetMigMode``;
* the real behaviours: every call before ``nvmlInit`` raises
  ``Uninitialized``; ``nvmlInit`` is reference-counted; a lost GPU answers
  ``GPU_IS_LOST`` to everything including ``nvmlDeviceGetHandleByIndex``; an
  NVLink past the last raises ``InvalidArgument``; ``nvmlEventSetWait`` blocks
  up to its timeout and raises ``NVMLError_Timeout``; events are delivered only
  for devices and types that were registered.

What the real library does not survive is recorded in :attr:`FakeNvml.misuse`
instead of crashing the test run: freeing an event set while another thread
waits on it is a use-after-free in ``libnvidia-ml`` (a segfault), so the
stand-in notes it and tests assert the list stays empty.

Per-GPU failures are scripted by function name: ``errors={"nvmlDeviceGetRemappedRows":
NVML_ERROR_NOT_SUPPORTED}`` makes that call raise the real ``NotSupported``.
A GPU can also be built from a JSON fixture recorded on a real machine by
``tests/agent/record_nvml.py`` (same schema).
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as _real

GIB = 1024**3

XID_EVENTS = _real.nvmlEventTypeXidCriticalError
ECC_EVENTS = _real.nvmlEventTypeDoubleBitEccError | _real.nvmlEventTypeSingleBitEccError
RETIREMENT_EVENTS = _real.nvmlEventTypeDramRetirementEvent | _real.nvmlEventTypeDramRetirementFailure


@dataclass
class FakeGpu:
    """What one GPU answers. ``errors`` maps a pynvml function name to the
    NVML error code that function returns for this GPU."""

    uuid: str
    pci_bus_id: str = "00000000:18:00.0"
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GIB
    memory_used: int = 1 * GIB
    mig_mode: tuple[int, int] = (0, 0)
    utilization: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    nvlink_states: list[int] = field(default_factory=lambda: [1] * 18)
    # link -> [replay, recovery, crc_flit, crc_data, ecc_data]
    nvlink_counters: dict[int, list[int]] = field(default_factory=dict)
    pcie_curr_gen: int = 5
    pcie_max_gen: int = 5
    pcie_curr_width: int = 16
    pcie_max_width: int = 16
    pcie_replay: int = 0
    supported_events: int = XID_EVENTS | ECC_EVENTS | RETIREMENT_EVENTS
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None: a driver without that field.
    recovery_action: int | None = None
    lost: bool = False
    # PIDs of the processes NVML lists on the GPU, by kind.
    compute_pids: list[int] = field(default_factory=list)
    graphics_pids: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out["nvlink_counters"] = {str(k): v for k, v in self.nvlink_counters.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FakeGpu:
        data = dict(data)
        data["nvlink_counters"] = {int(k): v for k, v in data.get("nvlink_counters", {}).items()}
        data["mig_mode"] = tuple(data.get("mig_mode", (0, 0)))
        data["remapped_rows"] = tuple(data.get("remapped_rows", (0, 0, 0, 0)))
        return cls(**data)


class FakeNvml:
    """The stand-in module: pass an instance where ``pynvml`` is expected."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: int | None = None,
        driver_version: str = "550.54.15",
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_version = driver_version
        self._refcount = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._structs = [_real.struct_c_nvmlDevice_t() for _ in gpus]
        self._handles = [ctypes.pointer(s) for s in self._structs]
        self._index_by_addr = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}
        self._sets: dict[int, dict[int, int]] = {}  # set id -> {gpu index: registered mask}
        self._queues: dict[int, deque[tuple[int, int, int]]] = {}
        self._set_structs: list[Any] = []
        self._waiting: dict[int, int] = {}  # set id -> threads inside nvmlEventSetWait
        self.misuse: list[str] = []
        self.calls = 0

    # Real exception classes and constants, so the stand-in cannot drift.
    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "nvmlEventType", "c_nvml", "nvmlPciInfo", "struct_c_nvml")):
            return getattr(_real, name)
        raise AttributeError(f"the pynvml stand-in has no {name!r}")

    @classmethod
    def from_fixture(cls, path: str | Path) -> FakeNvml:
        data = json.loads(Path(path).read_text())
        return cls([FakeGpu.from_json(g) for g in data["gpus"]], driver_version=data.get("driver_version", ""))

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _raise(code: int) -> None:
        raise _real.NVMLError(code)

    def _check_init(self) -> None:
        self.calls += 1
        if self._refcount <= 0:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        self._check_init()
        try:
            index = self._index_by_addr[ctypes.addressof(handle.contents)]
        except (KeyError, AttributeError, TypeError, ValueError):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            self._raise(_real.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            self._raise(gpu.errors[fn])
        return gpu

    # --------------------------------------------------------------- init

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            self._raise(self.init_error)
        with self._lock:
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._refcount <= 0:
                self._raise(_real.NVML_ERROR_UNINITIALIZED)
            self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    # ------------------------------------------------------------ devices

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            self._raise(_real.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetIndex")
        return self.gpus.index(gpu)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = _real.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id
        info.busIdLegacy = gpu.pci_bus_id
        domain, bus, devfn = gpu.pci_bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(devfn.split(".")[0], 16)
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mem = _real.c_nvmlMemory_t()
        mem.total, mem.used, mem.free = gpu.memory_total, gpu.memory_used, gpu.memory_total - gpu.memory_used
        return mem

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return list(self._gpu(handle, "nvmlDeviceGetMigMode").mig_mode)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.utilization, 0
        return util

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return tuple(self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped_rows)  # type: ignore[return-value]

    def nvmlDeviceGetRetiredPages(self, handle: Any, source: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        if source == _real.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            return list(gpu.retired_sbe)
        if source == _real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return list(gpu.retired_dbe)
        self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
        if not 0 <= link < len(gpu.nvlink_states):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_states[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkErrorCounter")
        if not 0 <= link < len(gpu.nvlink_states) or not 0 <= counter <= _real.NVML_NVLINK_ERROR_DL_ECC_DATA:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_counters.get(link, [0, 0, 0, 0, 0])[counter]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_curr_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_max_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_curr_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_max_width

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    @staticmethod
    def _process_infos(pids: list[int]) -> list[Any]:
        """As the real bindings return them: one friendly object per process,
        with the fields of ``c_nvmlProcessInfo_v3_t``."""
        return [
            _real.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": GIB, "gpuInstanceId": 0, "computeInstanceId": 0})
            for pid in pids
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._process_infos(self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses").compute_pids)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return self._process_infos(self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses").graphics_pids)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        """As the real call: one ``c_nvmlFieldValue_t`` per id, each with its
        own ``nvmlReturn`` (the call succeeds while single fields fail)."""
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id
            if field_id == _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                values[i].nvmlReturn = _real.NVML_SUCCESS
                values[i].valueType = _real.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = gpu.recovery_action
            else:
                values[i].nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return values

    # ------------------------------------------------------------- events

    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        s = _real.struct_c_nvmlEventSet_t()
        self._set_structs.append(s)
        handle = ctypes.pointer(s)
        key = ctypes.addressof(s)
        with self._lock:
            self._sets[key] = {}
            self._queues[key] = deque()
        return handle

    def _set_key(self, event_set: Any) -> int:
        key = ctypes.addressof(event_set.contents)
        if key not in self._sets:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return key

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if event_types & ~gpu.supported_events:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        key = self._set_key(event_set)
        with self._lock:
            index = self.gpus.index(gpu)
            self._sets[key][index] = self._sets[key].get(index, 0) | event_types

    def nvmlEventSetWait(self, event_set: Any, timeoutms: int) -> Any:
        self._check_init()
        key = self._set_key(event_set)
        deadline = time.monotonic() + timeoutms / 1000
        with self._cond:
            self._waiting[key] = self._waiting.get(key, 0) + 1
            self._cond.notify_all()
            try:
                while not self._queues.get(key):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._raise(_real.NVML_ERROR_TIMEOUT)
                    self._cond.wait(remaining)
                index, etype, edata = self._queues[key].popleft()
            finally:
                self._waiting[key] -= 1
        data = _real.c_nvmlEventData_t()
        data.device = self._handles[index]
        data.eventType = etype
        data.eventData = edata
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check_init()
        key = self._set_key(event_set)
        with self._lock:
            if self._waiting.get(key, 0) > 0:
                self.misuse.append("nvmlEventSetFree on a set another thread is waiting on (use after free)")
            del self._sets[key]
            del self._queues[key]

    def wait_for_waiter(self, timeout_s: float = 10.0) -> bool:
        """Block until some thread is inside ``nvmlEventSetWait`` (test sequencing)."""
        with self._cond:
            return self._cond.wait_for(lambda: any(n > 0 for n in self._waiting.values()), timeout_s)

    # ------------------------------------------------------- test control

    def emit(self, index: int, event_type: int, data: int = 0) -> int:
        """The driver raising an event on GPU ``index``; returns how many sets got it."""
        delivered = 0
        with self._cond:
            for key, registered in self._sets.items():
                if registered.get(index, 0) & event_type:
                    self._queues[key].append((index, event_type, data))
                    delivered += 1
            self._cond.notify_all()
        return delivered

    def emit_xid(self, index: int, xid: int) -> int:
        return self.emit(index, _real.nvmlEventTypeXidCriticalError, xid)


def h100_node(count: int = 8) -> FakeNvml:
    """A healthy 8x H100 node as the stand-in."""
    buses = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
    return FakeNvml(
        [
            FakeGpu(uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}", pci_bus_id=f"00000000:{buses[i % 8]}:00.0")
            for i in range(count)
        ]
    )
