from django.urls import path

from .anthropic import messages
from .ollama import chat as ollama_chat
from .ollama import embed as ollama_embed
from .ollama import info as ollama
from .openai import chat, embeddings, models
from .operator import pool_routes, request_routes, telemetry_routes
from .responses import compact as responses_compact
from .responses import routes as responses

urlpatterns = [
    path("health", pool_routes.health),
    path("metrics", telemetry_routes.metrics),
    path("v1/models", models.list_models),
    path("v1/models/<path:model_id>", models.get_model),
    path("v1/chat/completions", chat.chat_completions),
    path("v1/completions", chat.completions),
    path("v1/embeddings", embeddings.embeddings),
    path("v1/messages", messages.messages),
    path("v1/messages/count_tokens", messages.count_tokens),
    path("v1/responses", responses.create),
    path("v1/responses/compact", responses_compact.compact),
    path("v1/responses/<str:response_id>", responses.retrieve),
    path("v1/responses/<str:response_id>/input_items", responses.input_items),
    # Ollama's native API (its chat, generate and embed routes come with their package)
    path("api/version", ollama.version),
    path("api/tags", ollama.tags),
    path("api/ps", ollama.ps),
    path("api/show", ollama.show),
    path("api/chat", ollama_chat.chat),
    path("api/generate", ollama_chat.generate),
    path("api/embed", ollama_embed.embed),
    path("api/embeddings", ollama_embed.embeddings),
    path("api/pull", ollama.pull),
    path("api/push", ollama.push),
    path("api/create", ollama.create),
    path("api/copy", ollama.copy),
    path("api/delete", ollama.delete),
    path("api/pool", pool_routes.pool_snapshot),
    path("api/evictions", pool_routes.evictions),
    path("api/fleet", pool_routes.fleet),
    path("api/telemetry", telemetry_routes.telemetry),
    path("api/enforcer/tick", pool_routes.enforcer_tick),
    path("api/rediscover", pool_routes.rediscover),
    path("api/requests", request_routes.requests),
    path("api/requests/live", request_routes.live),
    path("api/requests/summary", request_routes.summary),
    path("api/requests/<str:trace_id>", request_routes.one),
    path("api/requests/<str:trace_id>/cancel", request_routes.cancel),
    path("api/models/<path:model_id>/load", pool_routes.load_model),
    path("api/models/<path:model_id>/unload", pool_routes.unload_model),
    path("api/models/<path:model_id>/load-plan", pool_routes.load_plan),
    # oMLX's documented path and body, so existing scripts keep working
    path("admin/model/<path:model_id>/settings", pool_routes.model_settings),
]
