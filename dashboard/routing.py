from django.urls import path

from .consumers import PoolConsumer

websocket_urlpatterns = [
    path("ws/pool/", PoolConsumer.as_asgi()),
]
