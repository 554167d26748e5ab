"""Leader election against the real API server: one leader, hand-over, take-over, never two at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from scheduler.cluster.leader import LeaderElectionConfig, LeaderElector
from tests.harness import ControlPlane, unique_name, wait_for

pytestmark = pytest.mark.k8s

LEASE_S = 3.0
RENEW_DEADLINE_S = 2.0
RETRY_S = 0.5


class LeaderWatch:
    """Samples every candidate's is_leader() over the whole test and records the callbacks.

    A sample with two leaders, or a start while another candidate still
    leads, is a failure whenever it happens, not only at the moments the
    test asserts something.
    """

    def __init__(self) -> None:
        self.electors: list[LeaderElector] = []
        self.lock = threading.Lock()
        self.transitions: list[tuple[float, str, str]] = []
        self.overlaps: list[list[str]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="leader-watch", daemon=True)

    def callbacks(self, name: str) -> dict[str, Callable[[], None]]:
        def started() -> None:
            with self.lock:
                others = [e.identity for e in self.electors if e.identity != name and e.is_leader()]
                if others:
                    self.overlaps.append([name, *others])
                self.transitions.append((time.monotonic(), name, "started"))

        def stopped() -> None:
            with self.lock:
                self.transitions.append((time.monotonic(), name, "stopped"))

        return {"on_started_leading": started, "on_stopped_leading": stopped}

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            leaders = [e.identity for e in list(self.electors) if e.is_leader()]
            with self.lock:
                self.samples += 1
                if len(leaders) > 1:
                    self.overlaps.append(leaders)

    def leaders(self) -> list[str]:
        return [e.identity for e in self.electors if e.is_leader()]

    def started(self, name: str) -> int:
        with self.lock:
            return sum(1 for _, who, what in self.transitions if who == name and what == "started")

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def candidates(
    control_plane: ControlPlane, namespace: str
) -> Iterator[tuple[LeaderWatch, Callable[..., tuple[LeaderElector, client.ApiClient]]]]:
    """Makes candidates for one fresh lease; stops them all and checks the sampler afterwards."""
    lease = unique_name("scheduler-lease")
    clients: list[client.ApiClient] = []
    with LeaderWatch() as watch:

        def make(name: str, *, start: bool = True) -> tuple[LeaderElector, client.ApiClient]:
            api = control_plane.api_client()
            clients.append(api)
            config = LeaderElectionConfig(
                namespace=namespace,
                name=lease,
                identity=name,
                lease_duration_s=LEASE_S,
                renew_deadline_s=RENEW_DEADLINE_S,
                retry_period_s=RETRY_S,
            )
            elector = LeaderElector(api, config, **watch.callbacks(name))
            watch.electors.append(elector)
            if start:
                elector.start()
            return elector, api

        try:
            yield watch, make
        finally:
            for elector in watch.electors:
                elector.stop(release=False)
            for api in clients:
                api.close()
    assert all(e._thread is None or not e._thread.is_alive() for e in watch.electors)
    assert watch.samples > 10
    assert watch.overlaps == []


def test_of_two_candidates_one_leads_and_a_clean_stop_hands_over_at_once(
    candidates: tuple[LeaderWatch, Callable[..., tuple[LeaderElector, client.ApiClient]]],
    k8s: client.ApiClient,
    namespace: str,
) -> None:
    watch, make = candidates
    a, _ = make("a")
    wait_for(a.is_leader, timeout=10, description="the first candidate leads")
    b, _ = make("b")
    time.sleep(LEASE_S + 1)  # longer than a lease: b must not have taken a renewed one
    assert watch.leaders() == ["a"]
    assert b.leader == "a"
    lease = client.CoordinationV1Api(k8s).read_namespaced_lease(a.config.name, namespace)
    assert lease.spec.holder_identity == "a"
    assert lease.spec.lease_duration_seconds == 3

    stopped_at = time.monotonic()
    a.stop()  # releases
    wait_for(b.is_leader, timeout=LEASE_S, description="the other candidate takes the released lease")
    # A released lease need not be waited out: the next retry takes it.
    assert time.monotonic() - stopped_at < LEASE_S
    lease = client.CoordinationV1Api(k8s).read_namespaced_lease(a.config.name, namespace)
    assert lease.spec.holder_identity == "b"
    assert lease.spec.lease_transitions == 1  # a created it, b took it over
    # The callback comes from b's own thread just after is_leader turned true (LeaderElector's docstring).
    wait_for(lambda: watch.started("b") >= 1, timeout=5, description="b's started callback")
    assert watch.started("a") == watch.started("b") == 1


def test_a_leader_that_dies_without_releasing_is_replaced_when_its_lease_expires(
    candidates: tuple[LeaderWatch, Callable[..., tuple[LeaderElector, client.ApiClient]]],
) -> None:
    watch, make = candidates
    a, _ = make("a")
    wait_for(a.is_leader, timeout=10, description="the first candidate leads")
    b, _ = make("b")
    wait_for(lambda: b.leader == "a", description="the other candidate sees the leader")
    assert watch.leaders() == ["a"]
    killed_at = time.monotonic()
    a.stop(release=False)
    assert not a.is_leader()
    wait_for(b.is_leader, timeout=LEASE_S + 2 * RETRY_S + 2, description="the other candidate takes over")
    took = time.monotonic() - killed_at
    # Not before the lease ran out (less the renew interval a's last renew
    # may lie back), and soon after.
    assert LEASE_S - RETRY_S - 0.1 <= took <= LEASE_S + 2 * RETRY_S + 2


def test_a_leader_cut_off_from_the_api_server_steps_down_before_another_takes_over(
    candidates: tuple[LeaderWatch, Callable[..., tuple[LeaderElector, client.ApiClient]]],
) -> None:
    watch, make = candidates
    a, api_a = make("a")
    wait_for(a.is_leader, timeout=10, description="the first candidate leads")
    b, _ = make("b")
    wait_for(lambda: b.leader == "a", description="the other candidate sees the leader")

    # a's requests now go nowhere, while a keeps running: a partition.
    api_a.configuration.host = "https://127.0.0.1:9"
    cut_at = time.monotonic()
    wait_for(lambda: not a.is_leader(), timeout=RENEW_DEADLINE_S + 1, description="the cut-off leader steps down")
    stepped_down = time.monotonic() - cut_at
    assert stepped_down <= RENEW_DEADLINE_S + 0.2
    assert not b.is_leader()
    wait_for(b.is_leader, timeout=LEASE_S + 2 * RETRY_S + 2, description="the other candidate takes over")
    wait_for(lambda: watch.started("a") == 1 and a.outages.in_outage, description="a noticed its outage")
    # a campaigns on and cannot win while b renews.
    time.sleep(2 * RETRY_S)
    assert watch.leaders() == ["b"]
