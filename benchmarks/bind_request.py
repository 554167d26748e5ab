"""The CPU a bind's request costs the thread that sends it, beside the rest client's own request path.

The scheduling loop writes a cycle's first bind itself, so what that costs
in Python is time the next cycle waits. This starts the local control
plane, makes ``--pods`` pods three times over, and binds them one at a
time, rotating between :meth:`KubeApi.create_pod_binding` (the whole round
trip: the rest client's pool taken once, the fixed headers built once,
``KubeApi._post_json``), the same request through the rest client's
``request`` (the path every request took before, and the one a client with
its own rest client still takes), and :meth:`KubeApi.send_pod_binding`,
whose caller only writes the request (what the scheduling loop pays now;
the answer is read on another thread and not counted), so the machine's
drift lands on all alike. It prints the calling thread's CPU and the wall
time per bind, min and median, for each.

Run: ``.venv/bin/python benchmarks/bind_request.py [--pods 400]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from kubernetes import client

from gpuwarden.kube import KubeApi
from gpuwarden.localcluster.controlplane import running_control_plane

NAMESPACE = "bind-request"


def _binding(pod: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "namespace": NAMESPACE},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-0"},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=400, help="binds per path")
    opts = parser.parse_args(argv)
    with running_control_plane() as plane, plane.api_client() as admin:
        core = client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        spec = {"schedulerName": "nobody", "containers": [{"name": "main", "image": "registry.invalid/x:1"}]}
        sides = ("pool", "client", "sent")
        for side in sides:
            for i in range(opts.pods):
                core.create_namespaced_pod(NAMESPACE, {"metadata": {"name": f"{side}-{i}"}, "spec": spec})
        api = KubeApi(admin, field_manager="gpuwarden-scheduler")
        manager = api.field_manager

        def through_client(pod: str) -> None:
            api._send_through_client(
                "POST",
                f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/binding?fieldManager={manager}",
                _binding(pod),
                None,
                10.0,
            ).release_conn()

        paths: dict[str, Callable[[str], object]] = {
            "pool": lambda pod: api.create_pod_binding(NAMESPACE, pod, _binding(pod)),
            "client": through_client,
            "sent": lambda pod: api.send_pod_binding(NAMESPACE, pod, _binding(pod)),
        }
        cpu: dict[str, list[float]] = {side: [] for side in paths}
        wall: dict[str, list[float]] = {side: [] for side in paths}
        with ThreadPoolExecutor(1, thread_name_prefix="answers") as answers:
            for i in range(opts.pods):
                for side in sides[i % 3 :] + sides[: i % 3]:
                    c0, w0 = time.thread_time(), time.perf_counter()
                    done = paths[side](f"{side}-{i}")
                    cpu[side].append(time.thread_time() - c0)
                    wall[side].append(time.perf_counter() - w0)
                    if side == "sent":
                        answers.submit(cast("Callable[[], object]", done)).result()  # answered before the next
    print(f"{opts.pods} binds per path, rotating, against the local API server")
    for side, label in (
        ("client", "through the rest client's request (before)"),
        ("pool", "KubeApi, its pool, the round trip"),
        ("sent", "KubeApi.send_pod_binding, the request written, its answer read elsewhere (the loop's share now)"),
    ):
        print(
            f"{label}: CPU per bind min {1000 * min(cpu[side]):.3f} ms median "
            f"{1000 * statistics.median(cpu[side]):.3f} ms; wall min {1000 * min(wall[side]):.3f} ms "
            f"median {1000 * statistics.median(wall[side]):.3f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
