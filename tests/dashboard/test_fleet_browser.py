"""One dashboard for a fleet, in real Chromium: two real hosts (`manage.py serve`) meet in one Redis;
each host's page shows both within seconds; a load and a pin clicked on alpha's page for a model that
only beta has happen on beta; a host that stops leaves the pages. Screenshot in test-artifacts/."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ARTIFACTS, serve

ALPHA_MODEL, BETA_MODEL = "fleet-a", "fleet-b"
KEY = "fleet-test-key"


@pytest.fixture
def two_hosts(tmp_path, migrated_db, make_model, redis_url):
    """alpha (with fleet-a) and beta (with fleet-b), each with its own SQLite, on one Redis."""
    models = {"alpha": {ALPHA_MODEL: make_model("fleet-a-20", 20)},
              "beta": {BETA_MODEL: make_model("fleet-b-20", 20, seed=1)}}

    def start(host: str):
        return serve(tmp_path / host, migrated_db, models[host], OMLX_REDIS_URL=redis_url, OMLX_FLEET_KEY=KEY,
                     OMLX_HOST_ID=host, OMLX_MEMORY_CEILING="off")

    with ThreadPoolExecutor(2) as starting:
        servers = list(starting.map(start, ["alpha", "beta"]))
    yield servers
    for server in servers:
        server.stop()


def open_page(browser, server, errors: list[str]):
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    page.on("pageerror", lambda e: errors.append(f"{server.url}: {e}"))
    page.on("response", lambda r: r.status >= 400 and "/api/telemetry" not in r.url
            and errors.append(f"{r.status} {r.url}"))
    page.goto(server.url + "/")
    return page


def test_each_page_shows_the_fleet_and_acts_on_the_right_host(two_hosts, browser):
    from playwright.sync_api import expect

    alpha, beta = two_hosts
    errors: list[str] = []
    pages = {name: open_page(browser, server, errors) for name, server in (("alpha", alpha), ("beta", beta))}
    for name, page in pages.items():
        expect(page.locator("#conn")).to_have_attribute("data-state", "live")
        hosts = page.locator("#fleet article.host")
        expect(hosts).to_have_count(2, timeout=5_000)
        expect(page.locator('#fleet article.host[data-host="alpha"] h3')).to_have_text("alpha")
        expect(page.locator('#fleet article.host[data-host="beta"] h3')).to_have_text("beta")
        expect(page.locator(f'#fleet article.host[data-host="{name}"] .here')).to_be_visible()
        expect(page.locator("#fleet-count")).to_have_text("2 hosts")

    page = pages["alpha"]
    page.evaluate("window.__sameDocument = true")
    beta_card = page.locator('#fleet article.host[data-host="beta"]')
    row = beta_card.locator(f'tr[data-id="{BETA_MODEL}"]')
    expect(row).to_have_attribute("data-state", "unloaded")
    assert page.locator(f'#models tbody tr[data-id="{BETA_MODEL}"]').count() == 0, "alpha's own table has it"

    # a load on alpha's page, for beta's model: beta loads it, and alpha's page sees it there
    row.locator("button.load").click()
    beta.wait_for(lambda: beta.model(BETA_MODEL)["state"] == "loaded", timeout=60)
    assert alpha.states() == {ALPHA_MODEL: "unloaded"}
    expect(row).to_have_attribute("data-state", "loaded", timeout=10_000)
    expect(row.locator("button.load")).to_have_text("unload")
    expect(beta_card.locator(".hostnums")).not_to_contain_text("models 0 B")
    on_beta = pages["beta"].locator(f'#models tbody tr[data-id="{BETA_MODEL}"] .on-hosts')
    expect(on_beta).to_have_text("loaded on beta (here)", timeout=10_000)

    # a pin for a model alpha does not know: written by beta, shown with where it is loaded
    row.locator("button.pin").click()
    beta.wait_for(lambda: beta.get(f"/admin/model/{BETA_MODEL}/settings").json()["is_pinned"], timeout=10)
    pin = page.locator(f'#fleet-pins tbody tr[data-id="{BETA_MODEL}"]')
    expect(pin.locator(".where")).to_have_text("beta", timeout=10_000)
    expect(row.locator("button.pin")).to_have_text("unpin")
    assert alpha.get(f"/admin/model/{ALPHA_MODEL}/settings").json()["is_pinned"] is False
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-fleet.png"), full_page=True)
    row.locator("button.pin").click()
    expect(pin).to_have_count(0, timeout=10_000)
    assert beta.get(f"/admin/model/{BETA_MODEL}/settings").json()["is_pinned"] is False

    # an unload from alpha's page: on beta again, seen on both pages, with its history row and host
    row.locator("button.load").click()
    beta.wait_for(lambda: beta.model(BETA_MODEL)["state"] == "unloaded", timeout=30)
    expect(row).to_have_attribute("data-state", "unloaded", timeout=10_000)
    expect(on_beta).to_have_text("not loaded in the fleet", timeout=10_000)
    eviction = page.locator(f'#fleet-events tbody tr[data-host="beta"][data-model="{BETA_MODEL}"]')
    expect(eviction).to_have_count(1, timeout=10_000)

    # a host that stops publishing leaves the other host's page within seconds
    beta.stop()
    expect(page.locator("#fleet article.host")).to_have_count(1, timeout=10_000)
    expect(page.locator("#fleet-count")).to_have_text("1 host")
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
    assert not errors, errors
