"""The escalation webhook's timeout bounds the whole call, against a real server that answers slowly."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from scheduler.remediation.controller import _post


def _read_request(conn: socket.socket) -> None:
    """Read a whole request, headers and body: closing with unread bytes resets the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


class DripServer:
    """An HTTP server on 127.0.0.1 that reads a request, then answers one byte per ``every`` seconds."""

    def __init__(self, answer: bytes, every: float) -> None:
        self.answer = answer
        self.every = every
        self.finished = threading.Event()  # set once a whole answer was sent
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                _read_request(conn)
                for i in range(len(self.answer)):
                    if self.stop.wait(self.every):
                        return
                    try:
                        conn.sendall(self.answer[i : i + 1])
                    except OSError:
                        break  # the client gave up
                else:
                    self.finished.set()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.listener.close()


ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer(ANSWER, every=0.1)  # each byte well inside the per-operation timeout
    try:
        yield server
    finally:
        server.close()


def test_a_server_answering_a_byte_at_a_time_is_given_up_on(drip: DripServer) -> None:
    # The answer takes len(ANSWER) x 0.1 s (about 7 s); every byte comes within the 1 s timeout.
    with pytest.raises(TimeoutError):
        _post(drip.url, b"{}", 1.0)
    assert not drip.finished.is_set()  # the call ended while the server was still answering


def test_a_prompt_answer_is_read_whole() -> None:
    server = DripServer(ANSWER, every=0.0)
    try:
        _post(server.url, b"{}", 10.0)
        assert server.finished.wait(5)
    finally:
        server.close()


def test_a_refused_connection_is_the_callers_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(OSError):
        _post(f"http://127.0.0.1:{port}/hook", b"{}", 5.0)
