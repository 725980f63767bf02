"""What a memory reading counts against the ceiling (pool/memory.py), by backend: a table of cases."""

import pytest

from pool.memory import MemoryReading

GB = 10**9


@pytest.mark.parametrize("discrete, rss, device_process, usage, floor", [
    (False, 3 * GB, None, 3 * GB, None),           # CPU / unified memory: the larger of RSS and MLX's
    (False, 1 * GB, None, 2 * GB, None),
    (False, 1 * GB, 9 * GB, 2 * GB, None),         # a device count means nothing without a discrete GPU
    (True, 9 * GB, None, 2 * GB, None),            # a discrete GPU: MLX's buffers, RSS is host memory
    (True, 1 * GB, 4 * GB, 4 * GB, 2 * GB),        # ... and the process's floor beside them
    (True, 1 * GB, 1 * GB, 2 * GB, 0),             # a driver count below MLX's is no negative floor
])
def test_usage_and_floor(discrete, rss, device_process, usage, floor):
    reading = MemoryReading(active=int(1.5 * GB), cache=GB // 2, peak=0, rss=rss, total=16 * GB, available=8 * GB,
                            device_total=80 * GB if discrete else None, discrete_gpu=discrete,
                            device_process=device_process)
    assert (reading.usage, reading.device_floor) == (usage, floor)
    assert reading.as_dict()["device_floor"] == floor
