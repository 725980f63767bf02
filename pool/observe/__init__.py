"""What operators see of the pool: Prometheus metrics, the memory time series (telemetry), and
the snapshots broadcast to the dashboard."""
