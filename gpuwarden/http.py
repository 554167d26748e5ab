"""The HTTP endpoint of the agent and the scheduler: ``/metrics``, ``/healthz`` and ``/readyz``.

One small threaded server from the standard library: Prometheus and the
kubelet's probes are its only clients, a scrape is a few kilobytes, and no
web framework is worth its weight here. Liveness and readiness are callables
so each process decides what they mean (see :mod:`agent.daemon` and
:mod:`scheduler.runner`); this module only answers 200 or 503 with
the reason as text. It lives in the core so both processes answer probes
and scrapes the same way.

Two optional layers, for an endpoint that anyone on the node network can
reach (the agent runs with the host network): TLS, with a certificate from
files that is reloaded when they change or a self-signed one
(:mod:`gpuwarden.servingcert`), and an authorizer for ``/metrics``
(:mod:`gpuwarden.metricsauth` asks the API server). ``/healthz`` and
``/readyz`` are never authorized: the kubelet probes them without
credentials, and they say nothing a scrape would not. The choice of modes is
:mod:`gpuwarden.serving`'s.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuwarden.logconfig import get_logger
from gpuwarden.servingcert import ServingCertificate

log = get_logger(__name__)

# (ok, reason): the reason is the response body, so `kubectl describe pod`
# shows why a probe failed.
Check = Callable[[], tuple[bool, str]]

# A client that opens a connection and sends nothing (or stops mid-handshake)
# holds a thread until this runs out; a keep-alive scraper reconnects.
CONNECTION_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class AuthDecision:
    """The answer to "may this request read /metrics": an HTTP status (200, 401, 403 or 503) and why."""

    status: int
    reason: str
    user: str | None = None


class Authorizer(Protocol):
    """Decides a ``/metrics`` request from its ``Authorization`` header (None when absent)."""

    def authorize(self, authorization: str | None) -> AuthDecision: ...


class ThreadingTLSServer(ThreadingHTTPServer):
    """The standard threaded server, wrapping each accepted connection in TLS when asked.

    Public for the scheduler's admission webhook, which serves HTTPS the same
    way. The wrap happens per connection with the context :class:`ServingCertificate`
    hands out at that moment, which is how a rotated certificate is served
    without a restart. The handshake itself runs in the connection's own
    thread (see ``Handler.setup``), so a slow or silent client cannot stall
    the accept loop.
    """

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], tls: ServingCertificate | None
    ) -> None:
        self.tls = tls
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is None:
            return sock, address
        try:
            wrapped = self.tls.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):
            sock.close()
            raise OSError("TLS setup of an accepted connection failed") from None
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A plain-HTTP client on the TLS port, a failed handshake, a client
        # that hangs up: the client's problem, one debug line, no traceback on stderr.
        log.debug("http_connection_failed", client=str(client_address[0]) if client_address else None)


class HealthServer:
    """Serves the registry and the two probes on ``host:port`` in a daemon thread.

    ``port=0`` picks a free port (tests); :attr:`port` tells which. With
    ``tls`` it speaks HTTPS only; with ``authorizer`` a ``/metrics`` request
    is answered only when the authorizer says 200.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = "0.0.0.0",
        port: int = 9402,
        liveness: Check,
        readiness: Check,
        tls: ServingCertificate | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self._registry = registry
        self._liveness = liveness
        self._readiness = readiness
        self._authorizer = authorizer
        handler = self._handler_class()
        self._server = ThreadingTLSServer((host, port), handler, tls)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpuwarden-http", daemon=True)
        self._thread.start()
        log.info(
            "http_server_started",
            port=self.port,
            scheme="https" if self._server.tls is not None else "http",
            metrics_auth="none" if self._authorizer is None else type(self._authorizer).__name__,
        )

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            # Keep-alive from Prometheus is fine; probes open a connection each.
            protocol_version = "HTTP/1.1"
            timeout = CONNECTION_TIMEOUT_S

            def setup(self) -> None:
                super().setup()  # sets the timeout, which then bounds the handshake too
                if isinstance(self.connection, ssl.SSLSocket):
                    self.connection.do_handshake()

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        if self._authorized():
                            self._send(200, CONTENT_TYPE_LATEST, generate_latest(server._registry))
                    elif path == "/healthz":
                        self._check(server._liveness)
                    elif path == "/readyz":
                        self._check(server._readiness)
                    else:
                        self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, /readyz\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                except Exception as exc:  # a scrape bug must answer 500, not kill the server thread
                    log.error("http_request_failed", path=path, error=repr(exc))
                    self._send(500, "text/plain; charset=utf-8", f"internal error: {exc}\n".encode())

            def _authorized(self) -> bool:
                """Answer 401, 403 or 503 and return False unless the authorizer (if any) allows the request."""
                if server._authorizer is None:
                    return True
                decision = server._authorizer.authorize(self.headers.get("Authorization"))
                if decision.status == 200:
                    return True
                headers = {"WWW-Authenticate": 'Bearer realm="gpuwarden"'} if decision.status == 401 else {}
                self._send(decision.status, "text/plain; charset=utf-8", (decision.reason + "\n").encode(), headers)
                return False

            def _check(self, check: Check) -> None:
                ok, reason = check()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", (reason + "\n").encode())

            def _send(self, code: int, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                # Probes hit this every few seconds; access lines are noise.
                return

        return Handler
