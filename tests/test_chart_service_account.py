"""The operator's ServiceAccount: the chart's own, or one the user names, never the namespace's default.

Every pod of a namespace that names no ServiceAccount runs as ``default``; binding the operator's
roles (cluster-wide pod create/delete and Secret reads) to it would hand them to all of those pods.

Specification: ``serviceAccount.create=false`` without ``serviceAccount.name`` is refused when Helm
renders, naming both keys; with a name, the Deployment and every binding use that name.
"""

from __future__ import annotations

import helm_python
import pytest
from chart_fixtures import NAMESPACE, render

from tests.test_chart import by_kind


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_no_service_account_and_no_name_is_refused(chart: helm_python.Chart, scope: str) -> None:
    values = {
        "serviceAccount": {"create": False},
        "rbac": {"scope": scope},
        "operator": {"watchNamespaces": ["team-a"]},
    }
    with pytest.raises(helm_python.HelmRenderError) as err:
        render(chart, values)
    assert "serviceAccount.create=false needs serviceAccount.name" in str(err.value)


def test_a_named_existing_account_is_what_the_pod_runs_as_and_what_is_bound(chart: helm_python.Chart) -> None:
    values = {
        "serviceAccount": {"create": False, "name": "prefixfleet-ops"},
        "rbac": {"scope": "namespace"},
        "operator": {"watchNamespaces": ["team-a"]},
    }
    objects = render(chart, values)
    assert not by_kind(objects, "ServiceAccount")
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "prefixfleet-ops"
    subjects = [s for o in objects if o["kind"].endswith("Binding") for s in o["subjects"]]
    assert len(subjects) == 2  # the ClusterRoleBinding and team-a's RoleBinding
    account = {"kind": "ServiceAccount", "name": "prefixfleet-ops", "namespace": NAMESPACE}
    assert all(s == account for s in subjects)
