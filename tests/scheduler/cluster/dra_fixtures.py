"""Fixtures of the tests that run pods with DRA ResourceClaims: the driver's classes, DRA-only nodes, the controller.

A DRA-only node is what the GPU Operator's DRA mode leaves: no device
plugin (``nvidia.com/gpu`` 0), no GPUNode, only NVIDIA's DRA driver's
ResourceSlice (``dra_objects.driver_slice``) and its DeviceClasses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden.localcluster import create_gpu_node
from tests.harness import ControlPlane, unique_name
from tests.scheduler.remediation.dra_objects import DEVICECLASSES, DriverGpu, driver_slice, mig_devices

DRA = ("resource.k8s.io", "v1")
JSON = dict[str, Any]

FOUR = [
    DriverGpu(
        index=i, minor=i, uuid=f"GPU-0000000{i}-1111-2222-3333-44444444444{i}", pci_bus=f"00000000:{0x18 + i:02X}:00.0"
    )
    for i in range(4)
]


@pytest.fixture(scope="module")
def device_classes(control_plane: ControlPlane) -> None:
    """The DeviceClasses the driver's chart installs; kept (cluster-scoped, the same for every test)."""
    control_plane.kubectl("apply", "-f", str(DEVICECLASSES))


@pytest.fixture
def claim_controller(control_plane: ControlPlane) -> Iterator[None]:
    """kube-controller-manager's resourceclaim controller: makes the pods' claims from templates, frees them."""
    with control_plane.extra_controllers("resourceclaim-controller"):
        yield


@pytest.fixture
def dra_nodes(k8s: client.ApiClient, device_classes: None) -> Iterator[Callable[..., str]]:
    """Makes DRA-only nodes (driver slice, no device plugin, no GPUNode); removed after the test."""
    made: list[tuple[str, str]] = []
    custom = client.CustomObjectsApi(k8s)

    def make(
        gpus: list[DriverGpu] = FOUR,
        taints: dict[int, JSON] | None = None,
        mig: dict[int, list[tuple[str, int]]] | None = None,
    ) -> str:
        """A node; the GPUs at the positions ``mig`` names are in MIG mode, published as those instances."""
        name = unique_name("dra-node")
        node = create_gpu_node(k8s, name, gpus=0)
        body = driver_slice(name, node.metadata.uid, gpus)
        for i, taint in (taints or {}).items():
            body["spec"]["devices"][i]["taints"] = [taint]
        if mig:
            devices: list[JSON] = []
            for i, device in enumerate(body["spec"]["devices"]):
                devices.extend(mig_devices(gpus[i], mig[i]) if i in mig else [device])
            body["spec"]["devices"] = devices
        made.append((name, custom.create_cluster_custom_object(*DRA, "resourceslices", body)["metadata"]["name"]))
        return name

    yield make
    for name, slice_name in made:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*DRA, "resourceslices", slice_name)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(k8s).delete_node(name)


@pytest.fixture
def claims_released(k8s: client.ApiClient, namespace: str) -> Iterator[None]:
    """After the test, its claims' finalizers go, so the namespace can be deleted without the controller."""
    yield
    custom = client.CustomObjectsApi(k8s)
    for claim in custom.list_namespaced_custom_object(*DRA, namespace, "resourceclaims")["items"]:
        if claim["metadata"].get("finalizers"):
            with contextlib.suppress(client.ApiException):
                custom.patch_namespaced_custom_object(
                    *DRA, namespace, "resourceclaims", claim["metadata"]["name"], {"metadata": {"finalizers": None}}
                )
