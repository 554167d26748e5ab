"""PodResources answers shaped as the kubelet sends them, for the agent's tests.

The shapes follow the proto's own documentation (KEP 606 and the
``api.proto`` comments): a container with several devices of one resource,
devices of other resources beside GPUs (RDMA), a container with no devices,
exclusive CPUs and memory with NUMA topology, and DRA claims with CDI devices.
"""

from __future__ import annotations

from gpuwarden.podresources.v1 import api_pb2 as pb

UUIDS = tuple(f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}" for i in range(4))


def numa(*ids: int) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=i) for i in ids])


def training_node() -> pb.ListPodResourcesResponse:
    """Two GPU pods, a DRA pod, a CPU-pinned pod without devices, and a sidecar."""
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="trainer-0",
                namespace="ml",
                containers=[
                    pb.ContainerResources(
                        name="trainer",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=[UUIDS[0], UUIDS[1]], topology=numa(0)
                            ),
                            pb.ContainerDevices(resource_name="rdma/ib", device_ids=["mlx5_0"], topology=numa(0)),
                        ],
                        cpu_ids=[2, 3, 4, 5],
                        memory=[pb.ContainerMemory(memory_type="memory", size=1 << 30, topology=numa(0))],
                    ),
                    # A sidecar: no devices at all.
                    pb.ContainerResources(name="log-shipper"),
                ],
            ),
            pb.PodResources(
                name="notebook",
                namespace="team-a",
                containers=[
                    pb.ContainerResources(
                        name="jupyter",
                        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[UUIDS[2].lower()])],
                    )
                ],
            ),
            pb.PodResources(
                name="dra-job",
                namespace="team-b",
                containers=[
                    pb.ContainerResources(
                        name="main",
                        dynamic_resources=[
                            pb.DynamicResource(
                                claim_name="gpu-claim",
                                claim_namespace="team-b",
                                claim_resources=[
                                    pb.ClaimResource(
                                        cdi_devices=[pb.CDIDevice(name=f"nvidia.com/gpu={UUIDS[3]}")],
                                        driver_name="gpu.nvidia.com",
                                        pool_name="node-a",
                                        device_name="gpu-3",
                                    ),
                                    # A NIC from another DRA driver: no GPU.
                                    pb.ClaimResource(
                                        cdi_devices=[pb.CDIDevice(name="example.com/nic=eth1")],
                                        driver_name="nic.example.com",
                                        pool_name="node-a",
                                        device_name="eth1",
                                    ),
                                ],
                            )
                        ],
                    )
                ],
            ),
            pb.PodResources(
                name="cpu-pinned",
                namespace="default",
                containers=[pb.ContainerResources(name="app", cpu_ids=[10, 11], memory=[])],
                cpu_ids=[10, 11],
            ),
        ]
    )


def offered(*uuids: str) -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(
        devices=[
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=list(uuids), topology=numa(0)),
            pb.ContainerDevices(resource_name="rdma/ib", device_ids=["mlx5_0", "mlx5_1"]),
        ],
        cpu_ids=list(range(32)),
        memory=[pb.ContainerMemory(memory_type="hugepages-1Gi", size=4 << 30, topology=numa(1))],
    )
