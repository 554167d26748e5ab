"""The GPU holders' identity, read by name from a real API server (:class:`agent.publish.pods.PodDirectory`)."""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client

from agent.publish.pods import PodDirectory, PodIdentity
from gpuwarden import contract
from gpuwarden.kube import KubeApi
from tests.harness import simple_pod, temporary_namespace, unique_name

pytestmark = pytest.mark.k8s


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _recreate(core: client.CoreV1Api, namespace: str, name: str, node: str) -> str:
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    pod = core.create_namespaced_pod(namespace, simple_pod(name, node_name=node))
    return str(pod.metadata.uid)


def test_holders_are_read_when_they_appear_and_again_when_old(k8s: client.ApiClient) -> None:
    node = unique_name("holders")
    core = client.CoreV1Api(k8s)
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    clock = _Clock()
    directory = PodDirectory(api, node, max_age_s=600, clock=clock)
    with temporary_namespace(k8s, "holders") as namespace:
        first = _recreate(core, namespace, "trainer-0", node)
        core.create_namespaced_pod(namespace, simple_pod("elsewhere", node_name="another-node"))
        keys = {(namespace, "trainer-0"), (namespace, "elsewhere"), (namespace, "gone")}
        got = directory.resolve(keys)
        # A pod on another node, or none at all, has no identity here.
        assert got == {(namespace, "trainer-0"): PodIdentity(first, "default-scheduler")}
        assert directory.reads == 3

        # Steady: nothing read again.
        assert directory.resolve(keys) == got
        assert directory.reads == 3

        # Recreated under the same name while the holders look the same: right once the entry is old.
        second = _recreate(core, namespace, "trainer-0", node)
        assert directory.resolve(keys)[(namespace, "trainer-0")].uid == first
        clock.now += 601
        assert directory.resolve(keys)[(namespace, "trainer-0")].uid == second

        # A holder that leaves and comes back is read again at once.
        directory.resolve(keys - {(namespace, "trainer-0")})
        third = _recreate(core, namespace, "trainer-0", node)
        assert directory.resolve(keys)[(namespace, "trainer-0")].uid == third
