from django.urls import path

from .anthropic import messages
from .openai import chat, embeddings, models
from .operator import pool_routes, telemetry_routes

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
    path("api/pool", pool_routes.pool_snapshot),
    path("api/evictions", pool_routes.evictions),
    path("api/fleet", pool_routes.fleet),
    path("api/telemetry", telemetry_routes.telemetry),
    path("api/enforcer/tick", pool_routes.enforcer_tick),
    path("api/rediscover", pool_routes.rediscover),
    path("api/models/<path:model_id>/load", pool_routes.load_model),
    path("api/models/<path:model_id>/unload", pool_routes.unload_model),
    path("api/models/<path:model_id>/load-plan", pool_routes.load_plan),
    # oMLX's documented path and body, so existing scripts keep working
    path("admin/model/<path:model_id>/settings", pool_routes.model_settings),
]
