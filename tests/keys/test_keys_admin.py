"""Keys in the admin of a real server: a key made there is shown once (in the message after the save)
and stored hashed; revoking it there is refused at once, with no wait for the next read of the keys,
since the change happens in the serving process; a rotation gives a new secret the same way."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from tests.access_fixtures import csrf_token
from tests.conftest import DEMO, ROOT
from tests.keys.helpers import BOOT, bearer, status

USER, PASSWORD = "admin", "a-long-test-password-8"
SHOWN = re.compile(r"is (?:now )?(omlx-[A-Za-z0-9_-]+)")


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir}, OMLX_API_KEY=BOOT)


@pytest.fixture(scope="module")
def admin(server):
    env = {**server.env, "DJANGO_SUPERUSER_USERNAME": USER, "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
           "DJANGO_SUPERUSER_EMAIL": "admin@example.com"}
    done = subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with httpx.Client(base_url=server.url, timeout=60) as client:
        page = client.get("/admin/login/")
        reply = client.post("/admin/login/", data={"csrfmiddlewaretoken": csrf_token(page.text), "username": USER,
                                                   "password": PASSWORD, "next": "/admin/"})
        assert reply.status_code == 302, reply.text[:2000]
        yield client


def act(admin, action: str, pk: str) -> str:
    """Run an admin action on one key; the changelist page after it."""
    page = admin.get("/admin/keys/apikey/")
    reply = admin.post("/admin/keys/apikey/", data={"csrfmiddlewaretoken": csrf_token(page.text), "action": action,
                                                    "_selected_action": pk, "index": "0"}, follow_redirects=True)
    assert reply.status_code == 200, reply.text[:2000]
    return reply.text


def test_a_key_made_in_the_admin_is_shown_once_and_a_revoke_there_is_refused_at_once(server, admin):
    form = admin.get("/admin/keys/apikey/add/")
    assert form.status_code == 200
    saved = admin.post("/admin/keys/apikey/add/", data={
        "csrfmiddlewaretoken": csrf_token(form.text), "name": "from-admin", "models": DEMO, "rate_per_minute": "",
        "_save": "Save"}, follow_redirects=True)
    assert saved.status_code == 200, saved.text[:3000]
    plain = SHOWN.search(saved.text)[1]
    assert status(server, plain) == 200                     # at once: the save invalidated the copy
    listing = admin.get("/admin/keys/apikey/").text
    assert "from-admin" in listing and plain not in listing and plain[:12] in listing
    pk = re.search(r'href="/admin/keys/apikey/(\d+)/change/', listing)[1]
    assert plain not in admin.get(f"/admin/keys/apikey/{pk}/change/").text

    rotated = SHOWN.search(act(admin, "rotate", pk))[1]
    assert status(server, plain) == 401 and status(server, rotated) == 200
    act(admin, "revoke", pk)
    assert status(server, rotated) == 401                   # no wait: refused by the very next request
    assert status(server, BOOT) == 200


def test_a_bad_name_is_refused_by_the_form(server, admin):
    form = admin.get("/admin/keys/apikey/add/")
    reply = admin.post("/admin/keys/apikey/add/", data={
        "csrfmiddlewaretoken": csrf_token(form.text), "name": "bootstrap", "models": "", "_save": "Save"})
    assert reply.status_code == 200 and "names OMLX_API_KEY" in reply.text
    assert server.fetch("GET", "/v1/models", headers=bearer("bootstrap"), timeout=10).status_code == 401
