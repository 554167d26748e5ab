"""The controller's reading of the agent's answers and of the pods a drain waits for (no API)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden import contract
from gpuwarden.timefmt import parse_epoch
from scheduler.cluster.assignment import encode_assignment
from scheduler.engine.model import Bind, Gpu, Node
from scheduler.remediation.controller import agent_answers, pods_on, request_time

ASKED = "2026-12-01T10:00:00.250000Z"


def _gpunode(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": {contract.GPUNODE_REMEDIATION: spec},
        "status": {contract.GPUNODE_REMEDIATION: status},
    }


@given(st.floats(min_value=1e9, max_value=4e9, allow_nan=False))
def test_a_request_time_reads_back_within_a_microsecond_never_earlier_than_float_spacing(ts: float) -> None:
    # Microseconds round up; reading back as a float loses at most its own
    # spacing (under 0.5 us at these times), which the answer's +1 us covers.
    back = parse_epoch(request_time(ts))
    assert back is not None and ts - 5e-7 <= back < ts + 2e-6


def test_only_answers_echoing_a_current_request_count_and_never_before_it() -> None:
    reset = {"gpu": 3, contract.REMEDIATION_REQUESTED_AT: ASKED}
    gpunode = _gpunode(
        {contract.REMEDIATION_RESETS: [reset], contract.REMEDIATION_VALIDATIONS: []},
        {
            contract.REMEDIATION_RESETS: [
                # The answer to this request, written in whole seconds (before the request's fraction).
                {**reset, "result": contract.RESET_SUCCEEDED, "finishedAt": "2026-12-01T10:00:00Z"},
                # An answer to an older request of the same GPU: not this one's.
                {
                    "gpu": 3,
                    contract.REMEDIATION_REQUESTED_AT: "2026-11-30T10:00:00Z",
                    "result": contract.RESET_FAILED,
                    "finishedAt": "2026-12-01T11:00:00Z",
                },
                # Still waiting for processes: no answer yet.
                {"gpu": 4, contract.REMEDIATION_REQUESTED_AT: ASKED, "result": contract.RESET_WAITING},
            ],
            contract.REMEDIATION_VALIDATIONS: [
                {contract.REMEDIATION_REQUESTED_AT: ASKED, "passed": True, "finishedAt": "2026-12-01T10:00:05Z"}
            ],
        },
    )
    resets, validations = agent_answers(gpunode)
    (only,) = resets
    assert only.gpu_index == 3 and only.ok
    assert only.at > datetime(2026, 12, 1, 10, 0, 0, 250000, tzinfo=UTC).timestamp()
    assert validations == (), "no validation is asked now, so none is answered"


def test_malformed_answers_are_ignored_not_raised() -> None:
    junk: list[Any] = [None, 7, {"gpu": "3"}, {"passed": "yes"}, {"gpu": 1, "result": "Succeeded"}]
    gpunode = {
        "spec": {contract.GPUNODE_REMEDIATION: {contract.REMEDIATION_RESETS: "all"}},
        "status": {
            contract.GPUNODE_REMEDIATION: {contract.REMEDIATION_RESETS: junk, contract.REMEDIATION_VALIDATIONS: junk}
        },
    }
    assert agent_answers(gpunode) == ((), ())
    assert agent_answers(None) == ((), ())


def _pod(name: str, *, node: str = "n1", gpus: str | None = None, owner: str | None = None, **extra: Any) -> Any:
    annotations: dict[str, str] = dict(extra.pop("annotations", {}))
    if gpus is not None:
        annotations[contract.ANNOTATION_GPU_ASSIGNMENT] = gpus
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "annotations": annotations}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": extra.pop("phase", "Running")}}


def test_a_drain_waits_for_the_pods_of_its_scope_and_leaves_daemonsets_and_mirrors() -> None:
    node = Node("n1", gpus=tuple(Gpu(i, f"GPU-{i}") for i in range(4)))
    on_gpu_2 = _pod("a", gpus=encode_assignment(Bind("ns/a", "ns", "a", "", "n1", (2,)), node))
    pods = [
        on_gpu_2,
        _pod("b"),
        _pod("ds", owner="DaemonSet"),
        _pod("mirror", annotations={"kubernetes.io/config.mirror": "x"}),
        _pod("done", phase="Succeeded"),
        _pod("elsewhere", node="n2"),
    ]
    assert [p["metadata"]["name"] for p in pods_on(pods, "n1", ())] == ["a", "b"]
    # A GPU's drain waits only for the pods assigned that GPU.
    assert [p["metadata"]["name"] for p in pods_on(pods, "n1", (2,))] == ["a"]
    assert pods_on(pods, "n1", (3,)) == []


def test_a_gpu_s_drain_waits_for_the_pods_on_its_mig_devices() -> None:
    node = Node(
        "n1",
        gpus=(
            Gpu(0, "GPU-0", mig_enabled=True),
            Gpu(1000, "MIG-0", memory_mib=4864, parent=0, milli_gpus=142),
            Gpu(1, "GPU-1"),
        ),
    )
    on_mig = _pod("m", gpus=encode_assignment(Bind("ns/m", "ns", "m", "", "n1", (1000,)), node))
    assert [p["metadata"]["name"] for p in pods_on([on_mig], "n1", (0,))] == ["m"]
    assert pods_on([on_mig], "n1", (1,)) == []
