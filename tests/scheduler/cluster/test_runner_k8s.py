"""Two replicas of the connected scheduler on one cluster: one acts, the other takes over when it dies."""

from __future__ import annotations

import gc
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from scheduler.cluster.leader import LeaderElectionConfig
from scheduler.runner import RunnerSettings, SchedulerRunner, connections_needed
from tests.harness import ControlPlane, unique_name
from tests.scheduler.cluster.kube_objects import node_of, pod, podgroup
from tests.waiting import wait_for

pytestmark = pytest.mark.k8s


@pytest.fixture
def replicas(control_plane: ControlPlane) -> Iterator[Callable[[str], tuple[SchedulerRunner, threading.Event]]]:
    """Starts scheduler replicas sharing one lease; stops them all afterwards."""
    lease = unique_name("sched-lease")
    started: list[tuple[SchedulerRunner, threading.Event, threading.Thread]] = []
    collecting = gc.isenabled()

    def start(identity: str) -> tuple[SchedulerRunner, threading.Event]:
        config = LeaderElectionConfig(
            namespace="default",
            name=lease,
            identity=identity,
            lease_duration_s=3.0,
            renew_deadline_s=2.0,
            retry_period_s=0.5,
        )
        settings = RunnerSettings(period_s=0.5, lease=config, metrics_port=0, metrics_host="127.0.0.1")
        configuration = control_plane.configuration()
        configuration.connection_pool_maxsize = connections_needed(settings)  # as `gpuwarden scheduler` sizes it
        runner = SchedulerRunner(client.ApiClient(configuration), settings)
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), name=f"runner-{identity}", daemon=True)
        thread.start()
        started.append((runner, stop, thread))
        return runner, stop

    yield start
    for _, stop, _ in started:
        stop.set()
    for _, _, thread in started:
        thread.join(30)
    assert not any(thread.is_alive() for _, _, thread in started)
    assert gc.isenabled() == collecting  # the last loop out gave collection back


def _get(runner: SchedulerRunner, path: str) -> tuple[int, str]:
    assert runner.server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{runner.server.port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _open_idle(runner: SchedulerRunner) -> int:
    """The connections open and idle in the pool the runner's writes take (urllib3's own queue)."""
    pool = runner.api._poster()[0]
    return sum(1 for conn in list(pool.pool.queue) if conn is not None and conn.sock is not None)


def _sample(text: str, line_start: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start + " ")]
    assert len(values) == 1, (line_start, values)
    return values[0]


def test_one_replica_schedules_and_the_standby_takes_over_when_it_dies(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    replicas: Callable[[str], tuple[SchedulerRunner, threading.Event]],
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    a, stop_a = replicas("replica-a")
    b, stop_b = replicas("replica-b")
    wait_for(lambda: a.elector.is_leader() or b.elector.is_leader(), timeout=20, description="a leader")
    leader, leader_stop, standby = (a, stop_a, b) if a.elector.is_leader() else (b, stop_b, a)
    assert not standby.elector.is_leader()

    podgroup(k8s, namespace, "gang", q, 4)
    for i in range(4):
        pod(k8s, namespace, f"gang-{i}", group="gang")
    wait_for(
        lambda: all(node_of(k8s, namespace, f"gang-{i}") in nodes for i in range(4)),
        timeout=30,
        description="the gang bound by the leader",
    )
    assert standby.cycles == 0  # a standby keeps its cache warm and acts on nothing
    # Synced, both loops collect between their turns (scheduler.collector): nothing collects on its own.
    assert not gc.isenabled()
    # The leader opened a connection for each bind worker when it won the lease. How many sit idle
    # in its pool later is not the point: the pool is the watches' too, and a watch that starts
    # again takes one and holds it.
    wait_for(lambda: leader.connections_open is not None, timeout=30, description="the leader's connections opened")
    assert leader.connections_open == leader.settings.bind_workers
    assert standby.connections_open is None
    assert _open_idle(standby) < standby.settings.bind_workers

    # Each replica says on /metrics whether it leads; only the leader counts binds.
    # The pods show bound before the cycle that bound them has finished and counted.
    bound = 'gpuwarden_scheduler_binds_total{outcome="Bound"}'

    def counted() -> str | None:
        text = _get(leader, "/metrics")[1]
        return text if _sample(text, bound) >= 4 else None

    leader_text = wait_for(counted, timeout=10, description="the leader's binds counted")
    _, standby_text = _get(standby, "/metrics")
    assert _sample(leader_text, "gpuwarden_scheduler_leader") == 1
    assert _sample(standby_text, "gpuwarden_scheduler_leader") == 0
    assert _sample(standby_text, 'gpuwarden_scheduler_binds_total{outcome="Bound"}') == 0
    assert _sample(leader_text, "gpuwarden_scheduler_cache_synced") == 1
    for replica in (leader, standby):
        assert _get(replica, "/healthz")[0] == 200
        assert _get(replica, "/readyz") == (200, "ok: cache synced\n")

    # The leader dies without handing over (no release): the standby waits out the lease.
    leader.elector.stop(release=False)
    leader_stop.set()
    wait_for(standby.elector.is_leader, timeout=20, description="the standby leading")
    podgroup(k8s, namespace, "next", q, 2)
    for i in range(2):
        pod(k8s, namespace, f"next-{i}", group="next")
    wait_for(
        lambda: all(node_of(k8s, namespace, f"next-{i}") in nodes for i in range(2)),
        timeout=30,
        description="the next gang bound by the new leader",
    )
    assert standby.cycles > 0
    failed = [r for r in (standby.last.binds if standby.last else ()) if not r.ok]
    assert failed == []


def test_the_end_of_a_pod_wakes_the_loop_only_while_work_waits_for_room(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    replicas: Callable[[str], tuple[SchedulerRunner, threading.Event]],
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    runner, _stop = replicas("replica-a")
    wait_for(runner.elector.is_leader, timeout=20, description="the leader")
    pod(k8s, namespace, "first", queue=q, gpus=8)
    wait_for(lambda: node_of(k8s, namespace, "first") in nodes, timeout=30, description="the first pod bound")
    # Nothing waits: the end of a running pod frees room nobody asked for.
    wait_for(lambda: not runner.cache.room_wanted, timeout=30, description="no room wanted")
    pod(k8s, namespace, "second", queue=q, gpus=8)
    wait_for(lambda: runner.cache.room_wanted, timeout=30, description="room wanted by the second pod")
    assert node_of(k8s, namespace, "second") is None
    client.CoreV1Api(k8s).patch_namespaced_pod_status("first", namespace, {"status": {"phase": "Succeeded"}})
    wait_for(lambda: node_of(k8s, namespace, "second") in nodes, timeout=30, description="the second pod bound")
    wait_for(lambda: not runner.cache.room_wanted, timeout=30, description="no room wanted again")
