"""``gpuwarden demo`` end to end, shortened: real effects read back from its API server while it runs.

The demo starts its own control plane, so the test runs it as a process
(``python -m demo``, the same command ``gpuwarden demo`` runs) with few
nodes, a short duration and plain output, reads the kubeconfig path it
prints, and watches the cluster through it as a person with kubectl would:
the faulty nodes' conditions, their pods evicted and their jobs placed
again, a GPU quarantined and returned after the agent's reset and
validation, a node returned after people cleared its escalation, and every
queue within one GPU of its fair share at the end. Afterwards nothing the
demo started may still run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from demo.scenario import load_scenario
from gpuwarden import contract
from tests.harness import RUN_DIR_PREFIX

ROOT = Path(__file__).resolve().parents[2]
NODES = 6
DURATION_S = 150

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(DURATION_S + 240)]


@dataclass
class Seen:
    """What the test read from the demo's API server while it ran."""

    conditions: dict[str, set[str]] = field(default_factory=dict)  # node -> condition types seen True
    on_faulty: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # pod uid -> (job, node, phase)
    placements: list[tuple[str, str, str]] = field(default_factory=list)  # (job, node, uid) of running pods
    present: set[str] = field(default_factory=set)  # uids of the demo's pods in the latest read
    node_events: list[tuple[str, str]] = field(default_factory=list)  # (node, reason)
    slices_run: set[str] = field(default_factory=set)  # uids of GPU-slice pods seen running
    queues: list[dict[str, Any]] = field(default_factory=list)
    reads: int = 0


def _watch(api: client.ApiClient, faulty: set[str], seen: Seen, stop: threading.Event) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    while not stop.is_set():
        try:
            for node in core.list_node().items:
                true = {c.type for c in node.status.conditions or [] if c.status == "True"}
                seen.conditions.setdefault(node.metadata.name, set()).update(true)
            pods = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/part-of=gpuwarden-demo").items
            seen.present = {p.metadata.uid for p in pods}
            for pod in pods:
                job = (pod.metadata.labels or {}).get("demo.gpuwarden.io/job", "")
                node = pod.spec.node_name
                if node and pod.status.phase == "Running":
                    seen.placements.append((job, node, pod.metadata.uid))
                    if contract.ANNOTATION_GPU_FRACTION in (pod.metadata.annotations or {}):
                        seen.slices_run.add(pod.metadata.uid)
                if node in faulty:
                    seen.on_faulty[pod.metadata.uid] = (job, node, pod.status.phase)
            events = core.list_event_for_all_namespaces().items
            seen.node_events = [(e.involved_object.name, e.reason) for e in events if e.involved_object.kind == "Node"]
            listed = custom.list_cluster_custom_object(
                contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL
            )
            seen.queues = listed["items"]
            seen.reads += 1
        except Exception:  # the demo is tearing its cluster down: the last good read stands
            if stop.wait(0.5):
                return
        stop.wait(2.0)


@pytest.fixture
def demo_run(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """The demo as a process; a test's indirect parameter adds flags (``["--dra", "--duration", "120"]``)."""
    extra: list[str] = list(getattr(request, "param", []))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    duration = extra[extra.index("--duration") + 1] if "--duration" in extra else str(DURATION_S)
    extra = [a for i, a in enumerate(extra) if a != "--duration" and (i == 0 or extra[i - 1] != "--duration")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo", "--nodes", str(NODES), "--duration", duration, "--no-tty", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        # The demo keeps its log for the person who ran it; a test run keeps nothing.
        for line in lines:
            match = re.search(r"\(logs: (\S+)/demo\.log\)", line)
            if match and Path(match.group(1)).name.startswith("gpuwarden-demo-"):
                shutil.rmtree(match.group(1), ignore_errors=True)


def _kubeconfig(proc: subprocess.Popen[str], lines: list[str]) -> str:
    """The kubeconfig path the demo prints once its control plane is up (its output so far kept in ``lines``)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        match = re.search(r"kubeconfig: (\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("".join(lines))


def _leftovers(run_dir: str) -> list[str]:
    """Processes whose command line names the demo's control-plane folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if run_dir.encode() in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except OSError:
                continue
    return found


def test_the_demo_runs_faults_to_the_end_of_remediation_and_leaves_nothing(
    demo_run: tuple[subprocess.Popen[str], list[str]],
) -> None:
    proc, lines = demo_run
    scenario = load_scenario("default")
    faulty = {f"gpu-node-{f.node:02d}" for f in scenario.faults if f.node < NODES}
    kubeconfig = _kubeconfig(proc, lines)
    run_dir = str(Path(kubeconfig).parent)
    assert Path(run_dir).name.startswith(RUN_DIR_PREFIX)

    api = config.new_client_from_config(config_file=kubeconfig)
    seen = Seen()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(api, faulty, seen, stop), daemon=True)
    watcher.start()
    lines.extend(proc.stdout)  # until the demo exits and closes its output
    rc = proc.wait(60)
    stop.set()
    watcher.join(15)
    output = "".join(lines)
    assert rc == 0, output
    assert seen.reads > 10, output

    # Each fault raised its condition on its node: seen True by a read, or (a GPU reset can clear it
    # between two reads) announced by the agent's Event with the condition's reason.
    expected = {
        "gpu-node-00": (contract.ConditionType.GPU_XID_ERROR, "Xid48"),
        "gpu-node-01": (contract.ConditionType.GPU_XID_ERROR, "Xid79"),
        "gpu-node-02": (contract.ConditionType.GPU_MEMORY_DEGRADED, contract.Reason.ROW_REMAP_PENDING.value),
        "gpu-node-03": (contract.ConditionType.GPU_NVLINK_DEGRADED, contract.Reason.NVLINK_DOWN.value),
        "gpu-node-04": (contract.ConditionType.INFINIBAND_DEGRADED, contract.Reason.IB_RATE_DEGRADED.value),
    }
    reasons = {(node, reason) for node, reason in seen.node_events}
    for node, (ctype, reason) in expected.items():
        shown = ctype.value in seen.conditions.get(node, set()) or (node, reason) in reasons
        assert shown, (node, seen.conditions.get(node), sorted(r for n, r in reasons if n == node))

    # Their work was evicted (deleted while it ran: a finished pod stays, Succeeded) and placed again elsewhere.
    evicted = {
        (job, node)
        for uid, (job, node, phase) in seen.on_faulty.items()
        if phase == "Running" and uid not in seen.present
    }
    replaced = {(job, node) for job, node in evicted if any(j == job and n != node for j, n, _ in seen.placements)}
    assert replaced, (evicted, output)

    # Remediation ran to its end: a GPU quarantined and returned, a node escalated and returned.
    assert ("gpu-node-00", "GpuQuarantined") in reasons and ("gpu-node-00", "GpuReturned") in reasons, reasons
    for node in ("gpu-node-01", "gpu-node-04"):
        assert {(node, "RepairEscalated"), (node, "EscalationCleared"), (node, "NodeReturned")} <= reasons, reasons

    # Every queue within one GPU of its fair share at the end.
    def gpus(status: dict[str, Any], key: str) -> float:
        return float((status.get(key) or {}).get("gpu", 0))

    off = {
        q["metadata"]["name"]: (gpus(q.get("status") or {}, "allocated"), gpus(q.get("status") or {}, "fairShare"))
        for q in seen.queues
    }
    assert off and all(abs(a - f) <= 1.0 for a, f in off.values()), off

    # The summary says what happened, with the performance figures.
    # GPU slices are admitted and run (nothing in the demo's cluster refuses them).
    assert seen.slices_run, output
    assert "summary after" in output and "worst lag" in output and "lost" in output
    # ... and whether the kubelets' device managers started pods on a quarantined GPU.
    gap = re.search(
        r"device manager: (no pod started on a quarantined GPU|\d+ pods? started on a quarantined GPU .*?; "
        r"(\d+ evicted off it in \d+\.\d s \(median\), \d+\.\d s at worst|none evicted off it yet))",
        output,
    )
    assert gap, output[-3000:]
    assert "nothing left running" in output
    # The logs went to the demo's log file, also while everything stopped after the summary.
    assert not [line for line in lines if line.startswith("{")], output[-3000:]

    # Nothing left: no process of the demo's control plane, and its folder gone.
    assert _leftovers(run_dir) == []
    assert not Path(run_dir).exists()
    api.close()


DRA_DURATION_S = 120


@dataclass
class SeenDra:
    """What the test read of the DRA side of the demo's cluster while it ran."""

    slices: dict[str, int] = field(default_factory=dict)  # node -> devices in its slice
    plugin_gpus: dict[str, str] = field(default_factory=dict)  # node -> its allocatable nvidia.com/gpu
    claimed_pods: set[str] = field(default_factory=set)  # running whole-GPU pods whose claim was theirs
    unclaimed_pods: set[str] = field(default_factory=set)  # running whole-GPU pods without one
    given_twice: list[tuple[str, str]] = field(default_factory=list)  # (pool, device) held by two running pods
    driver_taints: set[tuple[str, str, str]] = field(default_factory=set)  # (node, device, key=value)
    rules_at_end: set[str] = field(default_factory=set)  # the DeviceTaintRules in the last read
    reads: int = 0


def _still_running(core: client.CoreV1Api, pod: client.V1Pod) -> bool:
    try:
        now = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return now.metadata.uid == pod.metadata.uid and now.status.phase == "Running"


def _watch_dra(api: client.ApiClient, seen: SeenDra, stop: threading.Event) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    dra = ("resource.k8s.io", "v1")
    while not stop.is_set():
        try:
            for node in core.list_node().items:
                seen.plugin_gpus[node.metadata.name] = (node.status.allocatable or {}).get("nvidia.com/gpu", "")
            for item in custom.list_cluster_custom_object(*dra, "resourceslices")["items"]:
                spec = item["spec"]
                seen.slices[spec["nodeName"]] = len(spec.get("devices") or [])
                for device in spec.get("devices") or []:
                    for taint in device.get("taints") or []:
                        text = f"{taint['key']}={taint.get('value', '')}"
                        seen.driver_taints.add((spec["nodeName"], device["name"], text))
            # Pods first, then claims: a pod Running when the pods were read
            # had its claim reserved before its bind, so the claims read after
            # show it (read the other way, a pod bound in between looked unclaimed).
            pods = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/part-of=gpuwarden-demo").items
            claims = {
                f"{c['metadata']['namespace']}/{c['metadata']['name']}": c
                for c in custom.list_cluster_custom_object(*dra, "resourceclaims")["items"]
            }
            held: dict[tuple[str, str], str] = {}
            for pod in pods:
                limits = (pod.spec.containers[0].resources or client.V1ResourceRequirements()).limits or {}
                if pod.status.phase != "Running" or not limits.get("nvidia.com/gpu"):
                    continue
                status = api.sanitize_for_serialization(pod.status).get("extendedResourceClaimStatus") or {}
                claim = claims.get(f"{pod.metadata.namespace}/{status.get('resourceClaimName')}")
                reserved = ((claim or {}).get("status") or {}).get("reservedFor") or []
                if claim is None or not any(r.get("uid") == pod.metadata.uid for r in reserved):
                    # Unless it ended between the two reads (its claim is released then), it runs unclaimed.
                    if _still_running(core, pod):
                        seen.unclaimed_pods.add(pod.metadata.uid)
                    continue
                seen.claimed_pods.add(pod.metadata.uid)
                for result in claim["status"]["allocation"]["devices"]["results"]:
                    key = (result["pool"], result["device"])
                    if key in held and held[key] != pod.metadata.uid:
                        seen.given_twice.append(key)
                    held[key] = pod.metadata.uid
            rules = custom.list_cluster_custom_object(*dra, "devicetaintrules")["items"]
            seen.rules_at_end = {r["metadata"]["name"] for r in rules}
            seen.reads += 1
        except Exception:  # the demo is tearing its cluster down: the last good read stands
            if stop.wait(0.5):
                return
        stop.wait(0.5)


@pytest.mark.timeout(DRA_DURATION_S + 240)
@pytest.mark.parametrize("demo_run", [["--dra", "--duration", str(DRA_DURATION_S)]], indirect=True)
def test_the_demo_on_dra_nodes_allocates_claims_and_taints_the_sick_device(
    demo_run: tuple[subprocess.Popen[str], list[str]],
) -> None:
    """``gpuwarden demo --dra``: no device plugin, the driver's slices; whole-GPU pods run on their claims."""
    proc, lines = demo_run
    kubeconfig = _kubeconfig(proc, lines)
    run_dir = str(Path(kubeconfig).parent)
    api = config.new_client_from_config(config_file=kubeconfig)
    seen = SeenDra()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_dra, args=(api, seen, stop), daemon=True)
    watcher.start()
    lines.extend(proc.stdout)
    rc = proc.wait(60)
    stop.set()
    watcher.join(15)
    output = "".join(lines)
    assert rc == 0, output
    assert seen.reads > 10, output
    nodes = [f"gpu-node-{i:02d}" for i in range(NODES)]
    # DRA nodes: no device plugin, every GPU in the driver's slice.
    assert all(seen.plugin_gpus.get(n) == "0" for n in nodes), seen.plugin_gpus
    assert all(seen.slices.get(n) == 8 for n in nodes), seen.slices
    # Whole-GPU pods ran on claims made, allocated and reserved for them, and no device twice.
    assert len(seen.claimed_pods) > 10 and not seen.unclaimed_pods, (seen.claimed_pods, seen.unclaimed_pods)
    assert seen.given_twice == [], seen.given_twice
    # XID 79 on gpu-node-01's GPU 0: the driver tainted the device (until the node's repair restarts it).
    assert ("gpu-node-01", "gpu-0", "gpu.nvidia.com/xid=79") in seen.driver_taints, seen.driver_taints
    # A GPU quarantined one by one (XID 48 on gpu-node-00, the NVLink on gpu-node-03) gets remediation's
    # DeviceTaintRule for as long as it is out: seconds, since the agent resets an idle GPU at once, too
    # short for these reads to see every time (tests/scheduler/remediation/test_device_taints_k8s.py
    # pins the rule down). Once every GPU is back, none is left.
    assert not any(r.startswith("gpuwarden-quarantine-") for r in seen.rules_at_end), seen.rules_at_end
    assert "nothing left running" in output
    assert _leftovers(run_dir) == []
    api.close()
