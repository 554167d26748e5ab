"""Acting as a ServiceAccount gives exactly its identity and RBAC, as its own token would.

The RBAC the manifests grant the agent is only tested if the impersonated
client is refused everything else; a client that silently stayed admin
would let every permission test pass.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.harness import ControlPlane, service_account_identity, wait_for


def test_service_account_identity_is_the_one_the_api_server_gives_a_token() -> None:
    user, groups = service_account_identity("agent", "gpuwarden")
    assert user == "system:serviceaccount:gpuwarden:agent"
    assert groups == ["system:serviceaccounts", "system:serviceaccounts:gpuwarden", "system:authenticated"]


@pytest.mark.k8s
def test_impersonated_service_account_has_its_identity_and_only_its_rbac(
    control_plane: ControlPlane, k8s: client.ApiClient, namespace: str
) -> None:
    with control_plane.impersonate("reader", namespace) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        info = review.to_dict()["status"]["user_info"]
        assert info["username"] == f"system:serviceaccount:{namespace}:reader"
        expected = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}
        assert set(info["groups"]) == expected

        core = client.CoreV1Api(api)
        with pytest.raises(client.ApiException) as denied:
            core.list_namespaced_config_map(namespace)
        assert int(denied.value.status or 0) == 403

        rbac = client.RbacAuthorizationV1Api(k8s)
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-configmaps"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="reader"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)],
            ),
        )
        wait_for(lambda: core.list_namespaced_config_map(namespace), ignore=(client.ApiException,))
        with pytest.raises(client.ApiException) as still_denied:
            core.list_namespaced_pod(namespace)
        assert int(still_denied.value.status or 0) == 403
