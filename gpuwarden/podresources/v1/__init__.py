"""Generated code of the kubelet's ``v1.PodResourcesLister`` service.

``api.proto`` is the upstream file, byte for byte: repository
``kubernetes/kubelet`` (the published copy of kubernetes/kubernetes'
``staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``), path
``pkg/apis/podresources/v1/api.proto``, revision
``63b3249724f7d89a8aa48f9acb3811f193c9aa68`` (the v0.37 line, the release of
the tests' control plane). Upstream carries no gogoproto options in it any
more, so nothing was dropped and the wire format is the kubelet's.

Generated from it with grpcio-tools (``protoc``) and mypy-protobuf's plugins:
``api_pb2.py`` (the messages), ``api_pb2_grpc.py`` (client stub and
servicer) and their typed stubs ``api_pb2.pyi`` and ``api_pb2_grpc.pyi``, so
strict mypy checks the code that uses them. They are committed;
``tests/gpuwarden/test_podresources_codegen.py`` generates them again from the
proto and fails when anything differs, so they can neither drift from the
proto nor be edited by hand. After updating the proto, regenerate from the
repository root with::

    .venv/bin/python -m grpc_tools.protoc $(.venv/bin/python -c \\
        'from gpuwarden.podresources.v1 import protoc_args; print(*protoc_args(".", ".venv/bin"))')
"""

from __future__ import annotations

UPSTREAM_REPOSITORY = "kubernetes/kubelet"
UPSTREAM_PATH = "pkg/apis/podresources/v1/api.proto"
UPSTREAM_REVISION = "63b3249724f7d89a8aa48f9acb3811f193c9aa68"
PROTO = "gpuwarden/podresources/v1/api.proto"


def protoc_args(out: str, bin_dir: str) -> list[str]:
    """``protoc`` arguments that generate the four files into ``out`` (run from the repository root)."""
    return [
        "-I",
        ".",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={bin_dir}/protoc-gen-mypy",
        f"--mypy_out={out}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir}/protoc-gen-mypy_grpc",
        f"--mypy_grpc_out={out}",
        PROTO,
    ]
