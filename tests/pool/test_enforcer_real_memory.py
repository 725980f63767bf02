"""The enforcer with real memory: the ceiling just above what two loaded models use; loading a
third through the API crosses the hard line, and the enforcer brings usage back under soft."""

import pytest

MB = 10**6


@pytest.fixture(scope="module")
def models(make_model):
    return {name: make_model(f"real-{name}", 150, seed=20 + i) for i, name in enumerate("abc")}


def test_a_third_load_is_brought_back_under_soft(start_server, models):
    probe = start_server(models, demo=False, OMLX_MEMORY_CEILING="off")
    for name in "ab":
        assert probe.post(f"/api/models/{name}/load", {}).status_code == 200
    two = probe.pool()["memory"]["usage_bytes"]
    probe.stop()

    ceiling = int((two + 75 * MB) / 0.90)  # soft line 75 MB above two models, hard line below three
    server = start_server(models, demo=False, OMLX_MEMORY_CEILING=str(ceiling))
    for name in "ab":
        assert server.post(f"/api/models/{name}/load", {}).status_code == 200
    memory = server.pool()["memory"]
    assert memory["level"] == "ok" and memory["usage_bytes"] < memory["soft_bytes"]

    assert server.post("/api/models/c/load", {}).status_code == 200
    settled = server.wait_for(lambda: (m := server.pool()["memory"])["usage_bytes"] < m["soft_bytes"]
                              and m["level"] == "ok" and server.model("a")["state"] == "unloaded" and m, timeout=20)
    states = {m["id"]: m["state"] for m in server.pool()["models"]}
    assert states == {"a": "unloaded", "b": "loaded", "c": "loaded"}  # the least recently used went
    events = server.get("/api/evictions").json()["events"]
    eviction = next(e for e in events if e["model"] == "a")
    assert eviction["reason"] in ("pressure_hard", "pressure_soft", "emergency")
    assert eviction["freed_bytes"] >= 0.9 * 150 * MB
    assert eviction["bytes_before"] >= settled["soft_bytes"] > eviction["bytes_after"]

    # the telemetry tells the same story: a tick under pressure, then usage back under soft
    def series():
        points = server.get("/api/telemetry", params={"since": 0}).json()["points"]
        pressed = [i for i, p in enumerate(points) if p["level"] in ("soft", "hard", "emergency")]
        return pressed and any(p["level"] == "ok" and p["usage"] < p["soft"] for p in points[pressed[0]:]) and points
    points = server.wait_for(series, timeout=20)
    assert all(p["ceiling"] == ceiling for p in points)
