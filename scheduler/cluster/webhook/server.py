"""The webhook's HTTPS endpoint: ``POST /mutate`` for the API server, ``/healthz`` and ``/readyz`` for the kubelet.

The core's threaded TLS server (:class:`gpuwarden.http.ThreadingTLSServer`):
each connection is wrapped with the certificate of that moment, so a
rotated certificate is served without a restart, and the API server keeps
its connections alive, so a review costs no handshake. A review is a few
kilobytes of JSON and a decision over plain data: no web framework is worth
its weight here.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpuwarden.http import Check, ThreadingTLSServer
from gpuwarden.kube import JSON
from gpuwarden.logconfig import get_logger
from gpuwarden.servingcert import ServingCertificate

log = get_logger(__name__)

MUTATE_PATH = "/mutate"
# A pod with a large spec is tens of kilobytes; the API server caps objects at 3 MiB.
MAX_BODY = 8 * 1024 * 1024
CONNECTION_TIMEOUT_S = 60.0

Decide = Callable[[bytes], JSON]


class WebhookServer:
    """Serves reviews through ``decide`` on ``host:port`` in a daemon thread; ``port=0`` picks a free one."""

    def __init__(
        self, decide: Decide, *, tls: ServingCertificate, host: str = "0.0.0.0", port: int = 9443, ready: Check
    ) -> None:
        self._decide = decide
        self._ready = ready
        self._server = ThreadingTLSServer((host, port), self._handler_class(), tls)
        self._thread: threading.Thread | None = None
        # Open keep-alive connections: closed on stop, or they would keep answering.
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.reviews = 0

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> WebhookServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-https", daemon=True)
        self._thread.start()
        log.info("webhook_server_started", port=self.port, path=MUTATE_PATH)
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
        with self._lock:
            open_now = list(self._connections)
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses its connections
            timeout = CONNECTION_TIMEOUT_S

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)
                # The headers and the body leave in two writes; with Nagle's algorithm the second
                # waits for the client's delayed ACK, 40 ms on Linux, on every single review.
                with contextlib.suppress(OSError):
                    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if isinstance(self.connection, ssl.SSLSocket):
                    self.connection.do_handshake()

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != MUTATE_PATH:
                    self._send(404, b"not found: reviews go to /mutate\n", "text/plain; charset=utf-8")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or "0")
                except ValueError:
                    length = -1
                if not 0 < length <= MAX_BODY:
                    self._send(400, b"an AdmissionReview body is required\n", "text/plain; charset=utf-8")
                    self.close_connection = True
                    return
                body = self.rfile.read(length)
                started = time.perf_counter()
                try:
                    answer = server._decide(body)
                except ValueError as exc:
                    self._send(400, f"bad AdmissionReview: {exc}\n".encode(), "text/plain; charset=utf-8")
                    return
                except Exception as exc:  # a bug answers 500 (the failurePolicy decides), never kills the thread
                    log.exception("webhook_review_failed")
                    self._send(500, f"internal error: {exc}\n".encode(), "text/plain; charset=utf-8")
                    return
                server.reviews += 1
                response = answer.get("response") or {}
                if not response.get("allowed", True):
                    log.info(
                        "webhook_denied",
                        message=(response.get("status") or {}).get("message"),
                        ms=round((time.perf_counter() - started) * 1000, 2),
                    )
                self._send(200, json.dumps(answer, separators=(",", ":")).encode(), "application/json")

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._send(200, b"ok\n", "text/plain; charset=utf-8")
                elif path == "/readyz":
                    ok, reason = server._ready()
                    self._send(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found: try /healthz, /readyz\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler
