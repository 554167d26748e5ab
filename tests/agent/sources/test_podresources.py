"""The PodResources reader: the mapping to GPUs, and every way the kubelet's socket fails.

The socket is served by a real gRPC server of the real servicer
(:mod:`gpuwarden.podresources.fake`), so the reader is tested through the
wire, as against a kubelet.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from agent.allocations import MAX_HOLDERS_PER_GPU, GpuHolder, gpu_allocations
from agent.config import config_from_dict
from agent.hardware import build_hardware
from agent.monitor import Monitor
from agent.probes.podresources import PodResourcesProbe
from agent.publish.metrics import MetricsPublisher
from agent.samples import HeldDevices, PodResourcesFailure, PodResourcesSample
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from agent.sources.base import PodResourcesError
from agent.sources.podresources import KubeletPodResources, held_from_list, ids_from_allocatable
from gpuwarden.podresources.fake import Behaviour, FakePodResources
from gpuwarden.podresources.v1 import api_pb2 as pb
from tests.agent.sources.podresources_answers import UUIDS, offered, training_node


@pytest.fixture
def sock() -> Iterator[str]:
    # Short: a unix socket's path has a limit of 107 bytes, which pytest's tmp_path can pass.
    with tempfile.TemporaryDirectory(prefix="pr-") as d:
        yield os.path.join(d, "kubelet.sock")


@pytest.fixture
def kubelet(sock: str) -> Iterator[FakePodResources]:
    fake = FakePodResources(sock)
    fake.set_answers(training_node(), offered(*UUIDS[:3]))
    with fake:
        yield fake


# ------------------------------------------------------------------ mapping


def _sample(
    listed: pb.ListPodResourcesResponse, allocatable: pb.AllocatableResourcesResponse | None
) -> PodResourcesSample:
    return PodResourcesSample(
        held=held_from_list(listed),
        listed=True,
        allocatable=ids_from_allocatable(allocatable) if allocatable is not None else None,
    )


def test_list_answer_keeps_every_container_with_devices_and_nothing_else() -> None:
    held = held_from_list(training_node())
    assert HeldDevices("ml", "trainer-0", "trainer", "nvidia.com/gpu", (UUIDS[0], UUIDS[1])) in held
    assert HeldDevices("ml", "trainer-0", "trainer", "rdma/ib", ("mlx5_0",)) in held
    assert (
        HeldDevices("team-b", "dra-job", "main", "dra:gpu.nvidia.com", ("gpu-3", f"nvidia.com/gpu={UUIDS[3]}")) in held
    )
    # The sidecar and the CPU-pinned pod hold no devices.
    assert {(h.pod, h.container) for h in held} == {
        ("trainer-0", "trainer"),
        ("notebook", "jupyter"),
        ("dra-job", "main"),
    }


def test_holders_per_gpu_from_device_ids_dra_and_allocatable() -> None:
    got = gpu_allocations(_sample(training_node(), offered(*UUIDS[:3])), UUIDS)
    assert got[UUIDS[0]].holders == (GpuHolder("ml", "trainer-0", "trainer", "nvidia.com/gpu"),)
    assert got[UUIDS[1]].holders == (GpuHolder("ml", "trainer-0", "trainer", "nvidia.com/gpu"),)
    # Device IDs compare without case; NVML's spelling is kept.
    assert got[UUIDS[2]].holders == (GpuHolder("team-a", "notebook", "jupyter", "nvidia.com/gpu"),)
    # The DRA claim's CDI device names the GPU; its NIC is no GPU.
    assert got[UUIDS[3]].holders == (GpuHolder("team-b", "dra-job", "main", "dra:gpu.nvidia.com"),)
    assert [got[u].offered for u in UUIDS] == [True, True, True, False]


def test_without_allocatable_nothing_is_said_about_offered() -> None:
    got = gpu_allocations(_sample(training_node(), None), UUIDS)
    assert {a.offered for a in got.values()} == {None}


def test_time_sliced_replicas_hold_their_gpu_once_per_container() -> None:
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name=f"p{i}",
                namespace="ns",
                containers=[
                    pb.ContainerResources(
                        name="c",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu.shared",
                                device_ids=[f"{UUIDS[0]}::{2 * i}", f"{UUIDS[0]}::{2 * i + 1}"],
                            )
                        ],
                    )
                ],
            )
            for i in range(MAX_HOLDERS_PER_GPU + 3)
        ]
    )
    got = gpu_allocations(_sample(listed, offered(f"{UUIDS[0]}::0")), UUIDS)
    assert len(got[UUIDS[0]].holders) == MAX_HOLDERS_PER_GPU
    assert got[UUIDS[0]].omitted == 3
    assert got[UUIDS[0]].offered is True
    assert got[UUIDS[1]].holders == ()


def test_mig_devices_and_dra_devices_named_by_index_hold_no_gpu() -> None:
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    pb.ContainerResources(
                        name="c",
                        devices=[pb.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=["MIG-1234"])],
                        dynamic_resources=[
                            pb.DynamicResource(
                                claim_name="x",
                                claim_namespace="ns",
                                claim_resources=[pb.ClaimResource(driver_name="gpu.nvidia.com", device_name="gpu-0")],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    assert all(a.holders == () for a in gpu_allocations(_sample(listed, None), UUIDS).values())


_names = st.text(alphabet="abcdefghij-", min_size=1, max_size=6)


@given(
    st.lists(
        st.tuples(_names, _names, _names, st.lists(st.sampled_from([*UUIDS, "mlx5_0", "MIG-x", "gpu-0"]), max_size=4)),
        max_size=30,
    ),
    st.one_of(st.none(), st.frozensets(st.sampled_from([*UUIDS, "mlx5_0"]))),
)
def test_property_every_gpu_device_id_is_a_holder_and_nothing_else(
    entries: list[tuple[str, str, str, list[str]]], allocatable: frozenset[str] | None
) -> None:
    held = tuple(HeldDevices(ns, pod, c, "nvidia.com/gpu", tuple(ids)) for ns, pod, c, ids in entries if ids)
    got = gpu_allocations(PodResourcesSample(held=held, listed=True, allocatable=allocatable), UUIDS)
    assert set(got) == set(UUIDS)
    for uuid, allocation in got.items():
        expected = {GpuHolder(h.namespace, h.pod, h.container, h.resource) for h in held if uuid in h.device_ids}
        assert set(allocation.holders) == expected
        assert list(allocation.holders) == sorted(allocation.holders)
        assert allocation.offered == (None if allocatable is None else uuid in allocatable)


# ------------------------------------------------------------ over the wire


def test_reads_what_the_kubelet_serves(kubelet: FakePodResources, sock: str) -> None:
    source = KubeletPodResources(sock, timeout_s=2)
    try:
        assert source.list() == held_from_list(training_node())
        assert source.allocatable() == ids_from_allocatable(offered(*UUIDS[:3]))
    finally:
        source.close()


def _failure(source: KubeletPodResources) -> PodResourcesFailure:
    with pytest.raises(PodResourcesError) as caught:
        source.list()
    return caught.value.failure


def test_missing_socket(sock: str) -> None:
    assert _failure(KubeletPodResources(sock, timeout_s=1)) is PodResourcesFailure.MISSING


def test_socket_nobody_listens_on_is_refused(sock: str) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock)
    dead.close()  # the file stays, nobody listens
    source = KubeletPodResources(sock, timeout_s=1)
    try:
        assert _failure(source) is PodResourcesFailure.REFUSED
    finally:
        source.close()


def test_path_that_is_no_socket_is_invalid(sock: str) -> None:
    with open(sock, "w") as f:
        f.write("not a socket")
    assert _failure(KubeletPodResources(sock, timeout_s=1)) is PodResourcesFailure.INVALID


def test_hung_kubelet_times_out_within_the_deadline(sock: str) -> None:
    with FakePodResources(sock, Behaviour.HANG):
        source = KubeletPodResources(sock, timeout_s=0.3)
        try:
            started = time.monotonic()
            assert _failure(source) is PodResourcesFailure.TIMEOUT
            assert time.monotonic() - started < 2.0
        finally:
            source.close()


@pytest.mark.parametrize("behaviour", [Behaviour.GARBAGE, Behaviour.BAD_MESSAGE])
def test_garbage_is_invalid(sock: str, behaviour: Behaviour) -> None:
    with FakePodResources(sock, behaviour):
        source = KubeletPodResources(sock, timeout_s=1)
        try:
            assert _failure(source) is PodResourcesFailure.INVALID
        finally:
            source.close()


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        (grpc.StatusCode.UNIMPLEMENTED, PodResourcesFailure.UNIMPLEMENTED),
        (grpc.StatusCode.INTERNAL, PodResourcesFailure.ERROR),
    ],
)
def test_error_status(
    kubelet: FakePodResources, sock: str, code: grpc.StatusCode, failure: PodResourcesFailure
) -> None:
    kubelet.fail("List", code)
    source = KubeletPodResources(sock, timeout_s=1)
    try:
        assert _failure(source) is failure
    finally:
        source.close()


def test_kubelet_vanishing_and_coming_back_is_read_again(kubelet: FakePodResources, sock: str) -> None:
    source = KubeletPodResources(sock, timeout_s=1)
    try:
        assert source.list()
        kubelet.vanish()
        assert _failure(source) is PodResourcesFailure.MISSING
        kubelet.set_answers(pb.ListPodResourcesResponse())
        kubelet.start()
        assert source.list() == ()
    finally:
        source.close()


# ------------------------------------------------------------------- probe


def test_probe_logs_once_per_state_change_and_counts_by_reason(kubelet: FakePodResources, sock: str) -> None:
    probe = PodResourcesProbe(KubeletPodResources(sock, timeout_s=1), sock)
    with capture_logs() as logs:
        assert probe.read().ok
        kubelet.vanish()
        for _ in range(3):
            sample = probe.read()
            assert sample.failure is PodResourcesFailure.MISSING
            assert not sample.listed
        kubelet.start()
        kubelet.fail("GetAllocatableResources", grpc.StatusCode.UNIMPLEMENTED)
        sample = probe.read()
    events = [(e["event"], e.get("reason")) for e in logs if e["event"].startswith("podresources")]
    assert events == [
        ("podresources_read", None),
        ("podresources_unavailable", "missing"),
        ("podresources_unavailable", "unimplemented"),
    ]
    # List answered: its holders count, only "offered" is unknown.
    assert sample.listed and sample.held and sample.allocatable is None
    assert dict(sample.failures) == {PodResourcesFailure.MISSING: 3, PodResourcesFailure.UNIMPLEMENTED: 1}


# ----------------------------------------------------- in the agent's poll


def _monitor(sock: str) -> tuple[SimNode, Monitor]:
    node = SimNode(load_scenario("healthy"))
    hardware = node.hardware()
    config = config_from_dict({"poll_interval_s": 3600, "pod_resources": {"socket": sock, "timeout_s": 0.3}})
    hardware.pod_resources = build_hardware("sim", config, scenario="healthy").pod_resources
    return node, Monitor(config, hardware, "node-a")


def _scrape(metrics: MetricsPublisher) -> str:
    return generate_latest(metrics.registry).decode()


def test_poll_reads_holders_and_survives_the_socket_hanging_and_vanishing(sock: str) -> None:
    node, monitor = _monitor(sock)
    metrics = MetricsPublisher()
    fake = FakePodResources(sock)
    try:
        report, sample = monitor.step()
        uuids = [g.uuid for g in report.gpus]
        assert sample.pod_resources is not None and sample.pod_resources.failure is PodResourcesFailure.MISSING
        metrics.observe_sample(sample)
        text = _scrape(metrics)
        assert "gpuwarden_podresources_up 0.0" in text
        assert 'gpuwarden_podresources_errors_total{reason="missing"} 1.0' in text
        assert 'gpuwarden_podresources_errors_total{reason="timeout"} 0.0' in text

        fake.set_answers(
            pb.ListPodResourcesResponse(
                pod_resources=[
                    pb.PodResources(
                        name="p",
                        namespace="ns",
                        containers=[
                            pb.ContainerResources(
                                name="c",
                                devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuids[0]])],
                            )
                        ],
                    )
                ]
            ),
            offered(*uuids),
        )
        fake.start()
        report, sample = monitor.step()
        assert sample.pod_resources is not None and sample.pod_resources.ok
        assert gpu_allocations(sample.pod_resources, uuids)[uuids[0]].holders == (
            GpuHolder("ns", "p", "c", "nvidia.com/gpu"),
        )
        metrics.observe_sample(sample)
        assert "gpuwarden_podresources_up 1.0" in _scrape(metrics)

        fake.behaviour = Behaviour.HANG
        fake.start()
        node.inject("xid", gpu=0, xid=79)
        started = time.monotonic()
        report, sample = monitor.step()
        # The GPU's fault is judged even though the kubelet hangs; the poll waited one timeout only.
        assert time.monotonic() - started < 2.0
        assert any(f.reason == "Xid79" for f in report.faults)
        assert sample.pod_resources is not None and sample.pod_resources.failure is PodResourcesFailure.TIMEOUT
        assert not report.errors

        fake.vanish()
        report, sample = monitor.step()
        assert sample.pod_resources is not None and sample.pod_resources.failure is PodResourcesFailure.MISSING
        assert len(report.gpus) == len(uuids)
    finally:
        fake.vanish()
        monitor.close()


def test_no_socket_configured_reads_nothing() -> None:
    monitor = Monitor(config_from_dict({"poll_interval_s": 3600}), build_hardware("sim", config_from_dict({})), "n")
    try:
        _, sample = monitor.step()
        assert sample.pod_resources is None
        metrics = MetricsPublisher()
        metrics.observe_sample(sample)
        assert "podresources" not in _scrape(metrics)
    finally:
        monitor.close()


def test_a_failure_keeps_the_message_it_began_with(sock: str) -> None:
    """The message is published in the GPUNode: rewording from poll to poll must not rewrite it."""

    class Flaky(KubeletPodResources):
        calls = 0

        def list(self) -> tuple[HeldDevices, ...]:
            Flaky.calls += 1
            raise PodResourcesError(PodResourcesFailure.TIMEOUT, f"deadline exceeded after {Flaky.calls} tries")

    probe = PodResourcesProbe(Flaky(sock), sock)
    assert [probe.read().error for _ in range(3)] == ["deadline exceeded after 1 tries"] * 3
