"""`python manage.py unpin ID`: the model may be evicted again (see `pin`)."""

from .pin import Command as PinCommand


class Command(PinCommand):
    help = "Unpin a model: it may be evicted again. A running server applies it at once."
    pinned = False
