"""The console in real Chromium against real servers (`manage.py serve`): the playground's chat
streams and its request's row and trace appear with their numbers, live over the websocket; the
in-flight table's cancel button ends a stream; a model loading shows its bytes and time left. Then
the same console on a fleet's page. Screenshots land in test-artifacts/ (console.png,
console-fleet.png)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ARTIFACTS, DEMO, ROOT, serve

PASSWORD = "correct horse"


def staff_page(browser, server, errors: list[str], *, height: int = 1800):
    """A page logged in as staff (the cancel buttons are staff's), failing the test on any page error."""
    subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", "boss",
                    "--email", "boss@example.com"], cwd=ROOT, check=True, capture_output=True,
                   env={**server.env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return logged_in_page(browser, server, errors, height=height)


def logged_in_page(browser, server, errors: list[str], *, height: int = 1800):
    page = browser.new_page(viewport={"width": 1280, "height": height})
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: r.status >= 400 and "/api/telemetry" not in r.url
            and errors.append(f"{r.status} {r.url}"))
    page.goto(server.url + "/admin/login/?next=/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(server.url + "/")
    return page


def chat_in_playground(page, model: str, text: str, max_tokens: int = 8) -> str:
    """Send from the playground; returns its request's id once the answer has streamed."""
    from playwright.sync_api import expect

    page.select_option("#pg-model", model)
    page.fill("#pg-max", str(max_tokens))
    page.fill("#pg-prompt", text)
    page.click("#pg-send")
    expect(page.locator("#pg-output")).to_have_attribute("data-state", "done", timeout=60_000)
    return page.evaluate("window.omlxPlayground.mine.requestId")


def test_playground_streams_its_row_appears_and_cancel_ends_a_stream(start_server, browser):
    from playwright.sync_api import expect

    server = start_server(OMLX_MEMORY_CEILING="off")
    errors: list[str] = []
    page = staff_page(browser, server, errors)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(page.locator("#activity-empty")).to_be_visible()
    page.evaluate("window.__sameDocument = true")

    # the playground's chat streams: its output fills chunk by chunk while the request is in flight
    page.evaluate("""() => { window.__states = [];
        new MutationObserver(() => window.__states.push(document.getElementById('pg-output').dataset.state))
          .observe(document.getElementById('pg-output'), {attributes: true, childList: true, characterData: true,
                                                           subtree: true}); }""")
    request_id = chat_in_playground(page, DEMO, "Say hello", max_tokens=12)
    assert re.fullmatch(r"req_[0-9a-f]{24}", request_id or ""), request_id
    assert page.locator("#pg-output").inner_text().strip()
    assert page.evaluate("window.__states").count("streaming") >= 2, "the answer arrived in one piece"
    expect(page.locator("#pg-status")).to_contain_text("done")

    # its row appears in the activity table with its numbers, and its trace under the playground
    row = page.locator(f'#activity tbody tr[data-id="{request_id}"]')
    expect(row).to_have_count(1, timeout=10_000)
    expect(row).to_have_attribute("data-outcome", "ok")
    expect(row.locator("td.tokens")).to_have_text(re.compile(r"^\d+( \(\d+\))? · [1-9]\d*$"))
    expect(row.locator("td.ttft")).to_have_text(re.compile(r"\d+ (ms|s)"))
    expect(row.locator("td.total")).to_have_text(re.compile(r"\d+ (ms|s)"))
    expect(page.locator("#pg-trace")).to_be_visible()
    expect(page.locator("#pg-trace .trace-head")).to_contain_text(request_id)
    expect(page.locator('#pg-trace .tl-row[data-phase="decode"]')).to_have_count(1)
    trace = server.get(f"/api/requests/{request_id}").json()
    assert trace["completion_tokens"] >= 1 and trace["model"] == DEMO

    # a row opens its trace: the timeline and the memory it held
    row.click()
    expect(page.locator("#trace")).to_be_visible()
    expect(page.locator("#trace .trace-head")).to_contain_text(request_id)
    expect(page.locator('#trace .tl-row[data-phase="prefill"]')).to_have_count(1)
    expect(page.locator("#trace .trace-facts")).to_contain_text("KV held")

    # the filter hides it, and brings it back
    page.select_option('#activity-filters select[name="status"]', "error")
    expect(row).to_have_count(0)
    page.select_option('#activity-filters select[name="status"]', "")
    expect(row).to_have_count(1)

    # a long stream shows in flight with its phase; its cancel button ends it
    stream = server.stream(DEMO)
    live = page.locator("#inflight tbody tr")
    expect(live).to_have_count(1, timeout=10_000)
    expect(live.locator(".badge.phase")).to_have_text(re.compile("decoding|prefilling"))
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console.png"), full_page=True)
    live.locator("button.cancel").click()
    stream.join(30)
    assert stream.ended_with_error("request_cancelled"), stream.lines[-3:]
    expect(live).to_have_count(0)
    cancelled = page.locator('#activity tbody tr[data-outcome="cancelled"]')
    expect(cancelled).to_have_count(1, timeout=10_000)
    expect(page.locator("#perf .perf-model")).to_have_count(1)
    expect(page.locator(f'#perf .perf-model[data-model="{DEMO}"] .perf-note')).to_contain_text("TTFT p50")
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"

    # a page opened now reads what finished before it: both rows are there at once
    late = logged_in_page(browser, server, errors)
    expect(late.locator("#activity tbody tr")).to_have_count(2)
    late.set_viewport_size({"width": 390, "height": 844})
    late.screenshot(path=str(ARTIFACTS / "console-phone.png"), full_page=True)
    assert not errors, errors


def test_a_loading_model_shows_bytes_and_time_left(start_server, make_model, browser):
    """A model of 400 MB loads for long enough to be seen: its row gives bytes of total and an ETA."""
    from playwright.sync_api import expect

    big = "big-400"
    server = start_server({big: make_model(big, 400)}, OMLX_MEMORY_CEILING="off", OMLX_LOAD_GROUP_BYTES="8MB")
    errors: list[str] = []
    page = staff_page(browser, server, errors, height=1000)
    row = page.locator(f'#models tbody tr[data-id="{big}"]')
    expect(row).to_be_visible()
    page.evaluate(f"""() => {{ window.__notes = [];
        new MutationObserver(() => window.__notes.push(
            document.querySelector('#models tbody tr[data-id="{big}"] .state .note').textContent))
          .observe(document.querySelector('#models tbody tr[data-id="{big}"] .state .note'),
                   {{childList: true, characterData: true, subtree: true}}); }}""")
    row.locator("button.load").click()
    expect(row.locator(".state .badge")).to_have_text("loaded", timeout=120_000)
    notes = page.evaluate("window.__notes")
    pattern = re.compile(r"\d+(\.\d+)? (kB|MB|GB|B) of 4\d\d\.\d MB( · ~\d+ s left)?")
    assert any(pattern.fullmatch(n) for n in notes), notes
    assert not errors, errors


@pytest.fixture
def fleet_of_two(tmp_path, migrated_db, demo_model_dir, make_model, redis_url):
    """alpha (the demo model) and beta (a 20 MB model), each with its own SQLite, on one Redis."""
    models = {"alpha": {DEMO: demo_model_dir}, "beta": {"fleet-b": make_model("fleet-b-20", 20, seed=1)}}
    servers = [serve(tmp_path / host, migrated_db, models[host], OMLX_REDIS_URL=redis_url, OMLX_FLEET_KEY="fleet-key",
                     OMLX_HOST_ID=host, OMLX_MEMORY_CEILING="off") for host in ("alpha", "beta")]
    yield servers
    for server in servers:
        server.stop()


def test_the_console_on_a_fleets_page(fleet_of_two, browser):
    """The fleet's section above, the fleet's requests in the console below, each with its host: a chat
    from alpha's playground with beta's model is served and traced on beta, and shows here from beta's
    record; so does a request beta runs, in flight, without a cancel button (that is beta's page's)."""
    from playwright.sync_api import expect

    alpha, beta = fleet_of_two
    errors: list[str] = []
    page = staff_page(browser, alpha, errors, height=2400)
    expect(page.locator("#fleet article.host")).to_have_count(2, timeout=10_000)
    request_id = chat_in_playground(page, DEMO, "Say hello")
    here = page.locator(f'#activity tbody tr[data-id="{request_id}"]')
    expect(here).to_have_count(1, timeout=10_000)
    expect(here.locator("td.host")).to_have_text("alpha")
    expect(page.locator("#pg-trace")).to_be_visible()

    expect(page.locator('#pg-model option[value="fleet-b"]')).to_have_text(re.compile(r"on beta"))
    there_id = chat_in_playground(page, "fleet-b", "Say hello")
    assert re.fullmatch(r"req_[0-9a-f]{24}", there_id or ""), there_id
    assert alpha.get(f"/api/requests/{there_id}").status_code == 404      # traced on beta only
    expect(page.locator('#pg-model option[value="fleet-b"]')).to_have_text("fleet-b (on beta)")   # loaded now
    there = page.locator(f'#activity tbody tr[data-id="{there_id}"]')
    expect(there).to_have_count(1, timeout=10_000)
    expect(there).to_have_attribute("data-outcome", "ok")
    expect(there.locator("td.host")).to_have_text("beta")
    expect(there.locator("td.tokens")).to_have_text(re.compile(r"^\d+( \(\d+\))? · \d+$"))
    expect(page.locator("#pg-trace .trace-head")).to_contain_text(there_id)
    expect(page.locator("#pg-trace .trace-head")).to_contain_text("on beta")
    there.click()
    expect(page.locator("#trace .trace-head")).to_contain_text(there_id)
    page.fill('#activity-filters input[name="q"]', "beta")
    expect(page.locator("#activity tbody tr")).to_have_count(1)
    page.fill('#activity-filters input[name="q"]', "")
    expect(page.locator("#activity tbody tr")).to_have_count(2)

    stream = beta.stream("fleet-b")
    running = page.locator('#inflight tbody tr[data-host="beta"]')
    expect(running).to_have_count(1, timeout=10_000)
    expect(running.locator("button.cancel")).to_have_count(0)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console-fleet.png"), full_page=True)
    stream.close()
    expect(running).to_have_count(0, timeout=10_000)
    assert not errors, errors
