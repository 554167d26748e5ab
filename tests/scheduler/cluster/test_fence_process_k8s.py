"""Two `gpuwarden scheduler` processes; the leader is paused with SIGSTOP in the middle of its binds.

Exactly as a long GC pause, a frozen VM or a node under memory pressure
would: the standby takes the lease over after it runs out and binds pods of
its own, then the old leader is resumed with SIGCONT and finds binds of its
old cycle still queued, some perhaps already in the socket. Nothing of that
old cycle may land on a GPU the new leader gave to another pod.

Each seed pauses the leader at a different point of its binds, with one
bind worker or several. While it is paused, higher-deserving work arrives,
so the new leader places different pods than the old one had queued: every
stale bind that got through would over-commit a GPU. ``--fence-seeds N``
runs more seeds than the default.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpuwarden.localcluster import ManagedProcess, free_ports
from tests.harness import ControlPlane, pod_bound_token, temporary_namespace, unique_name
from tests.scheduler.cluster.fencing import (
    LEASE_NAME,
    LEASE_NAMESPACE,
    forget_lease,
    gpu_pod,
    lease_holder,
    over_committed,
    wait_for_fence_policy,
)
from tests.scheduler.cluster.kube_objects import create_queue, delete_queue
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_rbac")]

NODES = 20
GPUS = NODES * 8
EARLY_PODS = 200
URGENT_PODS = GPUS // 2


def _kubeconfig(control_plane: ControlPlane, token: str, path: Path) -> Path:
    """A kubeconfig of the test API server with the scheduler pod's token."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["users"] = [{"name": "scheduler", "user": {"token": token}}]
    config["contexts"] = [{"name": "scheduler", "context": {"cluster": "gpuwarden-test", "user": "scheduler"}}]
    config["current-context"] = "scheduler"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture
def schedulers(
    control_plane: ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> Iterator[Callable[[str, int], ManagedProcess]]:
    """Starts `gpuwarden scheduler` processes on the shipped Lease; resumes and stops them afterwards."""
    forget_lease(k8s)
    started: list[ManagedProcess] = []
    with pod_bound_token(k8s, "gpuwarden-scheduler", "gpuwarden") as token:
        kubeconfig = _kubeconfig(control_plane, token, tmp_path / "kubeconfig")

        def start(name: str, bind_workers: int) -> ManagedProcess:
            (port,) = free_ports(1)
            proc = ManagedProcess(
                name=name,
                argv=[
                    "env",
                    f"POD_NAME={name}",  # the identity's prefix, as the Deployment sets it
                    sys.executable,
                    "-m",
                    "gpuwarden.cli",
                    "--log-format=json",
                    "scheduler",
                    f"--kubeconfig={kubeconfig}",
                    f"--lease-namespace={LEASE_NAMESPACE}",
                    f"--lease-name={LEASE_NAME}",
                    "--lease-duration=3",
                    "--period=0.3",
                    f"--bind-workers={bind_workers}",
                    "--remediation=off",
                    "--metrics-address=127.0.0.1",
                    f"--metrics-port={port}",
                ],
                log_path=tmp_path / f"{name}.log",
                pid_file=tmp_path / "pids",
            )
            proc.start()
            started.append(proc)
            return proc

        try:
            yield start
        finally:
            for proc in started:
                if proc.popen is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.popen.pid, signal.SIGCONT)
                proc.stop()
            forget_lease(k8s)


def _bound(core: client.CoreV1Api, namespace: str) -> int:
    return sum(1 for p in core.list_namespaced_pod(namespace).items if p.spec.node_name)


def _settled(core: client.CoreV1Api, namespace: str, quiet_s: float, timeout_s: float) -> int:
    """The number of bound pods once it has not changed for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = _bound(core, namespace)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.2)
    return last


def _pause_the_leader_mid_bind(
    k8s: client.ApiClient,
    processes: dict[str, ManagedProcess],
    queues: tuple[str, str],
    nodes: set[str],
    pause_at: int,
) -> str:
    """One seed: fill, pause the leader after ``pause_at`` binds, take over, resume; what happened."""
    early, urgent = queues
    core = client.CoreV1Api(k8s)
    with temporary_namespace(k8s, "fence") as namespace:
        holder = wait_for(lambda: lease_holder(k8s), timeout=30, description="a leader")
        leader_name = holder.split("_", 1)[0]
        leader = processes[leader_name].popen
        assert leader is not None
        # The pods wait for their queue, so that one cycle queues all their binds at once.
        for i in range(EARLY_PODS):
            core.create_namespaced_pod(namespace, gpu_pod(f"early-{i}", early))
        create_queue(k8s, early, {"gpu": {"quota": 0}})
        wait_for(lambda: _bound(core, namespace) >= pause_at, timeout=60, interval=0.01, description="binding")
        os.kill(leader.pid, signal.SIGSTOP)
        paused_at = _bound(core, namespace)
        try:
            for i in range(URGENT_PODS):
                core.create_namespaced_pod(namespace, gpu_pod(f"urgent-{i}", urgent))
            wait_for(
                lambda: lease_holder(k8s) not in ("", holder),
                timeout=30,
                description="the standby takes the lease over",
            )
            after_takeover = _settled(core, namespace, quiet_s=2.0, timeout_s=60)
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        # The old leader wakes with its old cycle's binds queued: give them every chance to land.
        time.sleep(3.0)
        final = _settled(core, namespace, quiet_s=2.0, timeout_s=30)
        seen = f"paused {leader_name} at {paused_at} bound, {after_takeover} after the takeover, {final} at the end"
        doubled = over_committed(k8s, nodes)
        assert doubled == {}, (seen, doubled)
        assert final == after_takeover <= GPUS, seen
        assert all(p.running() for p in processes.values()), [p.log_tail() for p in processes.values()]
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(namespace).items, timeout=30, description="pods gone")
        delete_queue(k8s, early)
    return seen


def test_a_leader_paused_mid_bind_and_resumed_after_a_takeover_over_commits_nothing(  # noqa: PLR0917
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    schedulers: Callable[[str, int], ManagedProcess],
    request: pytest.FixtureRequest,
) -> None:
    seeds = int(request.config.getoption("--fence-seeds"))
    nodes = set(cluster(NODES))
    urgent = queue(URGENT_PODS)  # deserves half of the cluster
    with control_plane.impersonate("gpuwarden-scheduler", "gpuwarden") as as_scheduler:
        wait_for_fence_policy(k8s, as_scheduler, "default")
    processes = {"sched-a": schedulers("sched-a", 1), "sched-b": schedulers("sched-b", 4)}
    for seed in range(seeds):
        pause_at = random.Random(seed).randint(1, GPUS // 3)
        queues = (unique_name("early"), urgent)  # made in the seed: borrows what is idle
        print(f"seed {seed}:", _pause_the_leader_mid_bind(k8s, processes, queues, nodes, pause_at))
    for proc in processes.values():
        log = proc.log_path.read_text()
        assert "Traceback" not in log, proc.log_tail(80)
