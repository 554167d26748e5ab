"""The HTTP endpoint of the agent and the scheduler: ``/metrics``, ``/healthz`` and ``/readyz``.

One small threaded server from the standard library: Prometheus and the
kubelet's probes are its only clients, a scrape is a few kilobytes, and no
web framework is worth its weight here. Liveness and readiness are callables
so each process decides what they mean (see :mod:`agent.daemon` and
:mod:`scheduler.cluster.runner`); this module only answers 200 or 503 with
the reason as text. It lives in the core so both processes answer probes
and scrapes the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# (ok, reason): the reason is the response body, so `kubectl describe pod`
# shows why a probe failed.
Check = Callable[[], tuple[bool, str]]


class HealthServer:
    """Serves the registry and the two probes on ``host:port`` in a daemon thread.

    ``port=0`` picks a free port (tests); :attr:`port` tells which.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = "0.0.0.0",
        port: int = 9402,
        liveness: Check,
        readiness: Check,
    ) -> None:
        self._registry = registry
        self._liveness = liveness
        self._readiness = readiness
        handler = self._handler_class()
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpuwarden-http", daemon=True)
        self._thread.start()
        log.info("http_server_started", port=self.port)

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

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
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

            def _check(self, check: Check) -> None:
                ok, reason = check()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", (reason + "\n").encode())

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                # Probes hit this every few seconds; access lines are noise.
                return

        return Handler
