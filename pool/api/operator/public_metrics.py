"""What /metrics shows a client without the key when OMLX_METRICS_PUBLIC=1: every series, less the
samples labelled with a model id or an API key's name (their HELP and TYPE lines stay)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

MODEL_LABEL = "model"
KEY_LABEL = "key"


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def without_model_ids(text: bytes) -> bytes:
    families = list(text_string_to_metric_families(text.decode()))
    for family in families:
        family.samples = [s for s in family.samples if MODEL_LABEL not in s.labels and KEY_LABEL not in s.labels]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
