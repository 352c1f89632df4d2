"""Many models, one queue (issue 41): the default model keeps the keys a one-model deployment always
had, another model's queue has its own keys in the same slots, and the settings that name the
models are checked with an error that names the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from redis.crc import key_slot

from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.models import ModelCatalog
from conveyor.settings import Settings


def test_the_default_models_queue_keeps_its_keys() -> None:
    keys = Keys("p", 2)
    assert keys.for_model(None) is keys
    assert keys.jobs_stream(0, keys.queue_places[0][1]).startswith("p:jobs:{jobs-0")
    assert keys.sweeper == "p:sweeper"
    assert keys.owners(1) == keys.shard_prefix(1) + ":owners"


def test_another_models_queue_has_its_own_keys_in_the_same_slots() -> None:
    default, small = Keys("p", 2), Keys("p", 2).for_model("small")
    assert small.model == "small"
    assert not set(default.jobs_streams) & set(small.jobs_streams)
    assert small.shard_prefix(0) == f"p:model:small:jobs:{{{default.shard_prefix(0).split('{')[1]}"
    for shard in range(2):  # a shard's streams of every model share its hash tag: one slot
        assert key_slot(small.shard_prefix(shard).encode()) == key_slot(default.shard_prefix(shard).encode())
    assert small.sweeper == "p:model:small:sweeper"
    assert small.job("j") == default.job("j") and small.worker("w") == default.worker("w")
    assert default.untimed(small.own_stream(0, "w")) and default.untimed(small.jobs_streams[0])
    assert not default.untimed(small.sweeper)


def test_the_catalog_routes_names_and_aliases() -> None:
    settings = Settings(models="small=/m/small,coder=/m/coder", model_aliases="fast=small,chat=big")
    catalog = ModelCatalog.from_settings(settings, "big")
    assert catalog.names == ("big", "small", "coder")
    assert [catalog.resolve(n) for n in (None, "big", "small", "fast", "chat", "nope")] == [
        "big", "big", "small", "small", "big", None]
    assert catalog.queue_of("big") is None and catalog.queue_of("small") == "small"
    assert catalog.queues == (None, "small", "coder")
    assert catalog.aliases_of("small") == ["fast"]


def test_one_model_ignores_the_requested_name() -> None:
    catalog = ModelCatalog.from_settings(Settings(), "big")
    assert catalog.single and catalog.resolve("gpt-4o") == "big"


@pytest.mark.parametrize(("given", "fix"), [
    ({"models": "small"}, "is not NAME=PATH"),
    ({"models": "sm all=/m"}, "must be 1-128 letters"),
    ({"models": "{x}=/m"}, "must be 1-128 letters"),
    ({"models": "a=/m,a=/n"}, "named twice"),
    ({"models": "a=/m", "worker_model": "b"}, "add b=PATH to models"),
    ({"models": "a=/m", "model_aliases": "a=a"}, "already names a model"),
])
def test_bad_model_settings_name_the_fix(given: dict[str, str], fix: str) -> None:
    with pytest.raises(ValidationError, match=fix):
        Settings(**given)


@pytest.mark.parametrize(("given", "fix"), [
    ({"models": "big=/m"}, "is the default model's name"),
    ({"models": "a=/m", "model_aliases": "x=nope"}, "names no model"),
    ({"model_aliases": "big=big"}, "is the default model's name"),
])
def test_a_catalog_that_contradicts_the_default_model_names_the_fix(given: dict[str, str], fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        ModelCatalog.from_settings(Settings(**given), "big")
