"""The operators' JSON routes: /api/* (the pool, loads, settings, history, telemetry), /health, /metrics."""
