"""Session-wide fixtures: the real Kubernetes control plane (see tests/harness/).

The control plane starts once, on first use by a ``k8s``-marked test, and
stops when the session ends, also after failures and Ctrl-C (fixture
finalizer, atexit, and the kernel's parent-death signal if pytest is killed).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.harness import ControlPlane, ControlPlaneError, find_binaries, temporary_namespace


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fence-seeds",
        type=int,
        default=3,
        help="how many pause points the SIGSTOP test of the scheduler's lease fence tries (default 3)",
    )
    parser.addoption(
        "--placement-seeds",
        type=int,
        default=6,
        help="how many random clusters the kube-scheduler oracle of the placement rules tries (default 6)",
    )
    parser.addoption(
        "--dra-seeds",
        type=int,
        default=20,
        help="how many random devices and claims the kube-scheduler oracle of DRA allocation tries (default 20)",
    )
    parser.addoption(
        "--placement-first-seed",
        type=int,
        default=0,
        help="the first seed of the placement oracle (to rerun one seed a failure names)",
    )


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager for the whole session.

    Missing binaries fail the tests that need them (never skip): a green run
    without the control plane would hide every Kubernetes bug.
    """
    try:
        binaries = find_binaries()
        plane = ControlPlane.start(binaries)
    except ControlPlaneError as err:
        pytest.fail(str(err), pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def k8s(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """An admin client, closed after the test."""
    with control_plane.api_client() as api:
        yield api


@pytest.fixture
def namespace(k8s: client.ApiClient) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    with temporary_namespace(k8s) as name:
        yield name
