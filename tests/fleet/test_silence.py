"""The hop's read deadline, in this process: the decision after a silence (a table), and Hop.read,
which waits on a busy host that answers /health and gives up on one that does not."""

import asyncio
import time

import pytest

from pool.fleet.proxy import Frozen, Hop
from pool.fleet.silence import Verdict, after_silence, health_seconds


@pytest.mark.parametrize("host_answers, client_has_bytes, verdict", [
    (True, False, Verdict.WAIT),        # a long prompt or an answer sent whole: busy, not frozen
    (True, True, Verdict.WAIT),         # a slow stream
    (False, False, Verdict.RETRY),      # frozen before its answer began: another host may serve it
    (False, True, Verdict.END),         # frozen mid-stream: the dialect's error event, then the end
])
def test_after_silence(host_answers, client_has_bytes, verdict):
    assert after_silence(host_answers=host_answers, client_has_bytes=client_has_bytes) == verdict


@pytest.mark.parametrize("deadline, seconds", [(10, 2.0), (3, 2.0), (1, 1.0), (0.5, 0.5)])
def test_health_seconds(deadline, seconds):
    assert health_seconds(deadline) == seconds


def hop(deadline: float | None, answers: bool) -> tuple[Hop, list[float]]:
    asked: list[float] = []
    found = Hop("http://nowhere.invalid", "h2", deadline)

    async def answer() -> bool:
        asked.append(time.monotonic())
        return answers
    found.answers = answer      # type: ignore[method-assign]
    return found, asked


async def test_a_silent_host_that_answers_health_is_waited_for():
    busy, asked = hop(0.1, answers=True)
    assert await busy.read(asyncio.sleep(0.35, result=b"late"), client_has_bytes=False) == b"late"
    assert len(asked) == 3, asked


async def test_a_silent_host_that_does_not_answer_health_is_frozen_and_the_read_cancelled():
    frozen, asked = hop(0.1, answers=False)
    never = asyncio.ensure_future(asyncio.sleep(60))
    started = time.monotonic()
    with pytest.raises(Frozen, match="h2 sent nothing for 0.1 s"):
        await frozen.read(never, client_has_bytes=True)
    assert time.monotonic() - started < 1 and len(asked) == 1
    assert never.cancelled()


async def test_without_a_deadline_a_read_is_not_watched():
    unbounded, asked = hop(None, answers=False)
    assert await unbounded.read(asyncio.sleep(0.2, result=b"x"), client_has_bytes=False) == b"x"
    assert asked == []
