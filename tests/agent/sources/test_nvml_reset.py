"""GPU processes and resets through the NVML backend: the pynvml stand-in and a stand-in nvidia-smi.

The reset itself is ``nvidia-smi --gpu-reset``: the tests put an executable
of that name first on PATH that records how it was called and answers as the
real one does (a success line, or an error and a non-zero status), which is
the hardware boundary for this path.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.sources.base import BackendUnavailableError, GpuResetError
from agent.sources.nvml import NvmlBackend
from tests.agent.fake_pynvml import FakeNvml, h100_node


def fake_nvidia_smi(directory: Path, *, status: int = 0, output: str = "", sleep_s: float = 0.0) -> Path:
    """An ``nvidia-smi`` on PATH that writes its arguments to ``calls`` and answers with ``output``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    calls = directory / "calls"
    started = directory / "started"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{calls}"\n'
        f'touch "{started}"\n'
        f"sleep {sleep_s}\n"
        f"printf '%s\\n' '{output}'\n"
        f"exit {status}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir


@pytest.fixture
def backend() -> Iterator[tuple[FakeNvml, NvmlBackend]]:
    nv = h100_node()
    b = NvmlBackend(nv, reset_timeout_s=5.0)
    b.open()
    b.sample()  # names every GPU, bus id included
    yield nv, b
    b.close()


def test_running_processes_lists_compute_and_graphics_pids_once(backend: tuple[FakeNvml, NvmlBackend]) -> None:
    nv, b = backend
    nv.gpus[3].compute_pids = [4242, 17]
    nv.gpus[3].graphics_pids = [17, 900]
    assert b.running_processes(3) == (17, 900, 4242)
    assert b.running_processes(2) == ()


def test_a_gpu_without_graphics_processes_answers_with_its_compute_ones(backend: tuple[FakeNvml, NvmlBackend]) -> None:
    nv, b = backend
    nv.gpus[1].compute_pids = [55]
    nv.gpus[1].errors["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert b.running_processes(1) == (55,)


def test_processes_of_a_lost_gpu_cannot_be_listed(backend: tuple[FakeNvml, NvmlBackend]) -> None:
    nv, b = backend
    nv.gpus[4].lost = True
    with pytest.raises(GpuResetError, match="processes on GPU 4: GPU is lost"):
        b.running_processes(4)


def test_running_processes_against_real_nvml_where_present(nvml_module: Any) -> None:
    b = NvmlBackend(nvml_module)
    b.open()
    try:
        for gpu in b.sample():
            pids = b.running_processes(gpu.index)
            assert list(pids) == sorted(set(pids)) and all(p > 0 for p in pids)
    finally:
        b.close()


def test_reset_runs_nvidia_smi_on_the_bus_id_with_nvml_released_and_reopens(
    backend: tuple[FakeNvml, NvmlBackend], on_path: Path
) -> None:
    nv, b = backend
    calls = fake_nvidia_smi(on_path, output="GPU 00000000:3A:00.0 was successfully reset.", sleep_s=0.5)
    during: list[int] = []

    def watch() -> None:
        # While nvidia-smi runs, this process must hold NVML closed (it would refuse the reset).
        deadline = time.monotonic() + 5
        while not (on_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            nv.nvmlDeviceGetCount()
            during.append(1)
        except pynvml.NVMLError_Uninitialized:
            during.append(0)

    watcher = threading.Thread(target=watch)
    watcher.start()
    message = b.reset(2)
    watcher.join()
    assert calls.read_text().split() == ["--gpu-reset", "-i", "00000000:3A:00.0"]
    assert during == [0]
    assert "was successfully reset" in message
    # Open again, events registered anew: an XID after the reset arrives.
    assert len(b.sample()) == 8
    assert nv.emit_xid(2, 48) == 1
    event = b.wait_event(2.0)
    assert event is not None and event.xid == 48


def test_a_refused_reset_says_what_nvidia_smi_said(backend: tuple[FakeNvml, NvmlBackend], on_path: Path) -> None:
    _, b = backend
    fake_nvidia_smi(on_path, status=255, output="Unable to reset GPU 00000000:5D:00.0: In use by another client")
    with pytest.raises(GpuResetError, match=r"exited with status 255: Unable to reset GPU .*In use by another client"):
        b.reset(3)
    assert len(b.sample()) == 8


def test_a_reset_that_hangs_is_killed_after_the_timeout(on_path: Path) -> None:
    nv = h100_node()
    b = NvmlBackend(nv, reset_timeout_s=0.3)
    b.open()
    b.sample()
    fake_nvidia_smi(on_path, sleep_s=30)
    started = time.monotonic()
    with pytest.raises(GpuResetError, match=r"did not finish within 0.3s"):
        b.reset(0)
    assert time.monotonic() - started < 5
    assert len(b.sample()) == 8
    b.close()


def test_a_missing_nvidia_smi_fails_the_reset(backend: tuple[FakeNvml, NvmlBackend], tmp_path: Path) -> None:
    nv, _ = backend
    b = NvmlBackend(nv, nvidia_smi=str(tmp_path / "no-such-nvidia-smi"))
    b.open()
    b.sample()
    with pytest.raises(GpuResetError, match="not found"):
        b.reset(1)
    b.close()


def test_reset_and_processes_need_nvml_open() -> None:
    b = NvmlBackend(h100_node())
    with pytest.raises(BackendUnavailableError):
        b.running_processes(0)
    with pytest.raises(BackendUnavailableError):
        b.reset(0)
