"""``why``'s ResourceClaims: the devices allocated and every taint on them, the driver's and the rules'."""

from __future__ import annotations

from typing import Any

from gpuwarden.kubectl_plugin.views import DraObjects, claim_views, pod_claim_names
from tests.scheduler.remediation.dra_objects import GPUS, driver_slice


def test_a_claims_devices_show_the_drivers_taint_and_each_rules() -> None:
    raw = driver_slice("n", "uid", GPUS)
    raw["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    rule = {
        "metadata": {"name": "gpuwarden-quarantine-n.gpu-0"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"},
            "taint": {"key": "gpuwarden.io/quarantined", "value": "xid-79", "effect": "NoSchedule"},
        },
    }
    allocated: dict[str, Any] = {
        "metadata": {"namespace": "team", "name": "job-0-gpu-x7"},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}
            }
        },
    }
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                {"name": "later", "resourceClaimTemplateName": "one-gpu"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "job-0-gpu-x7"}]},
    }
    assert pod_claim_names(pod) == [("gpu", "job-0-gpu-x7"), ("later", "")]
    objects = DraObjects.read([raw], [rule], [allocated])
    shown = claim_views(pod, {"job-0-gpu-x7": allocated}, objects)
    assert [(c.name, c.claim, c.allocated) for c in shown] == [("gpu", "job-0-gpu-x7", True), ("later", "", False)]
    assert shown[0].devices == [
        "gpu.nvidia.com/n/gpu-0 [gpuwarden.io/quarantined=xid-79:NoSchedule (rule gpuwarden-quarantine-n.gpu-0)]"
    ]
    # The device views agree: gpu-0 held by the claim, gpu-1 tainted by the driver.
    devices = {d.name: d for d in objects.device_views("n") or []}
    assert devices["gpu-0"].claims == ["team/job-0-gpu-x7"]
    assert devices["gpu-1"].taints == ["gpu.nvidia.com/xid=79:NoSchedule"]


def test_the_claim_made_for_a_pod_s_nvidia_gpu_is_shown_with_its_claims() -> None:
    pod = {
        "spec": {"resourceClaims": []},
        "status": {
            "extendedResourceClaimStatus": {
                "resourceClaimName": "train-0-extended-resources-k2x9",
                "requestMappings": [
                    {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-2"}
                ],
            }
        },
    }
    assert pod_claim_names(pod) == [("(extended resources)", "train-0-extended-resources-k2x9")]
