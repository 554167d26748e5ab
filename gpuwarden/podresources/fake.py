"""A kubelet's PodResources service on a unix socket, for tests and the stand-in kubelet.

A real gRPC server of the real ``v1.PodResourcesLister`` servicer (generated
from the vendored proto), so a client talks to it exactly as to a kubelet:
same socket, same wire format, same status codes. It answers what it is
given (:meth:`FakePodResources.set_answers`) and can misbehave the ways a
node's kubelet does:

* ``hang``: calls wait until released (a kubelet stuck on a lock), so the
  client's deadline is what ends them;
* ``status``: every call fails with a gRPC status (UNIMPLEMENTED for a
  kubelet that does not serve the call, INTERNAL, ...);
* ``bad_message``: a gRPC answer whose bytes are not the response message;
* ``garbage``: no gRPC at all: a plain listener on the socket that writes
  bytes that are not HTTP/2 and hangs up;
* :meth:`vanish`: the server stops and its socket is removed (a kubelet
  restarting), then :meth:`start` serves again at the same path.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType

import grpc

from gpuwarden.podresources.v1 import api_pb2, api_pb2_grpc

SERVICE = "v1.PodResourcesLister"


class Behaviour(StrEnum):
    SERVE = "serve"
    HANG = "hang"
    STATUS = "status"
    BAD_MESSAGE = "bad_message"
    GARBAGE = "garbage"


@dataclass(slots=True)
class _State:
    listed: api_pb2.ListPodResourcesResponse = field(default_factory=api_pb2.ListPodResourcesResponse)
    allocatable: api_pb2.AllocatableResourcesResponse = field(default_factory=api_pb2.AllocatableResourcesResponse)
    # Per method name (List, GetAllocatableResources, Get): a status to fail with instead of answering.
    failing: dict[str, grpc.StatusCode] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: FakePodResources) -> None:
        self._owner = owner

    def _begin(self, method: str, context: grpc.ServicerContext) -> _State:
        owner = self._owner
        answers = owner.answers
        if answers is not None:
            listed, allocatable = answers()
            owner.set_answers(listed, allocatable)
        with owner._lock:
            state = owner._state
            state.calls[method] = state.calls.get(method, 0) + 1
            behaviour, code = owner.behaviour, state.failing.get(method)
        if behaviour is Behaviour.HANG:
            owner._released.wait()
        if code is not None:
            context.abort(code, f"{method} fails on purpose ({code.name})")
        return state

    # The method names are the service's (the proto's), as the generated servicer declares them.
    def List(  # noqa: N802
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        return self._begin("List", context).listed

    def GetAllocatableResources(  # noqa: N802
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        return self._begin("GetAllocatableResources", context).allocatable

    def Get(  # noqa: N802
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        state = self._begin("Get", context)
        for pod in state.listed.pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return api_pb2.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")


def _junk_handler(owner: FakePodResources) -> grpc.GenericRpcHandler:
    """Answers every method with bytes that do not decode as its response."""

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        with owner._lock:
            owner._state.calls["junk"] = owner._state.calls.get("junk", 0) + 1
        # Field 1 as a length-delimited value that claims more bytes than follow.
        return b"\x0a\xff\xff\xff\x0f\x01"

    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(answer)
    return grpc.method_handlers_generic_handler(
        SERVICE, {name: handler for name in ("List", "GetAllocatableResources", "Get")}
    )


class FakePodResources:
    """The service on ``path``; a context manager that always stops it and removes the socket."""

    def __init__(
        self,
        path: str,
        behaviour: Behaviour = Behaviour.SERVE,
        answers: Callable[[], tuple[api_pb2.ListPodResourcesResponse, api_pb2.AllocatableResourcesResponse]]
        | None = None,
    ) -> None:
        """``answers``, when given, is asked at every call (a stand-in kubelet whose pods come and go)."""
        self.path = path
        self.behaviour = behaviour
        self.answers = answers
        self._lock = threading.Lock()
        self._state = _State()
        self._released = threading.Event()
        self._server: grpc.Server | None = None
        self._listener: socket.socket | None = None
        self._garbage_thread: threading.Thread | None = None

    # ----------------------------------------------------------- answers

    def set_answers(
        self,
        listed: api_pb2.ListPodResourcesResponse | None = None,
        allocatable: api_pb2.AllocatableResourcesResponse | None = None,
    ) -> None:
        """What ``List`` and ``GetAllocatableResources`` answer from now on (None: unchanged)."""
        with self._lock:
            if listed is not None:
                self._state.listed = listed
            if allocatable is not None:
                self._state.allocatable = allocatable

    def fail(self, method: str, code: grpc.StatusCode | None) -> None:
        """Make ``method`` fail with ``code`` (None: answer again)."""
        with self._lock:
            if code is None:
                self._state.failing.pop(method, None)
            else:
                self._state.failing[method] = code

    def calls(self, method: str) -> int:
        with self._lock:
            return self._state.calls.get(method, 0)

    def release(self) -> None:
        """Let hung calls return (and calls from now on not hang)."""
        self._released.set()

    # ------------------------------------------------------------- life

    def start(self) -> FakePodResources:
        """Serve on the socket with the current behaviour (the socket's directory must exist)."""
        self.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self.behaviour is Behaviour.GARBAGE:
            self._serve_garbage()
            return self
        if self.behaviour is not Behaviour.HANG:
            self._released.set()
        else:
            self._released.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-podresources"))
        if self.behaviour is Behaviour.BAD_MESSAGE:
            server.add_generic_rpc_handlers((_junk_handler(self),))
        else:
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        return self

    def _serve_garbage(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(8)
        listener.settimeout(0.2)
        self._listener = listener
        stop = self._released
        stop.clear()

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                with conn, contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\nthis is not gRPC\n")
                with self._lock:
                    self._state.calls["garbage"] = self._state.calls.get("garbage", 0) + 1

        self._garbage_thread = threading.Thread(target=serve, name="fake-podresources-garbage", daemon=True)
        self._garbage_thread.start()

    def stop(self) -> None:
        """Stop serving (hung calls are released first); the socket file is left."""
        self._released.set()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        thread, self._garbage_thread = self._garbage_thread, None
        if thread is not None:
            thread.join(5)

    def vanish(self) -> None:
        """Stop and remove the socket, as a kubelet going away does."""
        self.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> FakePodResources:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.vanish()
