"""The lease fence without a cluster: which writes may leave, by term and by the monotonic clock.

The API server's half of the fence (the admission policy) and the whole
runner are tested against the real control plane in test_fence_k8s.py; here
the arithmetic and the gate: a write is let through only in the term its
cycle began in, only while the last renew is younger than ``fence_s``, and a
refused write never reaches the network.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from kubernetes import client

from gpuwarden.kube import KubeApi
from gpuwarden.localcluster import free_ports
from scheduler.cluster.bind import Binder
from scheduler.cluster.fence import LeaseFence, LeaseLostError
from scheduler.cluster.leader import LeaderElectionConfig, LeaderElector
from scheduler.engine.model import Bind
from tests.scheduler.builders import node as make_node


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def _elector(config: LeaderElectionConfig, clock: Clock) -> LeaderElector:
    """An elector that never talks to a server: its state is set as a renew would set it."""
    return LeaderElector(client.ApiClient(client.Configuration()), config, clock=clock)


def _renewed(elector: LeaderElector, at: float, *, new_term: bool) -> None:
    """What a successful acquire (``new_term``) or renew leaves behind, as LeaderElector._attempt and _lead do."""
    elector._last_renew = at
    if new_term:
        elector._leading = True
        elector.terms += 1


def test_fence_window_is_the_renew_deadline_unless_drift_and_margin_make_takeover_earlier() -> None:
    defaults = LeaderElectionConfig(namespace="ns")
    assert defaults.fence_s == defaults.renew_deadline_s == 10.0
    tight = LeaderElectionConfig(namespace="ns", lease_duration_s=3.0, renew_deadline_s=2.9, retry_period_s=1.0)
    # Another candidate's clock 5 % fast takes over after 3 / 1.05 s; one second is left for the write.
    assert tight.fence_s == pytest.approx(3.0 / 1.05 - 1.0)
    with pytest.raises(ValueError, match="too short"):
        LeaderElectionConfig(
            namespace="ns", lease_duration_s=1.0, renew_deadline_s=0.9, retry_period_s=0.5, write_margin_s=1.0
        )
    with pytest.raises(ValueError, match="drift"):
        LeaderElectionConfig(namespace="ns", max_clock_drift=1.0)


def test_a_term_holds_only_until_fence_s_after_the_last_renew_by_the_monotonic_clock() -> None:
    clock = Clock()
    elector = _elector(LeaderElectionConfig(namespace="ns", identity="a"), clock)
    assert elector.term() is None
    _renewed(elector, clock.now, new_term=True)
    assert elector.term() == 1
    assert elector.holds(1)
    assert not elector.holds(0)
    clock.now += 9.9
    assert elector.holds(1)
    clock.now += 0.2  # a pause of just over ten seconds since the renew
    assert not elector.holds(1)
    assert elector.term() is None


def test_work_armed_in_one_term_is_refused_in_the_next_even_while_leading() -> None:
    clock = Clock()
    elector = _elector(LeaderElectionConfig(namespace="ns", identity="a"), clock)
    _renewed(elector, clock.now, new_term=True)
    fence = LeaseFence(elector)
    assert fence.current() == 1
    fence.arm(1)
    fence.check("create_pod_binding")
    # Lost and taken again while the cycle's writes were queued: term 2 leads,
    # but the writes armed in term 1 must not go out.
    _renewed(elector, clock.now, new_term=True)
    assert elector.holds(2)
    with pytest.raises(LeaseLostError, match="term 1"):
        fence.check("create_pod_binding")
    assert fence.current() == 2
    fence.arm(2)
    fence.check("create_pod_binding")
    fence.disarm()
    with pytest.raises(LeaseLostError):
        fence.check("patch_node")
    assert fence.refused == 2


def test_a_fenced_write_never_reaches_the_network_and_reads_are_not_fenced() -> None:
    """KubeApi asks the guard before each mutating request; the refused one is never sent.

    The client points at a port nothing listens on: a request that went out
    would fail with a connection error, not with LeaseLostError.
    """
    (port,) = free_ports(1)
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    config.retries = False
    asked: list[str] = []
    clock = Clock()
    elector = _elector(LeaderElectionConfig(namespace="ns", identity="a"), clock)
    fence = LeaseFence(elector)

    def guard(operation: str) -> None:
        asked.append(operation)
        fence.check(operation)

    with client.ApiClient(config) as api_client:
        api = KubeApi(api_client, field_manager="test", timeout_s=2.0, write_guard=guard)
        binder = Binder(api, workers=4, holder=fence.token)
        node = make_node("n1", gpus=8)
        binds = [Bind(job=f"ns/j{i}", namespace="ns", pod=f"p{i}", uid=f"u{i}", node="n1") for i in range(3)]
        with pytest.raises(LeaseLostError):
            binder.bind_all(binds, {"n1": node})
        assert set(asked) == {"create_pod_binding"}
        assert api.stats.total_requests() == 0  # not one request was made
        for write in (
            lambda: api.patch_node("n1", {}),
            lambda: api.create_pod_eviction("ns", "p", {}),
            lambda: api.create_config_map("ns", {}),
            lambda: api.patch_gpunode("n1", {}),
            lambda: api.patch_podgroup_status("ns", "g", {}),
            lambda: api.create_event("ns", {}),
            lambda: api.delete_pod("ns", "p", "u"),
            lambda: api.check_write("escalation_webhook"),
        ):
            with pytest.raises(LeaseLostError):
                write()
        assert api.stats.total_requests() == 0
        asked.clear()
        with pytest.raises(Exception) as raised:  # a read goes out (and finds no server)
            api.get_pod("ns", "p")
        assert not isinstance(raised.value, LeaseLostError)
        assert asked == []


def test_fenced_objects_name_the_replica_and_its_term_as_the_lease_does() -> None:
    """``<identity>#<leaseTransitions>``: a replica that lost the lease and took it again is another term."""
    clock = Clock()
    elector = _elector(LeaderElectionConfig(namespace="ns", identity="a"), clock)
    fence = LeaseFence(elector)
    _renewed(elector, clock.now, new_term=True)
    elector._observed_spec = {"holderIdentity": "a", "leaseTransitions": 0}
    fence.arm(fence.current())
    assert fence.token() == "a#0"
    # b took it over (1), released it, and a took it again (2).
    _renewed(elector, clock.now, new_term=True)
    elector._observed_spec = {"holderIdentity": "a", "leaseTransitions": 2}
    fence.arm(fence.current())
    assert fence.token() == "a#2"
    fence.disarm()
    assert fence.token() is None
