"""Reading a pod's placement rules where gpuwarden disagreed with kube-scheduler.

Each case is one the kube-scheduler oracle
(tests/scheduler/cluster/test_placement_oracle_k8s.py) is built to catch,
with kube-scheduler's own reading (its source,
pkg/scheduler/framework/plugins and pkg/scheduler/util) as the expected one.
"""

from __future__ import annotations

from scheduler.cluster.placement import read_placement
from scheduler.engine.model import HostPort


def _container(name: str, port: int, **extra: object) -> dict[str, object]:
    return {"name": name, "image": "x", "ports": [{"containerPort": port, "hostPort": port}], **extra}


def test_only_the_containers_and_sidecars_hold_host_ports() -> None:
    """kube-scheduler's GetHostPorts skips init containers that are not sidecars (restartPolicy Always).

    A one-shot init container's port is free again once the pod runs;
    counting it refused nodes kube-scheduler accepts, for the pod itself
    and for every pod placed beside it.
    """
    spec = {
        "initContainers": [_container("setup", 9000), _container("proxy", 9100, restartPolicy="Always")],
        "containers": [_container("main", 8080)],
    }
    placement = read_placement(spec, {}).placement
    assert placement is not None
    assert placement.ports == (HostPort(8080), HostPort(9100))


def test_a_pod_whose_only_host_port_is_a_one_shot_init_container_has_no_ports() -> None:
    spec = {"initContainers": [_container("setup", 9000)], "containers": [{"name": "main", "image": "x"}]}
    assert read_placement(spec, {}).placement is None
