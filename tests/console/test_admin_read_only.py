"""The admin shows the rows console/services/ own without writing them; nodes are registered
there, their state and heartbeat left to the controller."""

import pytest

from console.models import Job, Node
from tests.factories import NodeFactory, UserFactory, make_job

pytestmark = pytest.mark.django_db

SERVICE_OWNED = [
    "job", "operator", "replica", "faultinjection", "jobupgrade", "recoveryepisode", "metricsample",
]  # fmt: skip


@pytest.fixture
def superuser(client):
    """A client logged in as a superuser: every model permission, so only the admin refuses."""
    user = UserFactory(username="root")
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)
    return client


@pytest.mark.parametrize("model", SERVICE_OWNED)
def test_service_owned_rows_are_listed_but_not_added(superuser, model):
    assert superuser.get(f"/admin/console/{model}/").status_code == 200
    assert superuser.get(f"/admin/console/{model}/add/").status_code == 403


def test_a_job_is_shown_but_not_changed_or_deleted(superuser):
    job = make_job(status=Job.Status.RUNNING)
    page = superuser.get(f"/admin/console/job/{job.pk}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    changed = superuser.post(
        f"/admin/console/job/{job.pk}/change/",
        {"name": job.name, "topology": job.topology, "strategy": Job.Strategy.ACTIVE_ALL},
    )
    assert changed.status_code == 403
    deleted = superuser.post(f"/admin/console/job/{job.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 403
    job.refresh_from_db()
    assert (job.strategy, job.status) == (Job.Strategy.ADAPTIVE, Job.Status.RUNNING)


def test_a_node_is_registered_in_the_admin(superuser):
    response = superuser.post(
        "/admin/console/node/add/",
        {"name": "node-9", "cpu_total": 8, "mem_total_mb": 16384, "disk_max_mbps": 200,
         "bw_total_mbps": 1000, "state": Node.State.UP},
    )  # fmt: skip
    assert response.status_code == 302
    node = Node.objects.get(name="node-9")
    # The state is the controller's, from the agent's heartbeats: the form does not set it.
    assert (node.cpu_total, node.state) == (8, Node.State.UNKNOWN)


def test_a_nodes_state_is_not_edited_in_the_admin(superuser):
    node = NodeFactory(name="node-1", state=Node.State.UP)
    superuser.post(
        f"/admin/console/node/{node.pk}/change/",
        {"name": "node-1", "cpu_total": 2, "mem_total_mb": 4096, "disk_max_mbps": 200,
         "bw_total_mbps": 1000, "state": Node.State.DOWN},
    )  # fmt: skip
    node.refresh_from_db()
    assert (node.cpu_total, node.state) == (2, Node.State.UP)
