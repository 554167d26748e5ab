"""Record what real NVML answers into a JSON fixture the stand-in replays.

Run on a machine with NVIDIA GPUs::

    .venv/bin/python tests/agent/record_nvml.py > tests/agent/fixtures/nvml-<model>.json

Each GPU is recorded as a :class:`~tests.agent.fake_pynvml.FakeGpu`: the
values every function the NVML backend calls returned, and for the functions
that failed, the NVML error code they returned (``NotSupported`` on this GPU,
for instance), so the stand-in raises exactly what the real GPU raised.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

try:
    from tests.agent.fake_pynvml import FakeGpu
except ImportError:  # run as a script from the repository root
    sys.path.insert(0, ".")
    from tests.agent.fake_pynvml import FakeGpu


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def record_gpu(nv: Any, index: int) -> FakeGpu:
    """One GPU's answers; functions that raise are recorded by error code."""
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    errors: dict[str, int] = {}

    def call(fn: str, default: Any, convert: Callable[[Any], Any], *args: Any) -> Any:
        try:
            return convert(getattr(nv, fn)(handle, *args))
        except nv.NVMLError as exc:
            errors[fn] = int(exc.value)
            return default

    gpu = FakeGpu(uuid=call("nvmlDeviceGetUUID", "", _text))
    gpu.name = call("nvmlDeviceGetName", "", _text)
    gpu.pci_bus_id = call("nvmlDeviceGetPciInfo", "", lambda p: _text(p.busId))
    gpu.memory_total, gpu.memory_used = call("nvmlDeviceGetMemoryInfo", (0, 0), lambda m: (int(m.total), int(m.used)))
    gpu.mig_mode = call("nvmlDeviceGetMigMode", (0, 0), lambda m: (int(m[0]), int(m[1])))
    gpu.utilization = call("nvmlDeviceGetUtilizationRates", 0, lambda u: int(u.gpu))
    gpu.remapped_rows = call("nvmlDeviceGetRemappedRows", (0, 0, 0, 0), lambda r: tuple(int(x) for x in r))
    sbe = nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe = nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    gpu.retired_sbe = call("nvmlDeviceGetRetiredPages", [], list, sbe)
    gpu.retired_dbe = call("nvmlDeviceGetRetiredPages", [], list, dbe)
    gpu.retired_pending = call("nvmlDeviceGetRetiredPagesPendingStatus", 0, int)
    states: list[int] = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        try:
            states.append(int(nv.nvmlDeviceGetNvLinkState(handle, link)))
        except nv.NVMLError as exc:
            if link == 0 and exc.value != nv.NVML_ERROR_INVALID_ARGUMENT:
                errors["nvmlDeviceGetNvLinkState"] = int(exc.value)
            break
    gpu.nvlink_states = states
    counters: dict[int, list[int]] = {}
    for link in range(len(states)):
        values = []
        for code in range(nv.NVML_NVLINK_ERROR_DL_ECC_DATA + 1):
            try:
                values.append(int(nv.nvmlDeviceGetNvLinkErrorCounter(handle, link, code)))
            except nv.NVMLError as exc:
                errors["nvmlDeviceGetNvLinkErrorCounter"] = int(exc.value)
                values.append(0)
        counters[link] = values
    gpu.nvlink_counters = counters
    gpu.pcie_curr_gen = call("nvmlDeviceGetCurrPcieLinkGeneration", 0, int)
    gpu.pcie_max_gen = call("nvmlDeviceGetMaxPcieLinkGeneration", 0, int)
    gpu.pcie_curr_width = call("nvmlDeviceGetCurrPcieLinkWidth", 0, int)
    gpu.pcie_max_width = call("nvmlDeviceGetMaxPcieLinkWidth", 0, int)
    gpu.pcie_replay = call("nvmlDeviceGetPcieReplayCounter", 0, int)
    gpu.supported_events = call("nvmlDeviceGetSupportedEventTypes", 0, int)
    gpu.errors = errors
    return gpu


def record(nv: Any) -> dict[str, Any]:
    """Everything the stand-in needs to replay this machine's NVML."""
    nv.nvmlInit()
    try:
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = ""
        gpus = [record_gpu(nv, i).to_json() for i in range(nv.nvmlDeviceGetCount())]
    finally:
        nv.nvmlShutdown()
    return {"driver_version": driver, "gpus": gpus}


def main() -> int:
    import pynvml

    try:
        data = record(pynvml)
    except pynvml.NVMLError as exc:
        print(f"record_nvml: NVML is not usable here: {exc}", file=sys.stderr)
        return 1
    json.dump(data, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
