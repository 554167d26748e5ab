"""The NVML backend against the pynvml stand-in (and real NVML where present)."""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.config import config_from_dict
from agent.rules.engine import HealthRules
from agent.samples import EventSource, GpuEventKind, NodeSample
from agent.sources.base import BackendUnavailableError
from agent.sources.nvml import NvmlBackend
from gpuwarden.contract import Reason
from tests.agent.fake_pynvml import FakeGpu, FakeNvml, h100_node
from tests.agent.record_nvml import record


@pytest.fixture
def backend_for() -> Any:
    opened: list[NvmlBackend] = []

    def make(nv: Any) -> NvmlBackend:
        b = NvmlBackend(nv)
        b.open()
        opened.append(b)
        return b

    yield make
    for b in opened:
        b.close()


def test_samples_every_gpu_with_identity(nvml_module: Any, backend_for: Any) -> None:
    backend = backend_for(nvml_module)
    samples = backend.sample()
    assert len(samples) == nvml_module.nvmlDeviceGetCount()
    for i, s in enumerate(samples):
        assert s.index == i
        assert s.uuid.startswith(("GPU-", "MIG-"))
        # NVML's own spelling, the one `nvidia-smi -i` takes.
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", s.pci_bus_id), s.pci_bus_id
        assert s.memory_total_bytes and s.memory_total_bytes > 0
        assert not s.lost
        for link in s.nvlinks:
            assert link.error_total >= 0


def test_stand_in_values_come_through_in_real_shapes(backend_for: Any) -> None:
    nv = h100_node()
    nv.gpus[2].remapped_rows = (3, 1, 1, 0)
    nv.gpus[2].utilization = 87
    nv.gpus[2].mig_mode = (1, 1)
    nv.gpus[4].nvlink_states[7] = 0
    nv.gpus[4].nvlink_counters[7] = [5, 1, 2, 3, 0]
    nv.gpus[6].pcie_curr_width = 8
    nv.gpus[6].pcie_replay = 42
    s = backend_for(nv).sample()
    assert s[2].remapped_rows is not None
    assert (s[2].remapped_rows.correctable, s[2].remapped_rows.uncorrectable) == (3, 1)
    assert s[2].remapped_rows.pending and not s[2].remapped_rows.failure
    assert s[2].utilization_gpu_pct == 87 and s[2].mig_enabled is True
    assert s[0].mig_enabled is False
    assert s[2].memory_total_mib == 80 * 1024
    assert len(s[4].nvlinks) == 18 and not s[4].nvlinks[7].active and s[4].nvlinks[6].active
    assert s[4].nvlinks[7].error_total == 11
    assert s[6].pcie is not None and s[6].pcie.current_width == 8 and s[6].pcie.max_width == 16
    assert s[6].pcie.replay_counter == 42
    assert s[0].pci_bus_id == "00000000:18:00.0"


def test_not_supported_fields_are_none_and_not_asked_again(backend_for: Any) -> None:
    nv = h100_node(2)
    nv.gpus[1].errors = {
        "nvmlDeviceGetMigMode": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetNvLinkState": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetPcieReplayCounter": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
    backend = backend_for(nv)
    first = backend.sample()[1]
    assert first.mig_enabled is None and first.utilization_gpu_pct is None
    assert first.nvlinks == ()
    assert first.pcie is not None and first.pcie.replay_counter is None and first.pcie.current_width == 16
    assert first.errors == ()
    calls = nv.calls
    backend.sample()
    per_poll = nv.calls - calls
    nv.gpus[1].errors = {}
    calls = nv.calls
    backend.sample()
    # Fields found unsupported stay unasked, so the call count does not grow.
    assert nv.calls - calls == per_poll


def test_pre_ampere_gpu_reports_retired_pages(backend_for: Any) -> None:
    nv = FakeNvml(
        [
            FakeGpu(
                uuid="GPU-volta",
                name="Tesla V100-SXM2-32GB",
                errors={"nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_NOT_SUPPORTED},
                retired_sbe=[0x1000, 0x2000],
                retired_dbe=[0x3000],
                retired_pending=pynvml.NVML_FEATURE_ENABLED,
                nvlink_states=[1] * 6,
            )
        ]
    )
    s = backend_for(nv).sample()[0]
    assert s.remapped_rows is None
    assert s.retired_pages is not None
    assert (s.retired_pages.single_bit_ecc, s.retired_pages.double_bit_ecc, s.retired_pages.pending) == (2, 1, True)
    assert len(s.nvlinks) == 6


def test_other_errors_fail_one_field_only(backend_for: Any) -> None:
    nv = h100_node(1)
    nv.gpus[0].errors = {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_UNKNOWN}
    nv.gpus[0].memory_total = 40 * 1024**3
    s = backend_for(nv).sample()[0]
    assert s.memory_used_bytes is None
    assert s.remapped_rows is not None and s.pcie is not None
    assert any("memory" in e for e in s.errors)


def test_gpu_lost_after_start_keeps_its_identity(backend_for: Any) -> None:
    nv = h100_node()
    backend = backend_for(nv)
    before = backend.sample()[5]
    nv.gpus[5].lost = True
    after = backend.sample()
    lost = after[5]
    assert lost.lost and lost.uuid == before.uuid and lost.pci_bus_id == before.pci_bus_id
    assert lost.remapped_rows is None and lost.nvlinks == ()
    assert not any(s.lost for i, s in enumerate(after) if i != 5)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_UNKNOWN])
def test_a_gpu_nvml_cannot_name_is_out_of_service_and_the_rest_still_sampled(backend_for: Any, code: int) -> None:
    nv = h100_node(3)
    backend = backend_for(nv)
    before = backend.sample()[1]
    nv.gpus[1].errors = {"nvmlDeviceGetUUID": code}
    s = backend.sample()
    assert [x.lost for x in s] == [False, True, False]
    assert (s[1].uuid, s[1].pci_bus_id) == (before.uuid, before.pci_bus_id)
    assert str(pynvml.NVMLError(code)) in s[1].errors[0]
    assert s[0].remapped_rows is not None and s[2].pcie is not None

    report = HealthRules(config_from_dict(None), "n").evaluate(NodeSample(time=datetime.now(UTC), gpus=s))
    (fault,) = [f for f in report.faults if f.reason == Reason.GPU_LOST]
    assert fault.entity.uuid == before.uuid and str(pynvml.NVMLError(code)) in fault.message


def test_gpu_lost_from_the_start_is_still_reported(backend_for: Any) -> None:
    nv = h100_node(3)
    nv.gpus[1].lost = True
    s = backend_for(nv).sample()
    assert [x.lost for x in s] == [False, True, False]
    assert s[1].index == 1


@pytest.mark.parametrize(
    "code",
    [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_NO_PERMISSION],
)
def test_failed_init_is_a_clear_error(code: int) -> None:
    backend = NvmlBackend(FakeNvml([], init_error=code))
    with pytest.raises(BackendUnavailableError, match="NVML could not initialise"):
        backend.open()
    with pytest.raises(BackendUnavailableError):
        backend.sample()


def test_real_pynvml_without_a_driver_is_a_clear_error() -> None:
    # The real library on a machine with no NVIDIA driver: LibraryNotFound.
    from tests.agent.conftest import REAL_NVML

    backend = NvmlBackend(pynvml)
    if REAL_NVML:
        backend.open()
        assert len(backend.sample()) == pynvml.nvmlDeviceGetCount()
        backend.close()
    else:
        with pytest.raises(BackendUnavailableError, match="NVML could not initialise"):
            backend.open()


def test_library_becoming_unusable_raises_unavailable(backend_for: Any) -> None:
    nv = h100_node(2)
    backend = backend_for(nv)
    backend.sample()
    nv.nvmlShutdown()  # someone else shut NVML down: every call is Uninitialized
    with pytest.raises(BackendUnavailableError, match="unusable"):
        backend.sample()
    nv.nvmlInit()


def test_xid_event_arrives_through_the_event_set(backend_for: Any) -> None:
    nv = h100_node()
    backend = backend_for(nv)
    backend.sample()
    assert backend.wait_event(0.01) is None
    assert nv.emit_xid(3, 79) == 1
    ev = backend.wait_event(1.0)
    assert ev is not None
    assert ev.kind is GpuEventKind.XID and ev.xid == 79 and ev.source is EventSource.NVML
    assert ev.pci_bus_id == "00000000:5D:00.0" and ev.uuid == nv.gpus[3].uuid
    nv.emit(2, pynvml.nvmlEventTypeDoubleBitEccError)
    ev = backend.wait_event(1.0)
    assert ev is not None and ev.kind is GpuEventKind.ECC_DOUBLE_BIT and ev.xid is None


def test_xid_154_reads_the_recovery_action_nvml_reports(backend_for: Any) -> None:
    """NVML's event carries only the XID number; the action XID 154 announces
    is read from the recovery-action field, where the driver has one."""
    nv = h100_node(2)
    nv.gpus[0].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    backend = backend_for(nv)
    backend.sample()
    nv.emit_xid(0, 154)
    ev = backend.wait_event(1.0)
    assert ev is not None and (ev.xid, ev.recovery_action) == (154, 2)
    nv.emit_xid(1, 154)  # a driver without the field: the kernel log will say it
    ev = backend.wait_event(1.0)
    assert ev is not None and (ev.xid, ev.recovery_action) == (154, None)
    nv.emit_xid(0, 79)  # no other XID costs a field read
    calls = nv.calls
    ev = backend.wait_event(1.0)
    assert ev is not None and ev.recovery_action is None and nv.calls == calls + 1  # the wait itself


def test_an_event_before_the_first_sample_still_names_the_bus_id(backend_for: Any) -> None:
    """The kernel log names GPUs by bus id: NVML's report must carry it too,
    or the two reports of one XID could not be matched."""
    nv = h100_node(2)
    backend = backend_for(nv)
    nv.emit_xid(1, 79)
    ev = backend.wait_event(1.0)
    assert ev is not None and (ev.uuid, ev.pci_bus_id) == (nv.gpus[1].uuid, "00000000:2A:00.0")


def test_close_waits_for_the_event_thread_before_freeing_the_set() -> None:
    """The poll thread closes NVML (it broke) while the event thread is
    blocked in nvmlEventSetWait: freeing the set under it would crash the
    real library, so close must wait for that wait to end first."""
    nv = h100_node(2)
    backend = NvmlBackend(nv)
    backend.open()
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(backend.wait_event(0.5)))
    waiter.start()
    assert nv.wait_for_waiter()
    backend.close()
    waiter.join()
    assert nv.misuse == []
    assert results == [None]
    # Closed: the next wait does not touch NVML at all.
    calls = nv.calls
    assert backend.wait_event(0.01) is None and nv.calls == calls


def test_events_only_for_supported_types(backend_for: Any) -> None:
    nv = h100_node(2)
    nv.gpus[1].supported_events = pynvml.nvmlEventTypeXidCriticalError
    backend_for(nv)
    assert nv.emit(1, pynvml.nvmlEventTypeDoubleBitEccError) == 0
    assert nv.emit(1, pynvml.nvmlEventTypeXidCriticalError) == 1


def test_recorded_fixture_replays_the_same_samples(tmp_path: Path, backend_for: Any) -> None:
    nv = h100_node(2)
    nv.gpus[0].remapped_rows = (1, 2, 1, 0)
    nv.gpus[1].errors = {"nvmlDeviceGetMigMode": pynvml.NVML_ERROR_NOT_SUPPORTED}
    nv.gpus[1].nvlink_counters[3] = [7, 0, 0, 1, 0]
    fixture = tmp_path / "nvml.json"
    fixture.write_text(json.dumps(record(nv)))
    replayed = FakeNvml.from_fixture(fixture)
    assert backend_for(replayed).sample() == backend_for(nv).sample()


def test_a_full_poll_through_nvml(nvml_module: Any, tmp_path: Path) -> None:
    """The whole agent on NVML: the stand-in here, the real GPUs where present."""
    from agent.config import config_from_dict
    from agent.monitor import Monitor
    from agent.sources.base import NodeHardware
    from agent.sources.infiniband import SysfsIbSource
    from agent.sources.storage import StatvfsMountSource

    hardware = NodeHardware(
        gpu=NvmlBackend(nvml_module),
        kmsg=None,
        ib=SysfsIbSource(str(tmp_path)),
        mounts=StatvfsMountSource([], interval_s=10),
    )
    monitor = Monitor(config_from_dict(None), hardware, "node-a")
    try:
        report, sample = monitor.step()
    finally:
        monitor.close()
    assert report.errors == ()
    assert len(report.gpus) == len(sample.gpus) > 0
    assert {g.uuid for g in report.gpus} == {s.uuid for s in sample.gpus}
    assert report.healthy_gpu_memory_mib == sum(g.memory_total_mib for g in report.gpus if g.healthy)
