"""Finding the binaries and cleaning up after a killed run, checked without starting a cluster.

A run that cannot find its binaries must say how to build them, and the
clean-up of a crashed run must never kill a process it does not own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import RUN_DIR_PREFIX, ControlPlaneError, find_binaries, free_ports, reap_leftovers


def test_missing_binaries_fail_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_CACHE", str(tmp_path))
    for var in ("ETCD", "KUBE_APISERVER", "KUBE_CONTROLLER_MANAGER", "KUBECTL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ControlPlaneError, match="make controlplane") as err:
        find_binaries()
    assert str(tmp_path / "etcd-") in str(err.value)

    monkeypatch.setenv("KUBE_APISERVER", str(tmp_path / "nowhere"))
    with pytest.raises(ControlPlaneError, match=r"KUBE_APISERVER=.*nowhere is not an executable file"):
        find_binaries()


def test_reap_leftovers_kills_only_a_dead_runs_processes(tmp_path: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    dead_pid = finished.pid
    orphan_dir = tmp_path / f"{RUN_DIR_PREFIX}{dead_pid}-abc"
    live_dir = tmp_path / f"{RUN_DIR_PREFIX}{os.getpid()}-def"
    orphan_dir.mkdir()
    live_dir.mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    orphan = subprocess.Popen([*sleeper, str(orphan_dir)], start_new_session=True)
    bystander = subprocess.Popen([*sleeper, "unrelated"], start_new_session=True)
    try:
        (orphan_dir / "pids").write_text(f"{orphan.pid}\n{bystander.pid}\n")
        (live_dir / "pids").write_text(f"{bystander.pid}\n")

        assert reap_leftovers(tmp_path) == [orphan_dir]

        assert orphan.wait(10) == -9
        assert bystander.poll() is None
        assert not orphan_dir.exists()
        assert live_dir.exists()
    finally:
        for proc in (orphan, bystander):
            proc.kill()
            proc.wait()


def test_free_ports_are_distinct_and_bindable_on_loopback() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
