"""/ws/pool/: the whole pool snapshot on connect and on every broadcast; actions from the page.

Actions go through the same pool calls and services as the JSON API and the admin. Every answer
is the new whole snapshot or {"type": "error", "message": ...}; a bad message never closes the
connection."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from pool import services
from pool.errors import InvalidRequest, PoolError
from pool.observe.broadcast import GROUP
from pool.runtime import ready_runtime
from pool.strict_json import dumps_finite, loads_strict

from .access import may_connect, same_origin

log = logging.getLogger(__name__)

ACTIONS = ("pin", "unpin", "load", "unload", "set_ttl")
# A load or unload is awaited this long; a longer one carries on and broadcasts carry its progress.
SETTLE_SECONDS = 0.2
REFUSED = 4403


class PoolConsumer(AsyncJsonWebsocketConsumer):
    joined = False

    @classmethod
    async def encode_json(cls, content):
        return dumps_finite(content)

    async def connect(self):
        client = (self.scope.get("client") or [None])[0]
        headers = self.scope.get("headers", [])
        if not same_origin(headers) or not may_connect(self.scope.get("user"), client, headers):
            await self.close(code=REFUSED)  # before accept: the handshake is refused (HTTP 403)
            return
        self.pending: set[asyncio.Task] = set()
        runtime = ready_runtime()
        await self.channel_layer.group_add(GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self.send_json(runtime.snapshot())

    async def disconnect(self, code):
        if self.joined:
            self.joined = False
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def pool_snapshot(self, event):
        await self.send(text_data=event["text"])  # encoded once by the broadcaster

    # ---- client messages ---------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            message = loads_strict(text_data if text_data is not None else bytes_data)
        except (TypeError, ValueError):
            await self.send_error('malformed JSON: send {"action": "pin", "model": "<id>"}')
            return
        await self.receive_json(message)

    async def receive_json(self, content, **kwargs):
        action = content.get("action") if isinstance(content, dict) else None
        try:
            snapshot = await self.act(content)
        except PoolError as e:
            await self.send_error(e.message, action=action, code=e.code)
            return
        except Exception as e:
            log.exception("dashboard action %r failed", action)
            await self.send_error(f"internal error: {type(e).__name__}", action=action)
            return
        snapshot["reply_to"] = action
        await self.send_json(snapshot)

    async def act(self, message: Any) -> dict:
        if not isinstance(message, dict):
            raise InvalidRequest('send a JSON object: {"action": ..., "model": ...}')
        action, model = message.get("action"), message.get("model")
        if action not in ACTIONS:
            raise InvalidRequest(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' must be a model id")
        runtime = ready_runtime()
        router = runtime.router
        model_id = router.resolve(model).model_id
        if action in ("pin", "unpin"):
            await services.update_model_settings(router=router, name=model_id, changes={"is_pinned": action == "pin"})
        elif action == "set_ttl":
            if "ttl_seconds" not in message:
                raise InvalidRequest("'set_ttl' needs 'ttl_seconds': seconds, or null for the global default")
            await services.update_model_settings(router=router, name=model_id,
                                                changes={"ttl_seconds": message["ttl_seconds"]})
        elif action == "load":
            await self.settle(router.load(model_id), action)
        else:
            force = message.get("force", False)
            if not isinstance(force, bool):
                raise InvalidRequest("'force' must be true or false")
            await self.settle(router.unload(model_id, force=force), action)
        return runtime.snapshot()

    async def settle(self, coro, action: str) -> None:
        """Await a load or unload briefly: refusals (507, 409) come back at once as errors. A longer
        one goes on without blocking this connection, and a late failure still reaches this page."""
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=SETTLE_SECONDS)
        if task in done:
            task.result()
            return
        self.pending.add(task)
        task.add_done_callback(lambda t: self._late(t, action))

    def _late(self, task: asyncio.Task, action: str) -> None:
        self.pending.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        if not isinstance(error, PoolError):
            log.error("dashboard %s failed", action, exc_info=error)
        if self.joined:
            message = error.message if isinstance(error, PoolError) else f"internal error: {type(error).__name__}"
            asyncio.ensure_future(self.send_error(message, action=action, code=getattr(error, "code", None)))

    async def send_error(self, message: str, *, action: Any = None, code: str | None = None) -> None:
        body = {"type": "error", "message": message}
        if isinstance(action, str):
            body["action"] = action
        if code:
            body["code"] = code
        await self.send_json(body)
