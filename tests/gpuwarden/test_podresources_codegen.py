"""The committed PodResources code is what the vendored proto generates, byte for byte.

Generated files are committed so that an install needs no code generator
and strict mypy reads their typed stubs; this test is what keeps them honest:
it runs the same generators (grpcio-tools' protoc with mypy-protobuf's
plugins, the versions of constraints.txt) on the vendored proto and compares.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuwarden.podresources import v1

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


def test_generated_files_match_the_vendored_proto(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *v1.protoc_args(str(tmp_path), str(bin_dir))],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    package = Path(v1.PROTO).parent
    for name in GENERATED:
        committed = (ROOT / package / name).read_text()
        assert (tmp_path / package / name).read_text() == committed, f"{package / name} differs: regenerate it"


def test_the_proto_names_its_upstream() -> None:
    proto = (ROOT / v1.PROTO).read_text()
    assert "service PodResourcesLister" in proto
    assert len(v1.UPSTREAM_REVISION) == 40 and v1.UPSTREAM_PATH.endswith("podresources/v1/api.proto")
