"""The slice ConfigMap's name and contents, and the review's answers that need no cluster."""

from __future__ import annotations

import base64
import json

import pytest

from gpuwarden import contract
from scheduler.cluster.sliceconfig import SliceCompute, config_map_name, slice_environment
from scheduler.cluster.webhook.review import answer, review_pod
from scheduler.engine.model import Bind, Gpu, Node

NODE = Node(
    name="n", pool="default", cpu_milli=64000, memory_mib=512000, gpus=(Gpu(0, "GPU-a", 40960), Gpu(1, "GPU-b", 81920))
)


def test_a_long_pod_name_still_gives_a_valid_distinct_configmap_name() -> None:
    long_a, long_b = "a" * 250 + "x", "a" * 250 + "y"
    assert len(config_map_name(long_a)) <= 253 and config_map_name(long_a).endswith(contract.SLICE_CONFIGMAP_SUFFIX)
    assert config_map_name(long_a) != config_map_name(long_b)
    assert config_map_name("train-0") == "train-0" + contract.SLICE_CONFIGMAP_SUFFIX


def test_a_proportional_compute_share_follows_the_largest_memory_share() -> None:
    bind = Bind(job="j", namespace="ns", pod="p", uid="u", node="n", gpu_indices=(1, 0), gpu_memory_mib=(20480, 20480))
    env = slice_environment(bind, NODE, SliceCompute.PROPORTIONAL)
    assert env[contract.ENV_NVIDIA_VISIBLE_DEVICES] == "GPU-b,GPU-a"
    assert env[contract.ENV_CUDA_DEVICE_SM_LIMIT] == "50"  # half of the 40 GiB GPU
    assert env[contract.ENV_GPU_FRACTION] == "0.5"
    assert contract.ENV_CUDA_DEVICE_SM_LIMIT not in slice_environment(bind, NODE)


def test_a_bind_naming_a_gpu_the_node_lacks_has_no_environment() -> None:
    with pytest.raises(ValueError, match="has no GPU 7"):
        slice_environment(Bind("j", "ns", "p", "u", "n", gpu_indices=(7,), gpu_memory_mib=(1,)), NODE)


def test_updates_and_other_kinds_pass_unchanged_and_a_review_without_request_is_refused() -> None:
    review = {"request": {"uid": "1", "operation": "UPDATE", "kind": {"kind": "Pod"}, "object": {}}}
    reply = answer(json.dumps(review).encode(), largest_gpu_mib=None, runtime_class="nvidia")
    assert reply["response"] == {"uid": "1", "allowed": True}
    with pytest.raises(ValueError, match="not an AdmissionReview"):
        answer(b"{}", largest_gpu_mib=None, runtime_class=None)


def test_a_slice_pod_that_names_its_runtime_class_keeps_it() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {contract.ANNOTATION_GPU_MEMORY: "1024"}},
        "spec": {"schedulerName": "gpuwarden", "runtimeClassName": "mine", "containers": [{"name": "c"}]},
    }
    verdict = review_pod(pod, largest_gpu_mib=None, runtime_class="nvidia")
    assert verdict.allowed
    assert [op["path"] for op in verdict.patch] == ["/spec/containers/0/envFrom"]
    encoded = answer(
        json.dumps({"request": {"uid": "2", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": pod}}).encode(),
        largest_gpu_mib=None,
        runtime_class="nvidia",
    )["response"]["patch"]
    assert json.loads(base64.b64decode(encoded)) == list(verdict.patch)
