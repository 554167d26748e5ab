"""Minimal CRDs of the workload kinds pods are grouped by, for the test API server.

The real operators (Kubeflow's training operator and Trainer, KubeRay,
JobSet, LeaderWorkerSet, Argo Workflows) are not run here; what the scheduler needs
from them is only that their objects are served under the real group,
version, kind and plural, so that an owner reference written as their
controllers write it resolves through the API exactly as in a cluster. The
schemas therefore keep every field (``x-kubernetes-preserve-unknown-fields``)
instead of copying the operators' validation.

XGBoostJob, JAXJob and PaddleJob are left out on purpose: they are kinds the
scheduler follows, so a test can point an owner reference at one and see what
a cluster without that CRD does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from tests.harness import ControlPlane, wait_for

SERVE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class OwnerKind:
    """One workload kind as its CRD serves it."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"


PYTORCHJOB = OwnerKind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
TFJOB = OwnerKind("kubeflow.org", "v1", "TFJob", "tfjobs")
MPIJOB = OwnerKind("kubeflow.org", "v1", "MPIJob", "mpijobs")
RAYCLUSTER = OwnerKind("ray.io", "v1", "RayCluster", "rayclusters")
RAYJOB = OwnerKind("ray.io", "v1", "RayJob", "rayjobs")
RAYSERVICE = OwnerKind("ray.io", "v1", "RayService", "rayservices")
TRAINJOB = OwnerKind("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
JOBSET = OwnerKind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
LEADERWORKERSET = OwnerKind("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets")
WORKFLOW = OwnerKind("argoproj.io", "v1alpha1", "Workflow", "workflows")

OWNER_KINDS = (
    PYTORCHJOB,
    TFJOB,
    MPIJOB,
    RAYCLUSTER,
    RAYJOB,
    RAYSERVICE,
    JOBSET,
    LEADERWORKERSET,
    WORKFLOW,
    TRAINJOB,
)

# A followed kind whose CRD the test API server never gets.
XGBOOSTJOB = OwnerKind("kubeflow.org", "v1", "XGBoostJob", "xgboostjobs")


def crd_body(kind: OwnerKind) -> dict[str, Any]:
    """A namespaced CRD serving ``kind`` with any spec and a status subresource, as the operators' do."""
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name},
        "spec": {
            "group": kind.group,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
            },
            "versions": [
                {
                    "name": kind.version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": open_object, "status": open_object},
                        }
                    },
                }
            ],
        },
    }


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def _served(custom: client.CustomObjectsApi, kind: OwnerKind) -> bool:
    # Established is set before every API server handler has the new
    # resource; a list that answers is the proof that it is served.
    custom.list_namespaced_custom_object(kind.group, kind.version, "default", kind.plural, limit=1)
    return True


@pytest.fixture(scope="session")
def owner_crds(control_plane: ControlPlane) -> Iterator[tuple[OwnerKind, ...]]:
    """The workload CRDs, installed once per session, served before the first test, removed at the end."""
    with control_plane.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        custom = client.CustomObjectsApi(api)
        for kind in OWNER_KINDS:
            try:
                ext.create_custom_resource_definition(crd_body(kind))
            except client.ApiException as exc:
                if exc.status != 409:  # 409: left by an earlier fixture in this control plane
                    raise
        for kind in OWNER_KINDS:
            wait_for(
                partial(_established, ext, kind.crd_name),
                SERVE_TIMEOUT_S,
                description=f"CRD {kind.crd_name} established",
            )
            wait_for(
                partial(_served, custom, kind),
                SERVE_TIMEOUT_S,
                description=f"{kind.plural}.{kind.group} served",
                ignore=(client.ApiException,),
            )
    try:
        yield OWNER_KINDS
    finally:
        with control_plane.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            for kind in OWNER_KINDS:
                with contextlib.suppress(client.ApiException):
                    ext.delete_custom_resource_definition(kind.crd_name)
