"""A long OpenAI completion streamed on a thread while a test does something else (a failover, a freeze)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.conftest import ServerCalls


class BackgroundStream:
    def __init__(self, server: ServerCalls, model: str):
        self.lines: list[str] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, model), daemon=True)
        self._thread.start()

    def _run(self, server: ServerCalls, model: str) -> None:
        body = {"model": model, "prompt": "x", "max_tokens": 8000, "stream": True}   # fits the 8192 context
        with server.stream_request("POST", "/v1/completions", json=body, headers=server.headers, timeout=60) as r:
            for line in r.iter_lines():
                self.lines.append(line)
                if self._closing.is_set():
                    return  # closes the connection: the server forgets the request

    def close(self, timeout: float = 20) -> None:
        self._closing.set()
        self.join(timeout)

    def join(self, timeout: float = 20) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"

    def ended_with_error(self, code: str) -> bool:
        """The SSE ended as an aborted request does: an error chunk, then [DONE]."""
        data = [line for line in self.lines if line.startswith("data: ")]
        return len(data) >= 2 and f'"{code}"' in data[-2] and data[-1] == "data: [DONE]"
