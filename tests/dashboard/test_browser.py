"""The dashboard in real Chromium (Debian's package, driven by Playwright) against a real server:
pin a model and see it persisted, load a second model under a small budget and watch the eviction
arrive without reloading the page. Screenshots land in test-artifacts/. (`browser`: conftest.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
import threading

from tests.conftest import ARTIFACTS, DEMO, ROOT

SECOND = "dash-60"


def test_pin_load_and_watch_an_eviction(start_server, make_model, browser):
    from playwright.sync_api import expect

    # The demo (~115 MB) fits with its KV headroom; the demo plus a 60 MB model does not, so
    # loading the second evicts the demo.
    server = start_server({SECOND: make_model(SECOND, 60)}, OMLX_MAX_MODEL_MEMORY="160MB",
                          OMLX_MEMORY_CEILING="2GB", OMLX_MAX_CONCURRENT=1)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # /api/telemetry may not exist on this server yet: the chart then fills in live.
    page.on("response", lambda r: r.status >= 400 and "/api/telemetry" not in r.url
            and errors.append(f"{r.status} {r.url}"))
    page.goto(server.url + "/")

    demo = page.locator(f'#models tbody tr[data-id="{DEMO}"]')
    second = page.locator(f'#models tbody tr[data-id="{SECOND}"]')
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(demo).to_be_visible()
    expect(demo.locator(".state .badge")).to_have_text("unloaded")
    page.evaluate("window.__sameDocument = true")

    demo.locator("button.pin").click()
    expect(demo.locator(".badges")).to_contain_text("pinned")
    assert server.get(f"/admin/model/{DEMO}/settings").json()["is_pinned"] is True
    demo.locator("button.pin").click()
    expect(demo.locator("button.pin")).to_have_text("pin")
    assert server.get(f"/admin/model/{DEMO}/settings").json()["is_pinned"] is False

    demo.locator("button.load").click()
    expect(demo.locator(".state .badge")).to_have_text("loaded", timeout=60_000)
    expect(demo.locator(".badges")).to_contain_text("next victim")
    second.locator("button.load").click()
    expect(second.locator(".state .badge")).to_have_text("loaded", timeout=60_000)

    eviction = page.locator(f'#events tbody tr[data-model="{DEMO}"][data-reason="lru"]')
    expect(eviction).to_have_count(1, timeout=20_000)
    expect(eviction).to_contain_text(SECOND)   # the request's model that caused it
    expect(eviction.locator("a").first).to_have_attribute("href", f"/admin/pool/evictionevent/?model_id={DEMO}")
    expect(demo.locator(".state .badge")).to_have_text("unloaded")
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
    assert page.locator("#chart canvas").count() == 1

    # a chat fills the loaded model's prompt cache: its memory bar grows a cache segment and a hit rate
    for _ in range(2):
        assert server.chat(SECOND).status_code == 200
    expect(second.locator(".kvnote")).to_contain_text("50% hits")
    expect(second.locator(".kvbar")).to_have_attribute("title", re.compile(r"prompt cache [1-9]"))
    assert float(second.locator(".seg.pcache").evaluate("e => parseFloat(e.style.width)")) > 0

    # one request runs (OMLX_MAX_CONCURRENT=1) and one waits for its slot: the row shows both
    stream = server.stream(SECOND)
    waiting = threading.Thread(target=server.chat, args=(SECOND,))
    waiting.start()
    expect(second.locator(".active .running")).to_have_text("1")
    expect(second.locator(".active .queued")).to_have_text("1 queued")

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(ARTIFACTS / "dashboard-phone.png"), full_page=True)
    stream.close()
    waiting.join(60)
    expect(second.locator(".active .queued")).to_have_text("")
    expect(second.locator(".active .running")).to_have_text("0")
    assert not errors, errors


def test_reconnects_after_the_server_restarts(start_server, browser):
    server = start_server()
    page = browser.new_page()
    page.goto(server.url + "/")
    conn = page.locator("#conn")
    from playwright.sync_api import expect

    expect(conn).to_have_attribute("data-state", "live")
    server.stop()
    expect(conn).to_have_attribute("data-state", "offline", timeout=10_000)
    expect(page.locator("#disconnected")).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-disconnected.png"))
    server.start()
    expect(conn).to_have_attribute("data-state", "live", timeout=30_000)
    expect(page.locator("#disconnected")).to_be_hidden()
    expect(page.locator(f'#models tbody tr[data-id="{DEMO}"]')).to_be_visible()


def test_with_an_api_key_a_staff_login_opens_the_page_and_its_websocket(start_server, browser):
    from playwright.sync_api import expect

    server = start_server(OMLX_API_KEY="secret-key")
    subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", "boss",
                    "--email", "boss@example.com"], cwd=ROOT, check=True, capture_output=True,
                   env={**server.env, "DJANGO_SUPERUSER_PASSWORD": "correct horse"})
    page = browser.new_page()
    page.goto(server.url + "/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "boss")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_url(server.url + "/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(page.locator(f'#models tbody tr[data-id="{DEMO}"]')).to_be_visible()
