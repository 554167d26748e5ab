"""Authenticated TLS scraping against the real API server, with real ServiceAccount tokens.

The server is built as the agent builds it (``gpuwarden.serving.build_server``)
and asks the API server as the agent's ServiceAccount (impersonated), so the
RBAC of manifests/secure-metrics/ is what allows the reviews. Scrapers are
ServiceAccounts with tokens from the TokenRequest API, exactly what a
Prometheus pod mounts: one bound to the shipped gpuwarden-metrics-reader
ClusterRole reads /metrics, one without it is forbidden, no token or a
garbage one is unauthenticated, and the probes need nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden import contract
from gpuwarden.http import HealthServer
from gpuwarden.kube import KubeApi, RequestStats
from gpuwarden.metricsauth import DelegatedAuthorizer
from gpuwarden.serving import MetricsSecurity, build_server
from gpuwarden.servingcert import ServingCertificate
from tests.agent.publish.conftest import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, MANIFESTS, SimAgent
from tests.harness import ControlPlane, free_ports, unique_name, wait_for

pytestmark = pytest.mark.k8s

SECURE_RBAC = MANIFESTS / "secure-metrics" / "rbac.yaml"
READER_ROLE = "gpuwarden-metrics-reader"


@pytest.fixture(scope="module")
def secure_rbac(control_plane: ControlPlane, agent_manifests: None) -> Iterator[None]:
    """The component's RBAC applied as shipped: the agent's auth-delegator binding and the reader ClusterRole."""
    control_plane.kubectl("apply", "-f", str(SECURE_RBAC))
    try:
        yield
    finally:
        control_plane.kubectl("delete", "-f", str(SECURE_RBAC), "--ignore-not-found", "--wait=false", check=False)


@dataclass(frozen=True)
class Scrapers:
    allowed: str  # token of a ServiceAccount bound to the reader ClusterRole
    other: str  # token of a ServiceAccount with no binding
    binding: str  # the ClusterRoleBinding that grants ``allowed``


def _token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    token: str = core.create_namespaced_service_account_token(name, namespace, request).status.token
    return token


@pytest.fixture
def scrapers(k8s: client.ApiClient, namespace: str, secure_rbac: None) -> Iterator[Scrapers]:
    core = client.CoreV1Api(k8s)
    rbac = client.RbacAuthorizationV1Api(k8s)
    binding = unique_name("prometheus-reads-gpuwarden")
    rbac.create_cluster_role_binding(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
        }
    )
    try:
        yield Scrapers(_token(core, namespace, "prometheus"), _token(core, namespace, "nosy"), binding)
    finally:
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role_binding(binding)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("gpuwarden_test_scrapes", "a metric to find in the scrape", registry=registry).inc()
    return registry


@contextlib.contextmanager
def _running(server: HealthServer) -> Iterator[HealthServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_server(control_plane: ControlPlane, secure_rbac: None) -> Iterator[HealthServer]:
    """The endpoint in delegated mode, reviewing as the agent's ServiceAccount."""
    with control_plane.impersonate(AGENT_SERVICE_ACCOUNT, AGENT_NAMESPACE) as agent_api:
        server = build_server(
            _registry(),
            MetricsSecurity(tls=True, auth="delegated"),
            host="127.0.0.1",
            port=0,
            liveness=lambda: (True, "ok"),
            readiness=lambda: (True, "ok"),
            api_client=agent_api,
            field_manager=contract.AGENT_COMPONENT,
            hosts=["gpu-node-test"],
        )
        with _running(server):
            yield server


def _get(server: HealthServer, path: str, token: str | None = None) -> tuple[int, str]:
    return _get_port(server.port, path, token)


def _get_port(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # self-signed: what the ServiceMonitor's insecureSkipVerify means
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_only_a_scraper_bound_to_the_reader_role_reads_metrics(agent_server: HealthServer, scrapers: Scrapers) -> None:
    status, body = _get(agent_server, "/metrics", scrapers.allowed)
    assert status == 200, body
    assert "gpuwarden_test_scrapes_total 1.0" in body

    status, body = _get(agent_server, "/metrics", scrapers.other)
    assert status == 403
    assert ":nosy may not get /metrics" in body

    for token in (None, "not-a-token", scrapers.allowed[:-4] + "AAAA"):
        status, body = _get(agent_server, "/metrics", token)
        assert status == 401, (token, body)

    # The kubelet probes without credentials.
    assert _get(agent_server, "/healthz") == (200, "ok\n")
    assert _get(agent_server, "/readyz", "not-a-token") == (200, "ok\n")


def test_answers_are_cached_briefly_and_a_revoked_binding_stops_the_scrape(
    control_plane: ControlPlane, k8s: client.ApiClient, scrapers: Scrapers
) -> None:
    stats = RequestStats()
    with control_plane.impersonate(AGENT_SERVICE_ACCOUNT, AGENT_NAMESPACE) as agent_api:
        reviews = KubeApi(agent_api, field_manager=contract.AGENT_COMPONENT, timeout_s=5.0, stats=stats)
        authorizer = DelegatedAuthorizer(reviews, allowed_ttl_s=1.0, denied_ttl_s=0.5)
        server = HealthServer(
            _registry(),
            host="127.0.0.1",
            port=0,
            liveness=lambda: (True, "ok"),
            readiness=lambda: (True, "ok"),
            tls=ServingCertificate.self_signed(["127.0.0.1"]),
            authorizer=authorizer,
        )
        with _running(server):
            # A scrape costs a TokenReview and a SubjectAccessReview; the next ones within the TTL nothing.
            for _ in range(3):
                assert _get(server, "/metrics", scrapers.allowed)[0] == 200
            assert stats.snapshot()[0] == {"create_token_review": 1, "create_subject_access_review": 1}
            # A garbage token stops at the TokenReview.
            assert _get(server, "/metrics", "garbage")[0] == 401
            assert stats.snapshot()[0]["create_token_review"] == 2

            client.RbacAuthorizationV1Api(k8s).delete_cluster_role_binding(scrapers.binding)
            wait_for(
                lambda: _get(server, "/metrics", scrapers.allowed)[0] == 403,
                timeout=10,
                interval=0.2,
                description="the scrape refused once the binding is gone and the cached answer expired",
            )


def test_an_agent_without_the_auth_delegator_binding_answers_503(
    control_plane: ControlPlane, scrapers: Scrapers
) -> None:
    # A ServiceAccount that may not create TokenReviews: the API server refuses the review itself.
    with control_plane.impersonate("no-delegation", AGENT_NAMESPACE) as api:
        server = build_server(
            _registry(),
            MetricsSecurity(tls=True, auth="delegated"),
            host="127.0.0.1",
            port=0,
            liveness=lambda: (True, "ok"),
            readiness=lambda: (True, "ok"),
            api_client=api,
            field_manager=contract.AGENT_COMPONENT,
            hosts=["127.0.0.1"],
        )
        with _running(server):
            status, body = _get(server, "/metrics", scrapers.allowed)
            assert status == 503
            assert "cannot check credentials" in body


def test_an_unreachable_api_server_answers_503_and_the_probes_keep_working() -> None:
    (port,) = free_ports(1)  # nothing listens there
    config = client.Configuration()
    config.host = f"https://127.0.0.1:{port}"
    config.verify_ssl = False
    config.retries = 0
    with client.ApiClient(config) as unreachable:
        server = build_server(
            _registry(),
            MetricsSecurity(tls=True, auth="delegated"),
            host="127.0.0.1",
            port=0,
            liveness=lambda: (True, "ok"),
            readiness=lambda: (True, "ok"),
            api_client=unreachable,
            field_manager=contract.AGENT_COMPONENT,
            hosts=["127.0.0.1"],
        )
        with _running(server):
            for _ in range(2):  # not cached: each scrape asks again, and the server survives each
                status, body = _get(server, "/metrics", "a-token-nobody-can-check")
                assert status == 503
                assert "cannot check credentials" in body
            assert _get(server, "/healthz") == (200, "ok\n")
            # No token is refused without asking anyone.
            assert _get(server, "/metrics")[0] == 401


def test_the_agent_daemon_in_delegated_mode_serves_its_metrics_to_the_bound_scraper(
    control_plane: ControlPlane, gpu_node: str, scrapers: Scrapers
) -> None:
    with control_plane.impersonate(AGENT_SERVICE_ACCOUNT, AGENT_NAMESPACE) as agent_api:
        agent = SimAgent(
            agent_api,
            gpu_node,
            SimNode(load_scenario("healthy")),
            metrics_port=0,
            metrics_host="127.0.0.1",
            metrics_security=MetricsSecurity(tls=True, auth="delegated"),
        ).start()
        try:
            assert agent.daemon.server is not None
            port = agent.daemon.server.port
            wait_for(lambda: _get_port(port, "/readyz")[0] == 200, timeout=20, description="the agent's first poll")
            status, body = _get_port(port, "/metrics", scrapers.allowed)
            assert status == 200, body
            assert "gpuwarden_agent_info" in body
            assert _get_port(port, "/metrics", scrapers.other)[0] == 403
            assert _get_port(port, "/metrics")[0] == 401
            # The reviews are not the agent's publishing requests: its budget and liveness ignore them.
            assert not {"create_token_review", "create_subject_access_review"} & set(agent.daemon.stats.snapshot()[0])
        finally:
            agent.stop()
