"""The one write path for model settings, against the test database: every writer's rules."""

import pytest

from pool.errors import InvalidRequest
from pool.models import ModelSettings
from pool.services import coerce_settings, write_model_settings
from tests.pool.conftest import make_folder


@pytest.mark.parametrize("changes, param, message", [
    ({"temperature": 2.5}, "temperature", "'temperature' must be between 0 and 2"),
    ({"top_p": 0}, "top_p", "'top_p' must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p", "'top_p' must be in (0, 1]"),
    ({"max_tokens": 0}, "max_tokens", "'max_tokens' must be between 1 and"),
    ({"max_tokens": 10**30}, "max_tokens", "'max_tokens' must be between 1 and"),
    ({"ttl_seconds": 2**63}, "ttl_seconds", "'ttl_seconds' must be at most"),
    ({"alias": "beta"}, "alias", "'alias' 'beta' is the id of another model"),
    ({"alias": "on-disk"}, "alias", "'alias' 'on-disk' is the id of another model"),
])
def test_out_of_range_values_are_refused_and_nothing_is_written(models_dir, changes, param, message):
    make_folder(models_dir, "on-disk")
    ModelSettings.objects.create(model_id="beta")
    with pytest.raises(InvalidRequest) as refused:
        write_model_settings(model_id="alpha", changes=changes)
    assert refused.value.param == param and message in refused.value.message
    assert not ModelSettings.objects.filter(model_id="alpha").exists()


def test_an_alias_used_by_another_model_is_refused(models_dir):
    write_model_settings(model_id="alpha", changes={"alias": "a"})
    with pytest.raises(InvalidRequest) as refused:
        write_model_settings(model_id="beta", changes={"alias": "a"})
    assert refused.value.param == "alias"
    assert ModelSettings.objects.get(model_id="alpha").alias == "a"


def test_a_partial_change_keeps_the_other_fields(models_dir):
    write_model_settings(model_id="alpha", changes={"is_pinned": True, "notes": "keep me", "alias": "al"})
    values = write_model_settings(model_id="alpha", changes={"ttl_seconds": 60, "alias": None})
    assert values == {"model_id": "alpha", "is_pinned": True, "ttl_seconds": 60, "temperature": None,
                      "top_p": None, "max_tokens": None, "alias": None, "is_hidden": False,
                      "display_name": "", "notes": "keep me", "max_kv_size": None, "kv_bits": None,
                      "kv_group_size": None, "quantized_kv_start": None, "trace_body_bytes": None,
                      "draft_model": ""}


@pytest.mark.parametrize("body, param", [
    ({"is_pinned": "yes"}, "is_pinned"),
    ({"ttl_seconds": -1}, "ttl_seconds"),
    ({"ttl_seconds": 1.5}, "ttl_seconds"),
    ({"temperature": True}, "temperature"),
    ({"alias": 3}, "alias"),
    ({"colour": "red"}, "colour"),
])
def test_json_types_are_checked_before_the_model_sees_them(body, param):
    with pytest.raises(InvalidRequest) as refused:
        coerce_settings(body)
    assert refused.value.param == param


def test_omlx_names_and_empty_values():
    assert coerce_settings({"model_alias": "", "display_name": None, "model_id": "ignored"}) == {
        "alias": None, "display_name": ""}
