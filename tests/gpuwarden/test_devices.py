"""The stand-in kubelet's device manager: it chooses among offered devices, and says so over PodResources."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.sources.podresources import KubeletPodResources
from gpuwarden.contract import RESOURCE_NVIDIA_GPU
from gpuwarden.localcluster.devices import DeviceManager


def _pod(name: str, *gpus: int, namespace: str = "ns") -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {RESOURCE_NVIDIA_GPU: str(n)}}} for i, n in enumerate(gpus)
            ]
        },
    }


def test_it_gives_free_offered_devices_in_the_plugins_order_and_never_the_assignment() -> None:
    offered = ["GPU-c", "GPU-a", "GPU-b"]
    manager = DeviceManager(lambda: offered)
    annotated = _pod("p", 1)
    annotated["metadata"] = {"name": "p", "namespace": "ns", "annotations": {"gpuwarden.io/gpu-assignment": "x"}}
    first = manager.admit(annotated)
    assert first is not None and first.devices == ("GPU-c",)
    assert manager.admit(annotated) == first, "admitted once"
    second = manager.admit(_pod("q", 1, 1))
    assert second is not None and second.containers == (("c0", ("GPU-a",)), ("c1", ("GPU-b",)))
    assert manager.admit(_pod("r", 1)) is None, "nothing offered is free"
    manager.release("ns", "p")
    third = manager.admit(_pod("r", 1))
    assert third is not None and third.devices == ("GPU-c",)


def test_a_device_the_plugin_stops_offering_is_not_given() -> None:
    offered = ["GPU-a", "GPU-b"]
    manager = DeviceManager(lambda: offered)
    offered.remove("GPU-a")
    admitted = manager.admit(_pod("p", 1))
    assert admitted is not None and admitted.devices == ("GPU-b",)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=8), st.integers(0, 8))
def test_no_device_is_ever_held_twice_and_only_offered_ones_are_held(wants: list[int], count: int) -> None:
    offered = [f"GPU-{i}" for i in range(count)]
    manager = DeviceManager(lambda: offered)
    for i, n in enumerate(wants):
        manager.admit(_pod(f"p{i}", n))
        if i % 3 == 2:
            manager.release("ns", f"p{i - 1}")
    held = [d for i in range(len(wants)) for d in manager.devices_of("ns", f"p{i}")]
    assert len(held) == len(set(held))
    assert set(held) <= set(offered)


def test_the_agents_reader_reads_what_it_serves() -> None:
    # Short: a unix socket's path has a limit of 107 bytes, which pytest's tmp_path can pass.
    with tempfile.TemporaryDirectory(prefix="pr-") as directory:
        offered = ["GPU-a", "GPU-b"]
        manager = DeviceManager(lambda: offered, f"{directory}/kubelet.sock").start()
        reader = KubeletPodResources(f"{directory}/kubelet.sock", 2.0)
        try:
            manager.admit(_pod("p", 1))
            (held,) = reader.list()
            assert (held.namespace, held.pod, held.container, held.resource, held.device_ids) == (
                "ns",
                "p",
                "c0",
                RESOURCE_NVIDIA_GPU,
                ("GPU-a",),
            )
            assert reader.allocatable() == frozenset(offered)
            manager.release("ns", "p")
            assert reader.list() == ()
        finally:
            reader.close()
            manager.stop()


@pytest.mark.parametrize("value", ["x", "-1"])
def test_an_unreadable_request_asks_for_nothing(value: str) -> None:
    pod = _pod("p", 0)
    pod["spec"] = {"containers": [{"name": "c", "resources": {"limits": {RESOURCE_NVIDIA_GPU: value}}}]}
    admitted = DeviceManager(lambda: ["GPU-a"]).admit(pod)
    assert admitted is not None and admitted.devices == ()
