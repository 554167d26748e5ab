"""GPU slices held on the node: the admission webhook and the slice ConfigMap, against the real API server.

The API server calls the webhook on 127.0.0.1 over HTTPS and trusts it
through the ``caBundle`` the webhook's own bootstrap wrote, exactly as in a
cluster; the configuration is the shipped one (rules, matchConditions,
failurePolicy), with only its client config pointed at the test's port and
its namespaceSelector at the test's namespace, so that other tests' pods
never meet it. Cycles run as in test_cycle_k8s, with the binder's slice step.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.assumed import AssumedBinds
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import CycleResult, SchedulingCycle
from scheduler.cluster.sliceconfig import SliceConfigWriter, config_map_name
from scheduler.cluster.webhook.app import Webhook, WebhookSettings
from scheduler.cluster.webhook.certs import CertSettings
from scheduler.cluster.webhook.review import sharing_annotations_expression
from tests.harness import free_ports, unique_name, wait_for
from tests.scheduler.cluster.kube_objects import pod, podgroup
from tests.scheduler.cluster.test_cycle_k8s import NO_WAIT, view

pytestmark = pytest.mark.k8s

WEBHOOK_MANIFEST = Path(__file__).resolve().parents[3] / "manifests" / "scheduler" / "webhook.yaml"
GPU_MIB = 81559  # what the agent's test reports publish per GPU
TEST_LABEL = "gpuwarden-webhook-test"


def shipped_configuration() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(WEBHOOK_MANIFEST.read_text()) if d]
    config: dict[str, Any] = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    return config


class Harness:
    """One webhook replica serving one test namespace, and the helpers the tests share."""

    def __init__(self, k8s: client.ApiClient, namespace: str, runtime_class: str) -> None:
        self.k8s = k8s
        self.namespace = namespace
        self.runtime_class = runtime_class
        self.config_name = unique_name("gpuwarden-webhook-test")
        self.secret = unique_name("webhook-tls")
        (self.port,) = free_ports(1)
        self.now = dt.datetime.now(dt.UTC)
        self.webhook: Webhook | None = None
        self.probe_reviews = 0

    def clock(self) -> dt.datetime:
        return self.now

    def create_configuration(self) -> None:
        config = shipped_configuration()
        config["metadata"] = {"name": self.config_name}
        (hook,) = config["webhooks"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.port}/mutate"}
        hook["namespaceSelector"] = {"matchLabels": {TEST_LABEL: self.namespace}}
        client.AdmissionregistrationV1Api(self.k8s).create_mutating_webhook_configuration(config)

    def start(self, **cert_overrides: Any) -> Webhook:
        settings = WebhookSettings(
            host="127.0.0.1",
            port=self.port,
            runtime_class=self.runtime_class,
            inventory_refresh_s=0.2,
            certs=CertSettings(
                namespace=self.namespace,
                secret=self.secret,
                webhook_config=self.config_name,
                hosts=("127.0.0.1", "localhost"),
                check_s=3600.0,
                clock=self.clock,
                **cert_overrides,
            ),
        )
        webhook = self.webhook = Webhook(self.k8s, settings).start()
        wait_for(webhook.inventory.synced, timeout=30, description="webhook inventory synced")
        webhook.inventory.refresh()
        # The API server learns the caBundle from its own watch: wait until it trusts the webhook.
        probe = client.V1Pod(
            metadata=client.V1ObjectMeta(name="probe", annotations={contract.ANNOTATION_GPU_FRACTION: "0.5"}),
            spec=client.V1PodSpec(
                scheduler_name=contract.SCHEDULER_NAME,
                containers=[client.V1Container(name="main", image="registry.invalid/x:1")],
            ),
        )
        core = client.CoreV1Api(self.k8s)
        wait_for(
            lambda: core.create_namespaced_pod(self.namespace, probe, dry_run="All").spec.runtime_class_name,
            timeout=30,
            ignore=(client.ApiException,),
            description="the API server trusts the webhook",
        )
        self.probe_reviews = webhook.server.reviews
        return webhook

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None


@pytest.fixture
def harness(k8s: client.ApiClient, namespace: str) -> Iterator[Harness]:
    core = client.CoreV1Api(k8s)
    core.patch_namespace(namespace, {"metadata": {"labels": {TEST_LABEL: namespace}}})
    node = client.NodeV1Api(k8s)
    runtime_class = unique_name("hami")
    node.create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime_class}, "handler": "hami"}
    )
    h = Harness(k8s, namespace, runtime_class)
    h.create_configuration()
    try:
        h.start()
        yield h
    finally:
        h.stop()
        with contextlib.suppress(client.ApiException):
            client.AdmissionregistrationV1Api(k8s).delete_mutating_webhook_configuration(h.config_name)
        with contextlib.suppress(client.ApiException):
            node.delete_runtime_class(runtime_class)


def slice_pod(
    k8s: client.ApiClient, namespace: str, name: str, annotations: dict[str, str], **extra: Any
) -> client.V1Pod:
    return pod(k8s, namespace, name, gpus=0, annotations=annotations, **extra)


def config_map(k8s: client.ApiClient, namespace: str, pod_name: str) -> dict[str, Any]:
    raw = client.CoreV1Api(k8s).read_namespaced_config_map(config_map_name(pod_name), namespace, _preload_content=False)
    data: dict[str, Any] = json.loads(raw.data)
    return data


def slice_cycle(k8s: client.ApiClient, *, binds_in_background: bool = False) -> SchedulingCycle:
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    binder = Binder(api, retry=NO_WAIT, prebind=SliceConfigWriter(api))
    return SchedulingCycle(api, binder=binder, binds_in_background=binds_in_background)


def assignment(k8s: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    p = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    data: dict[str, Any] = json.loads(p.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT])
    return data


def test_four_quarter_slices_share_one_gpu_and_each_gets_its_configmap(
    k8s: client.ApiClient, harness: Harness, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    ns = harness.namespace
    names = [f"quarter-{i}" for i in range(4)]
    for name in names:
        created = slice_pod(k8s, ns, name, {contract.ANNOTATION_GPU_FRACTION: "0.25"}, queue=q)
        # The webhook injected the ConfigMap (required) into the container, and the runtime class.
        (container,) = created.spec.containers
        (source,) = container.env_from
        assert source.config_map_ref.name == config_map_name(name)
        assert source.config_map_ref.optional is False
        assert created.spec.runtime_class_name == harness.runtime_class

    result = slice_cycle(k8s).run(view(k8s, nodes))
    assert sorted(r.outcome.value for r in result.binds) == ["Bound"] * 4
    placed = [assignment(k8s, ns, name)["gpus"] for name in names]
    assert all(len(gpus) == 1 for gpus in placed)
    assert len({gpus[0]["uuid"] for gpus in placed}) == 1, "four quarters fill one GPU"
    for name, gpus in zip(names, placed, strict=True):
        cm = config_map(k8s, ns, name)
        assert cm["data"] == {
            contract.ENV_NVIDIA_VISIBLE_DEVICES: gpus[0]["uuid"],
            contract.ENV_CUDA_DEVICE_MEMORY_LIMIT: f"{GPU_MIB // 4}m",
            contract.ENV_GPU_FRACTION: "0.25",
        }
        owner = client.CoreV1Api(k8s).read_namespaced_pod(name, ns).metadata.uid
        assert [(o["kind"], o["name"], o["uid"]) for o in cm["metadata"]["ownerReferences"]] == [("Pod", name, owner)]


def test_a_multi_device_slice_gets_one_limit_per_device_and_a_job_pod_its_name(
    k8s: client.ApiClient, harness: Harness, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    ns = harness.namespace
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            generate_name="train-",
            labels={contract.LABEL_QUEUE: q},
            annotations={contract.ANNOTATION_GPU_MEMORY: "20000", contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: "2"},
        ),
        spec=client.V1PodSpec(
            scheduler_name=contract.SCHEDULER_NAME,
            init_containers=[client.V1Container(name="fetch", image="registry.invalid/fetch:1")],
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/train:1",
                    env_from=[client.V1EnvFromSource(config_map_ref=client.V1ConfigMapEnvSource(name="settings"))],
                )
            ],
        ),
    )
    created = client.CoreV1Api(k8s).create_namespaced_pod(ns, body)
    # generateName: the webhook named the pod, so its ConfigMap's name is known at admission.
    name = created.metadata.name
    assert name.startswith("train-") and len(name) == len("train-") + 5
    ref = config_map_name(name)
    assert [s.config_map_ref.name for s in created.spec.init_containers[0].env_from] == [ref]
    assert [s.config_map_ref.name for s in created.spec.containers[0].env_from] == ["settings", ref]

    result = slice_cycle(k8s).run(view(k8s, nodes))
    assert [r.outcome.value for r in result.binds] == ["Bound"]
    gpus = assignment(k8s, ns, name)["gpus"]
    assert len(gpus) == 2
    data = config_map(k8s, ns, name)["data"]
    assert data == {
        contract.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(g["uuid"] for g in gpus),
        f"{contract.ENV_CUDA_DEVICE_MEMORY_LIMIT}_0": "20000m",
        f"{contract.ENV_CUDA_DEVICE_MEMORY_LIMIT}_1": "20000m",
        contract.ENV_GPU_FRACTION: f"{20000 / GPU_MIB:.4g}",
    }


BAD = [
    ({contract.ANNOTATION_GPU_FRACTION: "0"}, 0, "must be above 0 and at most 1"),
    ({contract.ANNOTATION_GPU_FRACTION: "1.5"}, 0, "must be above 0 and at most 1"),
    ({contract.ANNOTATION_KAI_GPU_FRACTION: "-0.5"}, 0, "annotation gpu-fraction='-0.5' must be above 0"),
    ({contract.ANNOTATION_GPU_FRACTION: "half"}, 0, "is not a number"),
    ({contract.ANNOTATION_GPU_FRACTION: "0.5"}, 1, "whole GPUs (nvidia.com/gpu) and a GPU slice at once"),
    (
        {contract.ANNOTATION_GPU_FRACTION: "0.5", contract.ANNOTATION_GPU_MEMORY: "1024"},
        0,
        "annotations gpuwarden.io/gpu-fraction and gpuwarden.io/gpu-memory both set; choose one",
    ),
    ({contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: "2"}, 0, "needs a GPU fraction or GPU memory annotation"),
    (
        {contract.ANNOTATION_GPU_MEMORY: str(10 * GPU_MIB)},
        0,
        "is larger than the largest GPU in the cluster",
    ),
    # Bounded by the contract whatever the cluster holds.
    ({contract.ANNOTATION_GPU_FRACTION: "1e-300"}, 0, "must be a plain decimal such as 0.25"),
    ({contract.ANNOTATION_GPU_FRACTION: "0." + "3" * 4998}, 0, "(5000 characters) must be a plain decimal"),
    ({contract.ANNOTATION_GPU_MEMORY: "99999999999"}, 0, "is more than any GPU holds (at most 1048576 MiB)"),
    (
        {contract.ANNOTATION_GPU_MEMORY: "1024", contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: "1000"},
        0,
        "must be at least 1 and at most 64",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[m for _a, _g, m in BAD])
def test_bad_gpu_sharing_requests_are_refused_with_what_is_wrong_and_what_is_allowed(
    k8s: client.ApiClient,
    harness: Harness,
    cluster: Callable[[int], list[str]],
    case: tuple[dict[str, str], int, str],
) -> None:
    annotations, gpus, message = case
    cluster(1)  # a GPU node, so the largest GPU is known
    wait_for(lambda: harness.webhook.inventory.refresh() if harness.webhook else None, description="largest GPU")
    with pytest.raises(client.ApiException) as refused:
        pod(k8s, harness.namespace, unique_name("bad"), gpus=gpus, annotations=annotations)
    assert refused.value.status == 403
    text = json.loads(refused.value.body)["message"]
    assert message in text
    assert "allowed: gpuwarden.io/gpu-fraction above 0 and at most 1" in text
    if "largest GPU" in message:
        assert f"ask for at most {GPU_MIB} MiB" in text


def test_a_container_that_sets_the_slice_variables_is_refused(k8s: client.ApiClient, harness: Harness) -> None:
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name="escape", annotations={contract.ANNOTATION_GPU_FRACTION: "0.5"}),
        spec=client.V1PodSpec(
            scheduler_name=contract.SCHEDULER_NAME,
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/train:1",
                    env=[client.V1EnvVar(name=contract.ENV_NVIDIA_VISIBLE_DEVICES, value="all")],
                )
            ],
        ),
    )
    with pytest.raises(client.ApiException) as refused:
        client.CoreV1Api(k8s).create_namespaced_pod(harness.namespace, body)
    assert "sets NVIDIA_VISIBLE_DEVICES, which the scheduler sets for a GPU slice" in refused.value.body


def test_pods_of_other_schedulers_and_whole_gpu_pods_pass_untouched(k8s: client.ApiClient, harness: Harness) -> None:
    ns = harness.namespace
    other = client.V1Pod(
        metadata=client.V1ObjectMeta(name="kai-pod", annotations={contract.ANNOTATION_KAI_GPU_FRACTION: "7"}),
        spec=client.V1PodSpec(
            scheduler_name="kai-scheduler", containers=[client.V1Container(name="main", image="registry.invalid/x:1")]
        ),
    )
    created = client.CoreV1Api(k8s).create_namespaced_pod(ns, other)
    assert created.spec.containers[0].env_from is None and created.spec.runtime_class_name is None
    whole = pod(k8s, ns, "whole", gpus=2)
    assert whole.spec.containers[0].env_from is None and whole.spec.runtime_class_name is None
    assert harness.webhook is not None and harness.webhook.server.reviews == harness.probe_reviews


def test_webhook_down_with_failure_policy_fail_refuses_slice_pods_and_lets_others_through(
    k8s: client.ApiClient, harness: Harness
) -> None:
    ns = harness.namespace
    assert shipped_configuration()["webhooks"][0]["failurePolicy"] == "Fail"
    harness.stop()
    with pytest.raises(client.ApiException) as refused:
        slice_pod(k8s, ns, "slice-while-down", {contract.ANNOTATION_GPU_FRACTION: "0.5"})
    assert "failed calling webhook" in refused.value.body
    # Sent nowhere (matchConditions): a whole-GPU pod, a CPU pod, another scheduler's slice.
    pod(k8s, ns, "whole-while-down", gpus=1)
    pod(k8s, ns, "cpu-while-down", gpus=0)
    other = client.V1Pod(
        metadata=client.V1ObjectMeta(name="other-while-down", annotations={contract.ANNOTATION_GPU_FRACTION: "0.5"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="registry.invalid/x:1")]),
    )
    client.CoreV1Api(k8s).create_namespaced_pod(ns, other)
    # Back up: slice pods are admitted again.
    harness.start()
    assert slice_pod(k8s, ns, "slice-after", {contract.ANNOTATION_GPU_FRACTION: "0.5"}).spec.runtime_class_name


def test_a_pod_whose_configmap_cannot_be_written_is_not_bound_is_explained_and_retried(
    k8s: client.ApiClient, harness: Harness, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    ns = harness.namespace
    core = client.CoreV1Api(k8s)
    slice_pod(k8s, ns, "blocked", {contract.ANNOTATION_GPU_FRACTION: "0.5"}, queue=q)
    # Someone else's ConfigMap under the slice's name: the scheduler must not overwrite it.
    core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=config_map_name("blocked")), data={"mine": "yes"})
    )
    cycle = slice_cycle(k8s)
    (result,) = cycle.run(view(k8s, nodes)).binds
    assert result.outcome.value == "Failed" and "exists and is not this pod's" in (result.error or "")
    assert core.read_namespaced_pod("blocked", ns).spec.node_name is None
    assert core.read_namespaced_config_map(config_map_name("blocked"), ns).data == {"mine": "yes"}
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=blocked").items
    assert [e.reason for e in events] == ["SliceConfigFailed"]
    assert "not bound to" in events[0].message and "placed again next cycle" in events[0].message

    core.delete_namespaced_config_map(config_map_name("blocked"), ns)
    (retried,) = cycle.run(view(k8s, nodes)).binds
    assert retried.ok
    assert core.read_namespaced_pod("blocked", ns).spec.node_name in nodes
    assert config_map(k8s, ns, "blocked")["data"][contract.ENV_CUDA_DEVICE_MEMORY_LIMIT] == f"{GPU_MIB // 2}m"


def test_a_slice_bind_sent_in_the_background_that_fails_shows_its_pod_pending_again_and_it_is_retried(
    k8s: client.ApiClient, harness: Harness, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """As the runner drives the cycle: binds sent, assumed, and forgotten when their answer says they failed.

    Of a cycle's binds the first is prepared and written from the cycle's
    thread and the others from the pool; two pods make both kinds, and
    every answer comes to a later cycle.
    """
    nodes = set(cluster(1))
    q = queue(8)
    ns = harness.namespace
    core = client.CoreV1Api(k8s)
    pods = ("blocked-a", "blocked-b")
    for name in pods:
        slice_pod(k8s, ns, name, {contract.ANNOTATION_GPU_FRACTION: "0.5"}, queue=q)
        meta = client.V1ObjectMeta(name=config_map_name(name))
        core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=meta, data={}))
    cycle = slice_cycle(k8s, binds_in_background=True)
    assert cycle.inflight is not None
    inflight = cycle.inflight
    assumed = AssumedBinds()

    def turn() -> CycleResult:
        wait_for(lambda: len(inflight) == 0, description="the binds sent answered")
        result = cycle.run(assumed.overlay(view(k8s, nodes)))
        assumed.record(result)
        return result

    try:
        first = turn()
        assert first.binds == ()
        assert {b.pod for b in first.sent} == set(pods)
        # The next cycle takes the answers; the pods sent were still shown bound to it, so none is placed.
        second = turn()
        assert second.sent == ()
        assert {(r.bind.pod, r.outcome.value) for r in second.binds} == {(pod, "Failed") for pod in pods}
        assert all("remove or rename it" in str(r.error) for r in second.binds)
        # Forgotten: the cycle after places them again.
        third = turn()
        assert {b.pod for b in third.sent} == set(pods)
        for name in pods:
            core.delete_namespaced_config_map(config_map_name(name), ns)
        for _ in range(4):
            turn()
    finally:
        cycle.close()
    for name in pods:
        assert core.read_namespaced_pod(name, ns).spec.node_name in nodes
        assert config_map(k8s, ns, name)["data"][contract.ENV_CUDA_DEVICE_MEMORY_LIMIT] == f"{GPU_MIB // 2}m"


def test_the_bootstrap_rotates_serving_certificate_and_ca_before_expiry_without_a_refused_call(
    k8s: client.ApiClient, harness: Harness
) -> None:
    """The bootstrap's clock moves; what it serves must stay valid in real time, as the API server checks it.

    A fresh replica starts two hours in the past with a serving certificate
    of three hours and a CA of four (each back-dated an hour), so every
    certificate it issues along the way is valid now.
    """
    ns = harness.namespace
    harness.stop()
    real = harness.now
    harness.now = real - dt.timedelta(hours=2)
    harness.secret = unique_name("webhook-tls")
    webhook = harness.start(serving_validity=dt.timedelta(hours=3), ca_validity=dt.timedelta(hours=4))
    assert webhook.certs is not None
    admission = client.AdmissionregistrationV1Api(k8s)

    def bundle() -> bytes:
        config = admission.read_mutating_webhook_configuration(harness.config_name)
        return base64.b64decode(config.webhooks[0].client_config.ca_bundle)

    def admitted(name: str) -> None:
        created = slice_pod(k8s, ns, name, {contract.ANNOTATION_GPU_FRACTION: "0.5"})
        assert created.spec.containers[0].env_from

    def served() -> bytes:
        """What a new connection is handed, verified against the bundle as the API server does."""
        context = ssl.create_default_context(cadata=bundle().decode())
        with (
            socket.create_connection(("127.0.0.1", harness.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return ssl.DER_cert_to_PEM_cert(der).encode()

    def same(pem_a: bytes, pem_b: bytes) -> bool:
        return ssl.PEM_cert_to_DER_cert(pem_a.decode()) == ssl.PEM_cert_to_DER_cert(pem_b.decode())

    admitted("before")
    first_cert = Path(webhook.certs.cert_file).read_bytes()
    first_bundle = bundle()
    assert first_bundle.count(b"BEGIN CERTIFICATE") == 1

    # Now: past two thirds of the serving certificate's life, not of the CA's.
    harness.now = real
    webhook.certs.ensure()
    assert Path(webhook.certs.cert_file).read_bytes() != first_cert
    assert bundle() == first_bundle
    admitted("renewed")
    assert same(served(), Path(webhook.certs.cert_file).read_bytes())

    # Half an hour on the CA is due. First the new CA joins the bundle (the
    # old one stays) and the served certificate is still the old CA's.
    harness.now = real + dt.timedelta(minutes=30)
    before_new_ca = Path(webhook.certs.cert_file).read_bytes()
    webhook.certs.ensure()
    assert bundle().count(b"BEGIN CERTIFICATE") == 2 and bundle().endswith(first_bundle)
    assert same(Path(webhook.certs.cert_file).read_bytes(), before_new_ca)
    admitted("two-cas")
    # The next check signs the serving certificate with the new CA.
    webhook.certs.ensure()
    assert not same(Path(webhook.certs.cert_file).read_bytes(), before_new_ca)
    assert same(served(), Path(webhook.certs.cert_file).read_bytes())
    admitted("new-ca")
    # Once the old CA has expired it leaves the bundle.
    harness.now = real + dt.timedelta(hours=2, minutes=1)
    webhook.certs.ensure()
    assert bundle().count(b"BEGIN CERTIFICATE") == 1 and not bundle().endswith(first_bundle)
    admitted("old-ca-gone")
    assert same(served(), Path(webhook.certs.cert_file).read_bytes())
    # Stopped, the replica leaves no private key behind in the directory it made for them.
    served_dir = Path(webhook.certs.key_file).parent
    harness.stop()
    assert not served_dir.exists()


def test_the_shipped_match_condition_is_the_handlers_own() -> None:
    (hook,) = shipped_configuration()["webhooks"]
    assert hook["matchConditions"][0]["expression"] == sharing_annotations_expression()


def test_a_second_replica_serves_the_same_certificate_from_the_shared_secret(
    k8s: client.ApiClient, harness: Harness
) -> None:
    first = harness.webhook
    assert first is not None and first.certs is not None
    second = Harness(k8s, harness.namespace, harness.runtime_class)
    second.config_name, second.secret = harness.config_name, harness.secret
    replica = second.start()
    try:
        assert replica.certs is not None
        assert Path(replica.certs.cert_file).read_bytes() == Path(first.certs.cert_file).read_bytes()
        assert replica.certs.bundle_pem == first.certs.bundle_pem
    finally:
        second.stop()


# -- slice pods the webhook never saw ------------------------------------------

POLICY_MANIFEST = WEBHOOK_MANIFEST.parent / "gpu-sharing-policy.yaml"


def refused_condition(k8s: client.ApiClient, namespace: str, group: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL, group
    )
    (condition,) = (obj.get("status") or {}).get("conditions") or [{}]
    return dict(condition)


def pod_events(k8s: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    events: list[client.CoreV1Event] = (
        client.CoreV1Api(k8s)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=Pod")
        .items
    )
    return events


def assert_refused_and_explained(k8s: client.ApiClient, cycle: SchedulingCycle, nodes: set[str], ns: str) -> str:
    """Two cycles: nothing bound, no ConfigMap, the group and the pod say why (the pod once); the reason."""
    for _ in range(2):
        result = cycle.run(view(k8s, nodes))
        assert result.binds == ()
    core = client.CoreV1Api(k8s)
    assert core.read_namespaced_pod("late", ns).spec.node_name is None
    with pytest.raises(client.ApiException) as missing:
        core.read_namespaced_config_map(config_map_name("late"), ns)
    assert missing.value.status == 404
    condition = refused_condition(k8s, ns, "late")
    assert (condition["type"], condition["status"]) == ("Unschedulable", "True")
    assert condition["reason"] == "SliceNotAdmitted"
    (event,) = pod_events(k8s, ns, "late")
    assert (event.type, event.reason, event.count) == ("Warning", "SliceNotAdmitted", 1)
    assert event.message.startswith("not scheduled: it would not obey its GPU slice and see whole GPUs")
    message: str = condition["message"]
    assert message.startswith("pod late is not placed: it would not obey its GPU slice")
    assert "delete the pod and create it again" in message
    return message


def test_a_pod_annotated_as_a_slice_after_creation_is_never_bound_and_says_how_to_fix_it(
    k8s: client.ApiClient, harness: Harness, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    ns = harness.namespace
    podgroup(k8s, ns, "late", q, 1)
    created = pod(k8s, ns, "late", group="late", gpus=0)
    assert created.spec.containers[0].env_from is None  # no sharing annotation: the webhook was not asked
    # An update never reaches the webhook (in a cluster without the shipped policy it is let through).
    client.CoreV1Api(k8s).patch_namespaced_pod(
        "late", ns, {"metadata": {"annotations": {contract.ANNOTATION_GPU_FRACTION: "0.5"}}}
    )
    message = assert_refused_and_explained(k8s, slice_cycle(k8s), nodes, ns)
    assert f"container 'main' has no envFrom of its slice ConfigMap {config_map_name('late')}" in message
    assert f"the pod has no runtimeClassName (the webhook sets {contract.SLICE_RUNTIME_CLASS}" in message


def test_a_slice_pod_in_a_namespace_the_webhook_excludes_is_never_bound(
    k8s: client.ApiClient, harness: Harness, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """kube-system, as the shipped namespaceSelector leaves it out: created as a slice, admitted untouched."""
    nodes = set(cluster(1))
    q = queue(8)
    ns = "kube-system"
    (hook,) = shipped_configuration()["webhooks"]
    assert ns in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    podgroup(k8s, ns, "late", q, 1)
    try:
        created = pod(k8s, ns, "late", group="late", gpus=0, annotations={contract.ANNOTATION_GPU_FRACTION: "0.5"})
        assert created.spec.containers[0].env_from is None and created.spec.runtime_class_name is None
        message = assert_refused_and_explained(k8s, slice_cycle(k8s), nodes, ns)
        assert "kube-system and gpuwarden are excluded and cannot run GPU slices" in message
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod("late", ns, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, ns, contract.PODGROUP_PLURAL, "late"
            )
        core.delete_collection_namespaced_event(ns, field_selector="involvedObject.name=late")


@pytest.fixture
def sharing_policy(k8s: client.ApiClient, harness: Harness) -> Iterator[str]:
    """The shipped policy, bound (Deny) to the test's namespace and kube-system only; named for this test."""
    docs = [d for d in yaml.safe_load_all(POLICY_MANIFEST.read_text()) if d]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    name = unique_name("gpu-sharing-fixed")
    policy["metadata"] = {"name": name}
    binding["metadata"] = {"name": name}
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [harness.namespace, "kube-system"]}
            ]
        }
    }
    admission = client.AdmissionregistrationV1Api(k8s)
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            admission.delete_validating_admission_policy_binding(name)
        with contextlib.suppress(client.ApiException):
            admission.delete_validating_admission_policy(name)


def annotate(k8s: client.ApiClient, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
    client.CoreV1Api(k8s).patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


def refused_update(k8s: client.ApiClient, namespace: str, name: str, annotations: dict[str, str | None]) -> str:
    with pytest.raises(client.ApiException) as refused:
        annotate(k8s, namespace, name, annotations)
    assert refused.value.status == 403
    message: str = json.loads(refused.value.body)["message"]
    return message


def test_updates_that_change_sharing_annotations_are_refused_and_every_other_update_passes(
    k8s: client.ApiClient,
    harness: Harness,
    sharing_policy: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    ns = harness.namespace
    core = client.CoreV1Api(k8s)
    whole = pod(k8s, ns, "whole", gpus=1)

    # The policy is served once the API server's informers have it.
    def enforced() -> bool:
        try:
            core.patch_namespaced_pod(
                "whole", ns, {"metadata": {"annotations": {contract.ANNOTATION_GPU_FRACTION: "0.5"}}}, dry_run="All"
            )
        except client.ApiException as err:
            return err.status == 403 and "fixed when it is created" in json.loads(err.body)["message"]
        return False

    wait_for(enforced, timeout=30, description="the API server enforces the policy")
    assert whole.metadata.annotations is None

    admitted = slice_pod(k8s, ns, "slice", {contract.ANNOTATION_GPU_FRACTION: "0.5"}, queue=q)
    assert admitted.spec.containers[0].env_from
    changed = refused_update(k8s, ns, "slice", {contract.ANNOTATION_GPU_FRACTION: "0.25"})
    assert "(this update changes gpuwarden.io/gpu-fraction)" in changed
    assert "delete the pod and create it with the annotations it needs" in changed
    assert "gpuwarden.io/gpu-fraction" in refused_update(k8s, ns, "slice", {contract.ANNOTATION_GPU_FRACTION: None})
    kai = refused_update(k8s, ns, "whole", {contract.ANNOTATION_KAI_GPU_MEMORY: "1024", "note": "x"})
    assert "(this update changes gpu-memory)" in kai
    for key in (contract.ANNOTATION_GPU_MEMORY, contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES):
        assert key in refused_update(k8s, ns, "whole", {key: "2"})

    # Everything else passes, without a round trip to the webhook: it is stopped.
    reviews = harness.webhook.server.reviews if harness.webhook else 0
    harness.stop()
    annotate(k8s, ns, "slice", {"note": "kept", contract.ANNOTATION_GPU_FRACTION: "0.5"})
    core.patch_namespaced_pod("slice", ns, {"metadata": {"labels": {"team": "a"}}})
    other = client.V1Pod(
        metadata=client.V1ObjectMeta(name="kai", annotations={contract.ANNOTATION_KAI_GPU_FRACTION: "0.5"}),
        spec=client.V1PodSpec(
            scheduler_name="kai-scheduler", containers=[client.V1Container(name="main", image="registry.invalid/x:1")]
        ),
    )
    core.create_namespaced_pod(ns, other)
    annotate(k8s, ns, "kai", {contract.ANNOTATION_KAI_GPU_FRACTION: "0.25"})  # another scheduler's pod
    # The scheduler's own writes to the pod (its GPU assignment, the bind) pass too.
    (bound,) = slice_cycle(k8s).run(view(k8s, nodes)).binds
    assert bound.ok and core.read_namespaced_pod("slice", ns).spec.node_name in nodes
    assert reviews == harness.probe_reviews + 1  # the slice pod's creation, and no update

    # Namespaces the webhook excludes are covered too.
    system = unique_name("late")
    pod(k8s, "kube-system", system, gpus=0)
    try:
        assert "gpuwarden.io/gpu-fraction" in refused_update(
            k8s, "kube-system", system, {contract.ANNOTATION_GPU_FRACTION: "0.5"}
        )
    finally:
        core.delete_namespaced_pod(system, "kube-system", grace_period_seconds=0)
