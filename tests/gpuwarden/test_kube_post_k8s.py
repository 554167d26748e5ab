"""KubeApi's POSTs (binds, evictions) through the rest client's pool, against the real API server."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import urllib3
from kubernetes import client

from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.localcluster.controlplane import ControlPlane
from tests.harness import free_ports, temporary_namespace, wait_for

FIELD_MANAGER = "gpuwarden-scheduler"


def _binding(namespace: str, pod: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "namespace": namespace, "annotations": {"gpuwarden.io/test": "yes"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def _pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "main", "image": "registry.invalid/x:1"}]},
        },
    )


def test_binds_go_out_as_the_client_and_refusals_come_back_in_the_api_servers_words(
    control_plane: ControlPlane,
) -> None:
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        core = client.CoreV1Api(admin)
        for name in ("p0", "p1"):
            _pod(core, namespace, name)
        api = KubeApi(admin, field_manager=FIELD_MANAGER)
        api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
        bound = core.read_namespaced_pod("p0", namespace)
        assert bound.spec.node_name == "node-a"
        assert bound.metadata.annotations == {"gpuwarden.io/test": "yes"}
        # Bound already: the API server's 409 and its message, as an ApiError.
        with pytest.raises(ApiError) as conflict:
            api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-b"))
        assert conflict.value.status == 409 and "already assigned" in conflict.value.detail
        with pytest.raises(ApiError) as missing:
            api.create_pod_binding(namespace, "gone", _binding(namespace, "gone", "node-a"))
        assert missing.value.status == 404
        assert api.stats.snapshot() == ({"create_pod_binding": 3}, {"create_pod_binding": 2})

        # The token is read again through the client (at most once a second):
        # a token that stops being good is noticed, and so is a good one again.
        config = admin.configuration
        good = config.api_key["authorization"]
        config.api_key["authorization"] = "not-a-token"
        time.sleep(1.1)
        with pytest.raises(ApiError) as refused:
            api.create_pod_binding(namespace, "p1", _binding(namespace, "p1", "node-a"))
        assert refused.value.status == 401
        config.api_key["authorization"] = good
        time.sleep(1.1)
        api.create_pod_binding(namespace, "p1", _binding(namespace, "p1", "node-a"))
        assert core.read_namespaced_pod("p1", namespace).spec.node_name == "node-a"


def test_a_client_whose_rest_client_changes_requests_is_obeyed(control_plane: ControlPlane) -> None:
    """An impersonating client (its own rest client) binds as the ServiceAccount, so RBAC refuses it."""
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        _pod(client.CoreV1Api(admin), namespace, "p0")
        with control_plane.impersonate("nobody", namespace) as nobody:
            api = KubeApi(nobody, field_manager=FIELD_MANAGER)
            with pytest.raises(ApiError) as forbidden:
                api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
        assert forbidden.value.status == 403 and "system:serviceaccount" in forbidden.value.detail


def test_a_bind_sent_now_is_answered_later_on_another_thread(control_plane: ControlPlane) -> None:
    """send_pod_binding writes the request at once; the answer, read later elsewhere, is create_pod_binding's."""
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        core = client.CoreV1Api(admin)
        for name in ("p0", "p1", "p2"):
            _pod(core, namespace, name)
        api = KubeApi(admin, field_manager=FIELD_MANAGER)
        first = api.send_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
        # Sent, not read: the API server applies it all the same.
        wait_for(lambda: core.read_namespaced_pod("p0", namespace).spec.node_name == "node-a", description="p0 bound")
        # Two more in flight at once, each on its own connection, answered in the other order.
        second = api.send_pod_binding(namespace, "p1", _binding(namespace, "p1", "node-a"))
        again = api.send_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-b"))
        with pytest.raises(ApiError) as conflict:
            again()
        assert conflict.value.status == 409 and "already assigned" in conflict.value.detail
        with ThreadPoolExecutor(1) as other:
            assert other.submit(second).result(30)["status"] == "Success"
            assert other.submit(first).result(30)["status"] == "Success"
        with pytest.raises(RuntimeError):
            first()  # an answer is read once
        missing = api.send_pod_binding(namespace, "gone", _binding(namespace, "gone", "node-a"))
        with pytest.raises(ApiError) as gone:
            missing()
        assert gone.value.status == 404
        # Counted when read, as create_pod_binding's requests are (the one read twice counted once).
        assert api.stats.snapshot() == ({"create_pod_binding": 4}, {"create_pod_binding": 2})
        # The connections went back to the pool: the next bind goes out as usual.
        api.create_pod_binding(namespace, "p2", _binding(namespace, "p2", "node-a"))
        assert core.read_namespaced_pod("p1", namespace).metadata.annotations == {"gpuwarden.io/test": "yes"}


def test_a_bind_that_cannot_be_sent_fails_when_read_and_a_guard_stops_it_before(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        core = client.CoreV1Api(admin)
        _pod(core, namespace, "p0")

        def fenced(operation: str) -> None:
            raise PermissionError(f"{operation}: not leading")

        guarded = KubeApi(admin, field_manager=FIELD_MANAGER, write_guard=fenced)
        with pytest.raises(PermissionError):
            guarded.send_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
        assert guarded.stats.snapshot() == ({}, {})

        (port,) = free_ports(1)
        config = control_plane.configuration()
        config.host = f"https://127.0.0.1:{port}"  # nothing listens there
        with client.ApiClient(config) as nowhere:
            api = KubeApi(nowhere, field_manager=FIELD_MANAGER, timeout_s=5.0)
            answer = api.send_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
            with pytest.raises(ApiError) as refused:
                answer()
        assert refused.value.status is None and refused.value.transient
        assert api.stats.snapshot() == ({"create_pod_binding": 1}, {"create_pod_binding": 1})
        assert core.read_namespaced_pod("p0", namespace).spec.node_name is None


class _CountedSocket:
    """A connected socket whose writes are kept, to count them; everything else is the socket's."""

    def __init__(self, sock: object) -> None:
        self._sock = sock
        self.writes: list[bytes] = []

    def sendall(self, data: bytes, *args: object) -> None:
        self.writes.append(bytes(data))
        self._sock.sendall(data, *args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def test_a_bind_goes_out_in_one_write_and_its_connection_serves_the_next(control_plane: ControlPlane) -> None:
    """Head and body in one write: between two, the thread gave up the GIL and the API server waited for it."""
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        core = client.CoreV1Api(admin)
        for name in ("p0", "p1", "p2"):
            _pod(core, namespace, name)
        api = KubeApi(admin, field_manager=FIELD_MANAGER)
        api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))  # a connection, in use once
        pool = api._poster()[0]
        conn = pool._get_conn()
        assert conn.sock is not None, "the pool is last in, first out: this is the connection p0 went out on"
        counted = _CountedSocket(conn.sock)
        conn.sock = counted
        pool._put_conn(conn)
        answer = api.send_pod_binding(namespace, "p1", _binding(namespace, "p1", "node-a"))
        assert len(counted.writes) == 1
        head, _, body = counted.writes[0].partition(b"\r\n\r\n")
        assert head.startswith(b"POST ") and b"/pods/p1/binding?fieldManager=" in head.split(b"\r\n")[0]
        assert f"content-length: {len(body)}".encode() in head.lower()
        assert body.startswith(b"{") and b'"node-a"' in body
        assert answer()["status"] == "Success"
        # The same connection, back in the pool, carries the next bind, again in one write.
        api.send_pod_binding(namespace, "p2", _binding(namespace, "p2", "node-a"))()
        assert len(counted.writes) == 2
        assert core.read_namespaced_pod("p2", namespace).spec.node_name == "node-a"


def test_connections_opened_ahead_carry_the_binds_that_come_at_once(control_plane: ControlPlane) -> None:
    """What a new leader does: the term's first binds, sent together, each find a connection open."""
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        core = client.CoreV1Api(admin)
        names = [f"p{i}" for i in range(4)]
        for name in names:
            _pod(core, namespace, name)
        config = control_plane.configuration()
        config.connection_pool_maxsize = 8
        with client.ApiClient(config) as fresh:
            api = KubeApi(fresh, field_manager=FIELD_MANAGER)
            pool = api._poster()[0]
            assert api.open_connections(4) == 4
            assert pool.num_connections == 4
            assert api.open_connections(4) == 4  # open already: nothing to do
            assert pool.num_connections == 4  # no connection made
            assert api.stats.snapshot() == ({}, {})  # nothing was sent
            # Four binds written at once (the loop's and its pool's): none of them connects.
            answers = [api.send_pod_binding(namespace, n, _binding(namespace, n, "node-a")) for n in names]
            assert pool.num_connections == 4
            assert [a()["status"] for a in answers] == ["Success"] * 4
        assert {core.read_namespaced_pod(n, namespace).spec.node_name for n in names} == {"node-a"}

        (port,) = free_ports(1)
        away = control_plane.configuration()
        away.host = f"https://127.0.0.1:{port}"  # nothing listens there
        with client.ApiClient(away) as nowhere:
            api = KubeApi(nowhere, field_manager=FIELD_MANAGER, timeout_s=5.0)
            assert api.open_connections(4) == 0  # no error: the writes will say so when they come
            answer = api.send_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-b"))
            with pytest.raises(ApiError) as refused:
                answer()
            assert refused.value.transient


def test_each_connection_opened_ahead_is_free_for_a_bind_as_soon_as_it_is_open(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The term's first binds must not wait for every handshake: on a busy machine that took 0.7 s."""
    config = control_plane.configuration()
    config.connection_pool_maxsize = 8
    with client.ApiClient(config) as fresh:
        api = KubeApi(fresh, field_manager=FIELD_MANAGER)
        pool = api._poster()[0]
        steps: list[tuple[str, int]] = []
        sent = urllib3.connection.HTTPConnection.request

        def request(conn: urllib3.connection.HTTPConnection, *args: object, **kwargs: object) -> None:
            steps.append(("sent", id(conn)))
            sent(conn, *args, **kwargs)  # type: ignore[arg-type]

        put = pool._put_conn

        def put_back(conn: urllib3.connection.HTTPConnection | None) -> None:
            if conn is not None:
                steps.append(("free", id(conn)))
            put(conn)

        monkeypatch.setattr(urllib3.connection.HTTPConnection, "request", request)
        monkeypatch.setattr(pool, "_put_conn", put_back)
        assert api.open_connections(3) == 3
        conns = [conn for step, conn in steps if step == "sent"]
        assert len(set(conns)) == 3  # three connections, each opened once
        assert steps == [(step, conn) for conn in conns for step in ("sent", "free")]  # free before the next
