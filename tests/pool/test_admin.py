"""The Django admin through a real running server: a staff login, the ModelSettings and EvictionEvent
changelists, the read-only history, and a settings change that reaches the running pool at once."""

import re
import sqlite3
import subprocess
import sys

import httpx
import pytest

from tests.access_fixtures import csrf_token
from tests.conftest import DEMO, ROOT

USER, PASSWORD = "admin", "a-long-test-password-7"
EVENT_LINK = re.compile(r'href="/admin/pool/evictionevent/(\d+)/change/')


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture
def admin_client(server):
    env = {**server.env, "DJANGO_SUPERUSER_USERNAME": USER, "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
           "DJANGO_SUPERUSER_EMAIL": "admin@example.com"}
    done = subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/admin/").status_code == 302  # not logged in yet
        page = client.get("/admin/login/")
        assert page.status_code == 200
        reply = client.post("/admin/login/", data={"csrfmiddlewaretoken": csrf_token(page.text), "username": USER,
                                                   "password": PASSWORD, "next": "/admin/"})
        assert reply.status_code == 302 and reply.headers["location"] == "/admin/", reply.text[:2000]
        assert client.get("/admin/").status_code == 200
        yield client


def test_admin_settings_change_reaches_the_running_pool(server, admin_client):
    created = server.post(f"/admin/model/{DEMO}/settings", {"ttl_seconds": 600})
    assert created.status_code == 200 and created.json()["ttl_seconds"] == 600
    assert server.model(DEMO)["pinned"] is False

    changelist = admin_client.get("/admin/pool/modelsettings/")
    assert changelist.status_code == 200 and DEMO in changelist.text
    pk = re.search(r'href="/admin/pool/modelsettings/(\d+)/change/', changelist.text)[1]
    form = admin_client.get(f"/admin/pool/modelsettings/{pk}/change/")
    assert form.status_code == 200
    reply = admin_client.post(f"/admin/pool/modelsettings/{pk}/change/", data={
        "csrfmiddlewaretoken": csrf_token(form.text), "model_id": DEMO, "is_pinned": "on", "ttl_seconds": "600",
        "temperature": "", "top_p": "", "max_tokens": "", "alias": "", "display_name": "", "notes": "",
        "_save": "Save",
    })
    assert reply.status_code == 302, reply.text[:3000]

    model = server.model(DEMO)  # at once: save_model applies the row to the running pool
    assert model["pinned"] is True and model["ttl_seconds"] == 600
    assert server.get(f"/admin/model/{DEMO}/settings").json()["is_pinned"] is True


def test_eviction_history_is_read_only_and_filterable(server, admin_client):
    assert server.post(f"/api/models/{DEMO}/load", {}).status_code == 200
    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200  # records a "manual" event

    changelist = admin_client.get("/admin/pool/evictionevent/")
    assert changelist.status_code == 200 and DEMO in changelist.text
    assert "/admin/pool/evictionevent/add/" not in changelist.text
    assert admin_client.get("/admin/pool/evictionevent/add/").status_code == 403

    manual = admin_client.get("/admin/pool/evictionevent/?reason=manual")
    assert manual.status_code == 200 and len(EVENT_LINK.findall(manual.text)) == 1
    lru = admin_client.get("/admin/pool/evictionevent/?reason=lru")
    assert lru.status_code == 200 and EVENT_LINK.findall(lru.text) == [] and "0 eviction events" in lru.text

    pk = EVENT_LINK.search(changelist.text)[1]
    detail = admin_client.get(f"/admin/pool/evictionevent/{pk}/change/")
    assert detail.status_code == 200 and 'name="_save"' not in detail.text  # a view, not a form
    form = admin_client.get("/admin/pool/modelsettings/")  # a fresh token for the refused post
    refused = admin_client.post(f"/admin/pool/evictionevent/{pk}/delete/",
                                data={"csrfmiddlewaretoken": csrf_token(form.text), "post": "yes"})
    assert refused.status_code == 403


def test_the_admin_refuses_an_alias_that_is_another_models_id(server, admin_client):
    form = admin_client.get("/admin/pool/modelsettings/add/")
    assert form.status_code == 200
    fields = {"csrfmiddlewaretoken": csrf_token(form.text), "model_id": "another-model", "ttl_seconds": "",
              "temperature": "", "top_p": "", "max_tokens": "", "display_name": "", "notes": "", "_save": "Save"}
    refused = admin_client.post("/admin/pool/modelsettings/add/", data={**fields, "alias": DEMO})
    assert refused.status_code == 200 and "is the id of another model" in refused.text   # the form, again
    out_of_range = admin_client.post("/admin/pool/modelsettings/add/", data={**fields, "temperature": "3"})
    assert out_of_range.status_code == 200 and "must be between 0 and 2" in out_of_range.text
    with sqlite3.connect(server.home / "omlx.sqlite3") as db:
        assert db.execute("select count(*) from pool_modelsettings where model_id = 'another-model'").fetchone() == (0,)
    saved = admin_client.post("/admin/pool/modelsettings/add/", data={**fields, "alias": "demo"})
    assert saved.status_code == 302, saved.text[:2000]
    changelist = admin_client.get("/admin/pool/modelsettings/")
    assert "another-model" in changelist.text and "demo" in changelist.text
