"""A pod's raw placement fields to the engine's Placement: what is read, and what makes a pod wait."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.convert import node_from_objects, task_from_pod
from scheduler.cluster.placement import UnreadableError, _ports, other_requests, read_placement
from scheduler.engine.model import HostPort, LabelSelector, PodTerm, Requirement

JOB_KEY = "jobset.sigs.k8s.io/job-key"


def _pod(spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": labels or {}},
        "spec": {"schedulerName": "gpuwarden-scheduler", "containers": [{"name": "c"}], **spec},
        "status": {"phase": "Pending"},
    }


def test_jobset_exclusive_placement_reads_as_affinity_to_its_job_and_anti_affinity_to_the_others() -> None:
    """The shape JobSet's pod webhook gives every pod of a job with exclusive placement per topology."""
    key = "3b1f0e"
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": JOB_KEY, "operator": "In", "values": [key]}]},
                    "topologyKey": "cloud.provider.com/rack",
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": JOB_KEY, "operator": "Exists"},
                            {"key": JOB_KEY, "operator": "NotIn", "values": [key]},
                        ]
                    },
                    "topologyKey": "cloud.provider.com/rack",
                }
            ]
        },
    }
    task = task_from_pod(_pod({"affinity": affinity}, {JOB_KEY: key}))
    placement = task.placement
    assert placement is not None and not task.unplaceable
    assert placement.affinity == (
        PodTerm("cloud.provider.com/rack", LabelSelector(expressions=(Requirement(JOB_KEY, "In", (key,)),))),
    )
    assert placement.anti_affinity[0].selector == LabelSelector(
        expressions=(Requirement(JOB_KEY, "Exists"), Requirement(JOB_KEY, "NotIn", (key,)))
    )
    assert task.labels == {JOB_KEY: key}


def test_match_label_keys_join_the_selector_with_the_pods_own_values() -> None:
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
            "matchLabelKeys": ["pod-template-hash", "absent"],
            "minDomains": 3,
            "nodeTaintsPolicy": "Honor",
        }
    ]
    found = read_placement({"topologySpreadConstraints": spread}, {"app": "web", "pod-template-hash": "abc"})
    assert found.placement is not None
    (constraint,) = found.placement.spread
    assert constraint.selector == LabelSelector(match_labels=(("app", "web"), ("pod-template-hash", "abc")))
    assert (constraint.hard, constraint.min_domains, constraint.honor_affinity, constraint.honor_taints) == (
        True,
        3,
        True,
        True,
    )


def test_namespace_selectors() -> None:
    """Empty: every namespace. With labels: refused for affinity, every namespace for anti-affinity."""
    term = {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "kubernetes.io/hostname"}
    labelled = {**term, "namespaceSelector": {"matchLabels": {"team": "x"}}}
    everywhere = {**term, "namespaceSelector": {}}
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    refused = read_placement({"affinity": {"podAffinity": {required: [labelled]}}}, {})
    assert refused.placement is None and "namespaceSelector" in refused.unplaceable
    anti = read_placement({"affinity": {"podAntiAffinity": {required: [labelled]}}}, {}).placement
    assert anti is not None and anti.anti_affinity[0].all_namespaces
    empty = read_placement({"affinity": {"podAffinity": {required: [everywhere]}}}, {}).placement
    assert empty is not None and empty.affinity[0].all_namespaces


def test_unreadable_rules_make_the_pod_wait_with_the_field_named() -> None:
    bad_operator = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near", "values": ["x"]}]}]
                }
            }
        }
    }
    task = task_from_pod(_pod(bad_operator))
    assert task.placement is None and "Near" in task.unplaceable
    # A bound pod is judged by nothing here: it keeps running, its rule is not read as absent for others.
    bound = _pod(bad_operator)
    bound["spec"]["nodeName"] = "n1"
    assert task_from_pod(bound).unplaceable == ""
    bad_amount = task_from_pod(
        _pod({"containers": [{"name": "c", "resources": {"requests": {"example.com/foo": "lots"}}}]})
    )
    assert "example.com/foo" in bad_amount.unplaceable


def test_host_ports_of_containers_and_sidecars() -> None:
    spec = {
        "initContainers": [
            {"name": "proxy", "restartPolicy": "Always", "ports": [{"containerPort": 1, "hostPort": 9000}]}
        ],
        "containers": [
            {"name": "c", "ports": [{"containerPort": 80}, {"containerPort": 53, "hostPort": 53, "protocol": "UDP"}]}
        ],
    }
    placement = task_from_pod(_pod(spec)).placement
    assert placement is not None
    assert placement.ports == (HostPort(53, "UDP"), HostPort(9000))


def test_other_resources_are_summed_as_kube_scheduler_sums_them() -> None:
    """Containers add up; a one-shot init container counts at its peak with the sidecars started before it."""
    spec = {
        "initContainers": [
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"example.com/foo": "1"}}},
            {"name": "init", "resources": {"limits": {"example.com/foo": "4", "hugepages-2Mi": "2Mi"}}},
        ],
        "containers": [
            {"name": "a", "resources": {"requests": {"example.com/foo": "1", "ephemeral-storage": "1Gi", "cpu": "1"}}},
            {"name": "b", "resources": {"requests": {"example.com/foo": "1"}}},
        ],
        "overhead": {"example.com/foo": "500m"},
    }
    assert dict(other_requests(spec)) == {
        "example.com/foo": 5500,  # max(2 + 1 sidecar, 4 + 1 sidecar) + 0.5 overhead
        "ephemeral-storage": 1024**3 * 1000,
        "hugepages-2Mi": 2 * 1024**2 * 1000,
    }


def test_node_other_allocatable_and_pod_limit() -> None:
    raw = {
        "metadata": {"name": "n1", "labels": {}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110", "example.com/foo": "3", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    converted = node_from_objects(raw, None)
    assert converted.max_pods == 110
    assert converted.extended == {"example.com/foo": 3000}


_PORT = st.fixed_dictionaries(
    {"containerPort": st.integers(1, 65535)},
    optional={
        "hostPort": st.one_of(st.integers(-2, 70000), st.none(), st.just("80")),
        "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
        "hostIP": st.sampled_from(["0.0.0.0", "10.0.0.1"]),
    },
)
_CONTAINER = st.fixed_dictionaries(
    {}, optional={"ports": st.lists(_PORT, max_size=3), "restartPolicy": st.sampled_from(["Always", "Never"])}
)


@given(
    st.fixed_dictionaries(
        {},
        optional={"containers": st.lists(_CONTAINER, max_size=3), "initContainers": st.lists(_CONTAINER, max_size=2)},
    )
)
def test_a_pod_without_affinity_or_spread_reads_as_the_full_reading_does(spec: dict[str, object]) -> None:
    """The shortcut for pods with no rules (host ports alone) says what reading every kind of rule says."""
    assert read_placement(spec, {"app": "a"}) == read_placement({**spec, "affinity": {}}, {"app": "a"})


@given(
    st.fixed_dictionaries(
        {},
        optional={"containers": st.lists(_CONTAINER, max_size=3), "initContainers": st.lists(_CONTAINER, max_size=2)},
    )
)
def test_host_ports_read_by_the_shortcut_are_those_the_full_reading_finds(spec: dict[str, Any]) -> None:
    """A pod whose containers list no ports skips the scan; a one-shot init container (never counted) forces it."""
    forced = {**spec, "initContainers": [*spec.get("initContainers", []), {"name": "once"}]}
    assert _outcome(_ports, spec) == _outcome(_ports, forced)


_AMOUNTS = st.dictionaries(
    st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/foo", "ephemeral-storage"]),
    st.sampled_from(["1", "500m", "2Gi", "0", "lots"]),
    max_size=3,
)
_RESOURCES = st.fixed_dictionaries({}, optional={"requests": _AMOUNTS, "limits": _AMOUNTS})


@given(st.lists(st.fixed_dictionaries({}, optional={"resources": _RESOURCES}), max_size=3))
def test_other_requests_of_plain_containers_are_those_the_full_sum_finds(containers: list[dict[str, Any]]) -> None:
    """The shortcut for containers asking for CPU, memory and GPUs only says what summing every container says."""
    spec = {"containers": containers}
    forced = {**spec, "initContainers": [{"name": "once"}]}
    assert _outcome(other_requests, spec) == _outcome(other_requests, forced)


def _outcome(read: Any, spec: dict[str, Any]) -> object:
    try:
        return read(spec)
    except UnreadableError as why:
        return ("unreadable", str(why))
