"""The vocabulary is the one source of the words: the ORM's choices come from it."""

from pool.models import EvictionEvent
from pool.policy.vocabulary import ActionKind, Level, Reason


def test_the_history_columns_take_exactly_the_vocabulary():
    assert [value for value, _ in EvictionEvent._meta.get_field("reason").choices] == [r.value for r in Reason]
    assert [value for value, _ in EvictionEvent._meta.get_field("action").choices] == [a.value for a in ActionKind]


def test_levels_are_ordered():
    assert [level.rank for level in Level] == [0, 1, 2, 3]
    assert Level.HARD == "hard" and f"{Level.SOFT}" == "soft"
