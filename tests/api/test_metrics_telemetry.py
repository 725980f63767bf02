"""/metrics and /api/telemetry through the ASGI application in this process: the metric families after a request, the
enforcer's ticks as a time series, parameter errors, and who may read what."""

import json
import sqlite3

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DEMO

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder

FIELDS = {"t", "usage", "active", "cache", "rss", "model_bytes", "ceiling", "soft", "hard", "level", "loaded"}


def ask(server):
    reply = server.post("/v1/chat/completions", {"model": DEMO, "max_tokens": 3,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text


def scrape(server) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from /metrics, parsed as Prometheus text."""
    response = server.fetch("GET", "/metrics", timeout=30)   # no key, like /health
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def telemetry(server, **params):
    return server.get("/api/telemetry", params=params)


def test_metrics_and_telemetry_after_a_request(start_asgi_server):
    server = start_asgi_server()
    ask(server)

    metrics = scrape(server)
    assert metrics[("model_loads_total", ())] >= 1
    assert metrics[("model_load_seconds_total", ())] > 0
    assert metrics[("requests_total", (("model", DEMO),))] >= 1
    assert metrics[("loaded_models", ())] == 1
    assert metrics[("active_requests", (("model", DEMO),))] == 0
    assert metrics[("model_state", (("model", DEMO), ("state", "loaded")))] == 1
    for gauge in ("memory_usage_bytes", "memory_active_bytes", "memory_rss_bytes", "memory_ceiling_bytes",
                  "model_bytes", "model_budget_bytes"):
        assert metrics[(gauge, ())] > 0, gauge
    assert metrics[("memory_soft_bytes", ())] < metrics[("memory_hard_bytes", ())] <= metrics[
        ("memory_ceiling_bytes", ())]
    assert metrics[("memory_pressure_level", ())] == 0
    assert metrics[("memory_pressure", (("level", "ok"),))] == 1
    assert metrics[("admission_paused", ())] == 0

    ask(server)
    assert scrape(server)[("requests_total", (("model", DEMO),))] == metrics[("requests_total", (("model", DEMO),))] + 1

    # the enforcer ticks every second while woken; requests wake it
    def enough_points():
        ask(server)
        points = telemetry(server).json()["points"]
        return points if len(points) >= 3 and any(p["loaded"] for p in points) else None
    points = server.wait_for(enough_points, timeout=60, interval=0.5)
    assert all(set(p) == FIELDS for p in points)
    times = [p["t"] for p in points]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert all(p["usage"] > 0 and p["rss"] > 0 and p["level"] == "ok" for p in points)
    assert all(p["soft"] < p["hard"] <= p["ceiling"] for p in points)
    assert max(p["model_bytes"] for p in points) > 0

    body = telemetry(server, since=times[-1]).json()
    assert [p["t"] for p in body["points"]][:1] == [times[-1]] and body["step"] is None
    bucketed = telemetry(server, since=times[0], step=3600).json()
    assert bucketed["step"] == 3600 and 1 <= len(bucketed["points"]) <= 2
    assert max(p["usage"] for p in bucketed["points"]) >= max(p["usage"] for p in points)
    # a week in 1 s steps would be 604,800 points: the step widens to stay under the cap
    wide = telemetry(server, since=times[-1] - 7 * 86400, step=1).json()
    assert wide["step"] >= 7 * 86400 / 2000

    # the series lives in its own WAL file in OMLX_HOME
    with sqlite3.connect(server.home / "telemetry.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unload_counts_an_eviction(start_asgi_server):
    server = start_asgi_server()
    ask(server)
    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200
    server.wait_for(lambda: scrape(server).get(("evictions_total", (("reason", "manual"),))) == 1)
    metrics = scrape(server)
    assert metrics[("pool_events_total", (("reason", "manual"),))] == 1
    assert metrics[("loaded_models", ())] == 0
    assert metrics[("model_loads_total", ())] == 1


def test_bad_parameters_are_named(start_asgi_server):
    server = start_asgi_server()
    for params, param in (({"since": "abc"}, "since"), ({"step": "0"}, "step"), ({"step": "x"}, "step"),
                          ({"until": "nan"}, "until"), ({"since": "inf"}, "since")):
        response = telemetry(server, **params)
        assert response.status_code == 400, (params, response.text)
        error = response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert param in error["message"]
    assert server.post("/api/telemetry", {}).status_code == 405


def test_metrics_and_telemetry_need_the_key(start_asgi_server):
    server = start_asgi_server(OMLX_API_KEY="sekret")
    refused = server.fetch("GET", "/metrics", timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert server.get("/metrics").status_code == 200
    refused = server.fetch("GET", "/api/telemetry", timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert telemetry(server).status_code == 200


def test_pressure_and_admission_rejections(start_asgi_server):
    server = start_asgi_server(OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="10GB", OMLX_ADMISSION_WAIT="1")
    (server.home / "fake_probe.json").write_text(json.dumps({"rss": 9.2e9, "cache": 0}))   # over the soft line
    assert server.post("/api/enforcer/tick", {}).json()["level"] == "soft"
    refused = server.post("/v1/chat/completions", {"model": DEMO, "max_tokens": 3,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 503, refused.text

    metrics = scrape(server)
    assert metrics[("admission_rejections_total", (("reason", "timeout"),))] == 1
    assert metrics[("memory_pressure_level", ())] == 1
    assert metrics[("memory_pressure", (("level", "soft"),))] == 1
    assert metrics[("admission_paused", ())] == 1
    assert metrics[("memory_usage_bytes", ())] == 9.2e9
    assert ("requests_total", (("model", DEMO),)) not in metrics   # refused before reaching the pool
    last = telemetry(server).json()["points"][-1]
    assert (last["level"], last["usage"], last["ceiling"]) == ("soft", 9.2e9, 10e9)


def test_a_discrete_gpus_floor_is_counted_shown_and_pushes_the_pressure(start_asgi_server):
    """On a discrete GPU the process holds memory beyond MLX's buffers (the CUDA context, libraries'
    workspaces: 2.4 GB on an H100 after an unload): the driver's count for the process, less MLX's,
    is the floor that usage counts, that the snapshot and /metrics show, and that pressure sees."""
    server = start_asgi_server(OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="10GB")
    probe = {"discrete_gpu": True, "device_total": 80e9, "active": 5e9, "cache": 1e9, "rss": 1e9}
    (server.home / "fake_probe.json").write_text(json.dumps({**probe, "device_process": 6.5e9}))
    assert server.post("/api/enforcer/tick", {}).json()["level"] == "ok"
    memory = server.pool()["memory"]
    assert (memory["device_floor_bytes"], memory["usage_bytes"]) == (0.5e9, 6.5e9)
    assert scrape(server)[("memory_device_floor_bytes", ())] == 0.5e9

    (server.home / "fake_probe.json").write_text(json.dumps({**probe, "device_process": 9e9}))   # 3 GB beside MLX
    assert server.post("/api/enforcer/tick", {}).json()["level"] == "soft"
    assert server.pool()["memory"]["usage_bytes"] == 9e9
    (server.home / "fake_probe.json").write_text(json.dumps({**probe, "device_process": None}))  # not known
    memory = server.pool()["memory"]
    assert (memory["device_floor_bytes"], memory["usage_bytes"]) == (None, 6e9)
    assert ("memory_device_floor_bytes", ()) not in scrape(server)
