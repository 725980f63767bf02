"""/ws/pool/: the whole pool snapshot on connect and on every broadcast; actions from the page.

Actions go through the same pool calls and services as the JSON API and the admin. Every answer
is the new whole snapshot or {"type": "error", "message": ...}; a bad message never closes the
connection.

In a fleet (OMLX_REDIS_URL) the page also gets the whole fleet on connect ({"type": "fleet"}) and
every host's published record as it comes ({"type": "fleet.host", "record": ...}); an action that
names another host ("host") is that host's operator API, called over the hop (fleet.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from pool import services
from pool.errors import InvalidRequest, ModelNotFound, PoolError
from pool.fleet.registry import GROUP as FLEET_GROUP
from pool.runtime import ready_runtime
from pool.strict_json import dumps_finite, loads_strict

from . import fleet
from .access import may_connect, same_origin

log = logging.getLogger(__name__)

ACTIONS = ("pin", "unpin", "load", "unload", "set_ttl")
# A load or unload is awaited this long; a longer one carries on and broadcasts carry its progress.
SETTLE_SECONDS = 0.2
REFUSED = 4403


class PoolConsumer(AsyncJsonWebsocketConsumer):
    joined = False
    in_fleet = False

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
        self.group = runtime.broadcaster.group
        await self.channel_layer.group_add(self.group, self.channel_name)
        member = fleet.member_of(runtime)
        if member is not None:
            # joined before the fleet is read: no record published meanwhile is missed
            await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
            self.in_fleet = True
        self.joined = True
        await self.accept()
        await self.send_json(runtime.snapshot())
        if member is not None:
            await self.send_fleet(member)

    async def send_fleet(self, member) -> None:
        try:
            await self.send_json(await fleet.fleet_message(member))
        except Exception:   # the records that follow every second fill the page in
            log.exception("could not read the fleet for a dashboard")

    async def disconnect(self, code):
        if self.joined:
            self.joined = False
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.in_fleet:
            self.in_fleet = False
            await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)

    async def pool_snapshot(self, event):
        await self.send(text_data=event["text"])  # encoded once by the broadcaster

    async def pool_requests(self, event):
        await self.send(text_data=event["text"])  # the requests message (pool/traces), encoded once

    async def fleet_host(self, event):
        await self.send(text_data=fleet.host_message(event["text"]))   # the record as published, wrapped

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
        action, model, host = message.get("action"), message.get("model"), message.get("host")
        if action not in ACTIONS:
            raise InvalidRequest(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' must be a model id")
        if host is not None and (not isinstance(host, str) or not host):
            raise InvalidRequest("'host' must be the id of a host of the fleet")
        runtime = ready_runtime()
        if host is not None and host != runtime.settings.host_id:
            await self.act_on(runtime, host, action, model, message)
            return runtime.snapshot()
        router = runtime.router
        model_id = router.resolve(model).model_id
        if action in ("pin", "unpin", "set_ttl"):
            await services.update_model_settings(router=router, name=model_id, changes=_changes(action, message))
        elif action == "load":
            await self.settle(router.load(model_id), action)
        else:
            await self.settle(router.unload(model_id, force=_force(message)), action)
        return runtime.snapshot()

    async def act_on(self, runtime, host: str, action: str, model: str, message: dict) -> None:
        """An action on another host of the fleet. Settings live in the fleet's shared database: this
        host writes them when it knows the model, else the host that has it does."""
        if action in ("pin", "unpin", "set_ttl"):
            changes = _changes(action, message)
            try:
                model_id = runtime.router.resolve(model).model_id
            except ModelNotFound:
                await fleet.settings_on(runtime, host, model, changes)
            else:
                await services.update_model_settings(router=runtime.router, name=model_id, changes=changes)
        elif action == "load":
            await self.settle(fleet.load_on(runtime, host, model), action)
        else:
            await self.settle(fleet.unload_on(runtime, host, model, force=_force(message)), action)

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


def _changes(action: str, message: dict) -> dict:
    if action != "set_ttl":
        return {"is_pinned": action == "pin"}
    if "ttl_seconds" not in message:
        raise InvalidRequest("'set_ttl' needs 'ttl_seconds': seconds, or null for the global default")
    return {"ttl_seconds": message["ttl_seconds"]}


def _force(message: dict) -> bool:
    force = message.get("force", False)
    if not isinstance(force, bool):
        raise InvalidRequest("'force' must be true or false")
    return force
