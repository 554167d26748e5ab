"""NVIDIA's DRA driver's objects, as the driver publishes them, for the device-taint tests.

Read from kubernetes-sigs/dra-driver-nvidia-gpu @ 95932046683719c43b6a0dd9613c2e5aad5d6703:

* ``dra/deviceclasses.yaml``: the DeviceClasses its Helm chart installs
  (``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml``,
  rendered for resource.k8s.io/v1; the header says how).
* :func:`driver_slice`: the ResourceSlice its kubelet plugin publishes
  (``cmd/gpu-kubelet-plugin/driver.go`` ``publishResources``: one slice, the
  pool named after the node; ``deviceinfo.go``: a device ``gpu-<minor>`` per
  GPU, named by the NVML minor number, with the attributes ``type``,
  ``uuid``, ``productName``, ``brand``, ``architecture``, the version
  attributes and ``resource.kubernetes.io/pciBusID``; ``partitions.go``:
  capacity ``memory`` in bytes; the vendored resourceslice controller:
  ``generateName`` ``<index>-<driver>-<node>-``, owned by the Node). The
  driver's default feature gates: no health taints.
* :func:`mig_devices`: a GPU in MIG mode with instances made beforehand
  (static MIG, the driver's default): ``nvlib.go``
  ``GetPerGpuAllocatableDevices`` publishes the instances and not the GPU
  itself; ``mig.go`` ``MigSpecTuple.ToCanonicalName`` names each
  ``gpu-<minor>-mig-<profile without dots>-<GPU instance profile ID>-<placement
  start>`` and ``CommonAttributesMig`` gives ``type: mig``, ``parentUUID``,
  ``profile`` and the parent's product, brand, architecture and versions;
  ``deviceinfo.go`` adds the instance's ``uuid``; its capacity is the
  profile's engines, multiprocessors and memory, plus one ``memorySlice<i>``
  per memory slice the placement covers. The A100-40GB figures are the
  driver's reference page's (``site/content/docs/reference/resourceslice-attributes.md``,
  1g.5gb) and, for 3g.20gb, NVIDIA's MIG user guide's A100 table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEVICECLASSES = Path(__file__).resolve().parent / "dra" / "deviceclasses.yaml"
DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class DriverGpu:
    """One GPU as NVML shows it: the agent's index, the device node's minor number, UUID and PCI address."""

    index: int
    minor: int
    uuid: str
    pci_bus: str  # NVML's form, 8-digit domain: 00000000:18:00.0


def driver_slice(node: str, node_uid: str, gpus: list[DriverGpu], generation: int = 1) -> dict[str, Any]:
    """The ResourceSlice the driver's kubelet plugin publishes for ``node`` (module docstring)."""
    devices = []
    for gpu in gpus:
        domain, bus, rest = gpu.pci_bus.split(":")
        devices.append(
            {
                "name": f"gpu-{gpu.minor}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": gpu.uuid},
                    "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": "Hopper"},
                    "cudaComputeCapability": {"version": "9.0.0"},
                    "driverVersion": {"version": "580.82.7"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                    # The kernel's form: a 4-digit domain.
                    "resource.kubernetes.io/pciBusID": {"string": f"{int(domain, 16):04x}:{bus}:{rest}".lower()},
                },
                "capacity": {"memory": {"value": "81559Mi"}},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"00000-{DRIVER}-{node}-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def gpunode_status(gpus: list[DriverGpu]) -> list[dict[str, Any]]:
    """``status.gpus`` of the node's GPUNode, as the agent publishes it (index, UUID, PCI address)."""
    return [
        {
            "index": g.index,
            "uuid": g.uuid,
            "pciBusId": g.pci_bus,
            "healthy": True,
            "memoryMiB": 81559,
            "migMode": "Disabled",
        }
        for g in gpus
    ]


# Two GPUs whose index and minor number differ, as on machines where NVML
# enumerates by PCI order and the device nodes were numbered otherwise.
GPUS = [
    DriverGpu(index=0, minor=1, uuid="GPU-4a1d3c2e-5b6f-7a8b-9c0d-1e2f3a4b5c6d", pci_bus="00000000:18:00.0"),
    DriverGpu(index=1, minor=0, uuid="GPU-7e8f9a0b-1c2d-3e4f-5a6b-7c8d9e0f1a2b", pci_bus="00000000:2A:00.0"),
]


# A100-40GB MIG profiles: GPU instance profile ID, memory slices, and the capacity the driver publishes.
A100_MIG_PROFILES: dict[str, tuple[int, int, dict[str, str]]] = {
    "1g.5gb": (
        19,
        1,
        {
            "copyEngines": "1",
            "decoders": "0",
            "encoders": "0",
            "jpegEngines": "0",
            "ofaEngines": "0",
            "multiprocessors": "14",
            "memory": "4864Mi",
        },
    ),
    "3g.20gb": (
        9,
        4,
        {
            "copyEngines": "3",
            "decoders": "2",
            "encoders": "0",
            "jpegEngines": "0",
            "ofaEngines": "0",
            "multiprocessors": "42",
            "memory": "19968Mi",
        },
    ),
}
A100_PRODUCT = "NVIDIA A100-PCIE-40GB"


def mig_devices(gpu: DriverGpu, layout: list[tuple[str, int]], serial: int = 0) -> list[dict[str, Any]]:
    """The devices of ``gpu`` in MIG mode with instances (profile, placement start), as the driver publishes them."""
    domain, bus, rest = gpu.pci_bus.split(":")
    out = []
    for k, (profile, start) in enumerate(layout):
        gi, slices, capacity = A100_MIG_PROFILES[profile]
        caps: dict[str, Any] = {name: {"value": value} for name, value in capacity.items()}
        for i in range(start, start + slices):
            caps[f"memorySlice{i}"] = {"value": "1"}
        out.append(
            {
                "name": f"gpu-{gpu.minor}-mig-{profile.replace('.', '')}-{gi}-{start}",
                "attributes": {
                    "type": {"string": "mig"},
                    "uuid": {"string": f"MIG-{serial:04x}{gpu.minor:04x}-{k:04x}-5e6f-7a8b-9c0d1e2f3a4b"},
                    "parentUUID": {"string": gpu.uuid},
                    "profile": {"string": profile},
                    "productName": {"string": A100_PRODUCT},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": "Ampere"},
                    "cudaComputeCapability": {"version": "8.0.0"},
                    "driverVersion": {"version": "580.126.20"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                    "resource.kubernetes.io/pciBusID": {"string": f"{int(domain, 16):04x}:{bus}:{rest}".lower()},
                },
                "capacity": caps,
            }
        )
    return out
