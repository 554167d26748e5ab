"""The bookkeeping writes (PodGroup create, PodGroup and Queue status merge patches) through KubeApi's own path.

They go out as raw JSON on the rest client's pool, not through the
generated client, because one PodGroup and its statuses per pod made the
generated client's per-request cost a quarter of the scheduler's CPU under
steady arrivals. Against the real API server: what they write is what the
generated client wrote (a merge patch, so ``None`` removes a field), a
PodGroup that is gone is an answer (None), a refusal is an ApiError in the
API server's words, and a client with its own rest client (impersonation)
is obeyed.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from tests.harness import ControlPlane, unique_name

GROUP, VERSION = contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION
FIELD_MANAGER = contract.SCHEDULER_COMPONENT


def _podgroup(name: str) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": contract.PODGROUP_KIND,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}},
        "spec": {"minMember": 1, "queue": "team-a"},
    }


def test_podgroup_writes_land_as_the_generated_client_wrote_them(
    k8s: client.ApiClient, scheduler_crds: None, namespace: str
) -> None:
    api = KubeApi(k8s, field_manager=FIELD_MANAGER)
    custom = client.CustomObjectsApi(k8s)
    created = api.create_podgroup(namespace, _podgroup("pg-a"))
    assert created["metadata"]["name"] == "pg-a" and created["spec"]["minMember"] == 1
    with pytest.raises(ApiError) as exists:
        api.create_podgroup(namespace, _podgroup("pg-a"))
    assert exists.value.status == 409 and "already exists" in exists.value.detail

    written = api.patch_podgroup_status(namespace, "pg-a", {"status": {"phase": "Running", "scheduled": 1}})
    assert written is not None and written["status"] == {"phase": "Running", "scheduled": 1}
    # A merge patch: null removes a field, the others stay.
    api.patch_podgroup_status(namespace, "pg-a", {"status": {"scheduled": None, "observedGeneration": 1}})
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, "pg-a")
    assert stored["status"] == {"phase": "Running", "observedGeneration": 1}
    # Whose write it was, in managedFields.
    managers = {(f["manager"], f.get("subresource", "")) for f in stored["metadata"]["managedFields"]}
    assert {(FIELD_MANAGER, ""), (FIELD_MANAGER, "status")} <= managers

    api.patch_podgroup(namespace, "pg-a", {"spec": {"minMember": 2}})
    assert (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, "pg-a")["spec"][
            "minMember"
        ]
        == 2
    )
    # Gone: an answer, not an error; the schema's refusal: the API server's words.
    assert api.patch_podgroup_status(namespace, "gone", {"status": {"phase": "Running"}}) is None
    with pytest.raises(ApiError) as invalid:
        api.patch_podgroup(namespace, "pg-a", {"spec": {"minMember": -1}})
    assert invalid.value.status == 422 and "minMember" in invalid.value.detail
    ok, failed = api.stats.snapshot()
    assert ok["patch_podgroup_status"] == 3 and "patch_podgroup_status" not in failed
    assert failed == {"create_podgroup": 1, "patch_podgroup": 1}


def test_queue_status_patch_and_an_impersonating_client(
    control_plane: ControlPlane, k8s: client.ApiClient, scheduler_crds: None, namespace: str
) -> None:
    custom = client.CustomObjectsApi(k8s)
    name = unique_name("bookkeeping")
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        contract.QUEUE_PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": contract.QUEUE_KIND, "metadata": {"name": name}, "spec": {}},
    )
    try:
        api = KubeApi(k8s, field_manager=FIELD_MANAGER)
        api.patch_queue_status(name, {"status": {"fairShare": {"gpu": 4}}})
        stored = custom.get_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL, name)
        assert stored["status"] == {"fairShare": {"gpu": 4}}
        # A client with its own rest client (impersonating a ServiceAccount
        # with no rights) sends through it: RBAC refuses it as that account.
        with control_plane.impersonate("nobody", namespace) as nobody:
            refused = KubeApi(nobody, field_manager=FIELD_MANAGER)
            with pytest.raises(ApiError) as forbidden:
                refused.patch_queue_status(name, {"status": {"fairShare": {"gpu": 8}}})
            with pytest.raises(ApiError) as not_created:
                refused.create_podgroup(namespace, _podgroup("pg-b"))
        assert forbidden.value.status == 403 and "system:serviceaccount" in forbidden.value.detail
        assert not_created.value.status == 403
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL, name)
