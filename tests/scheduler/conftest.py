"""Fixtures the scheduler's Kubernetes tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden import contract
from tests.harness import ControlPlane

SCHEDULER_MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"


@pytest.fixture(scope="session")
def scheduler_crds(control_plane: ControlPlane) -> None:
    """The shipped Queue and PodGroup CRDs, applied as a user would (kubectl apply -k).

    Once per test run and never removed: every scheduler test then meets the
    same schema a cluster has, whichever runs first, and deleting a CRD would
    delete the other tests' objects with it. The control plane goes at the end.
    """
    control_plane.kubectl("apply", "-k", str(SCHEDULER_MANIFESTS / "crds"))
    for plural in (contract.QUEUE_PLURAL, contract.PODGROUP_PLURAL):
        control_plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.{contract.SCHEDULING_API_GROUP}", "--timeout=60s"
        )


@pytest.fixture(scope="session")
def gpunode_crd(control_plane: ControlPlane) -> None:
    """The agent's GPUNode CRD: the scheduler reads GPU health from GPUNode objects."""
    crd = SCHEDULER_MANIFESTS.parent / "crd-gpunodes.yaml"
    control_plane.kubectl("apply", "-f", str(crd))
    control_plane.kubectl(
        "wait", "--for=condition=Established", f"crd/{contract.GPUNODE_PLURAL}.{contract.API_GROUP}", "--timeout=60s"
    )
