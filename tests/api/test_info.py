"""`GET /info` (docs/api/index.md: model and limits in TGI's shape): every field TGI's /info has, each limit
read from the settings (`knobs_service` sets them all away from their defaults), and the device
and dtype of the worker that actually serves the model."""

from __future__ import annotations

from importlib.metadata import version

import httpx

from conveyor.wire.heartbeat import WorkerInfo
from tests.api.conftest import KNOBS, keys_of, redis_of

# TGI 3's /info (router/src/lib.rs `Info`), and the fields TGI 2 also had, which Conveyor keeps.
TGI_FIELDS = {"model_id", "model_sha", "model_pipeline_tag", "max_concurrent_requests", "max_best_of",
              "max_stop_sequences", "max_input_tokens", "max_total_tokens", "validation_workers",
              "max_client_batch_size", "router", "version", "sha", "docker_label"}
TGI2_FIELDS = {"model_dtype", "model_device_type", "waiting_served_ratio", "max_batch_total_tokens",
               "max_waiting_tokens", "max_batch_size"}
FROM_SETTINGS = {name: KNOBS[f"CONVEYOR_{name.upper()}"] for name in (
    "max_concurrent_requests", "max_best_of", "max_stop_sequences", "max_input_tokens", "max_total_tokens",
    "max_top_n_tokens", "max_batch_prefill_tokens", "max_batch_total_tokens", "max_batch_size",
    "max_waiting_tokens", "waiting_served_ratio")}


def info(service) -> dict:  # type: ignore[no-untyped-def]
    r = httpx.get(service.base_url + "/info", timeout=30)  # no key needed
    assert r.status_code == 200, r.text
    return r.json()


def test_info_has_every_tgi_field_with_values_from_the_settings(knobs_service) -> None:  # type: ignore[no-untyped-def]
    got = info(knobs_service)
    missing = (TGI_FIELDS | TGI2_FIELDS) - set(got)
    assert not missing, sorted(missing)
    assert {name: str(got[name]) for name in FROM_SETTINGS} == FROM_SETTINGS
    assert got["model_id"] == KNOBS["CONVEYOR_SERVED_MODEL_NAME"]
    assert got["model_pipeline_tag"] == "text-generation"
    assert got["version"] == version("conveyor")
    assert isinstance(got["router"], str) and got["router"]
    assert got["validation_workers"] >= 1 and got["max_client_batch_size"] >= 1


def test_info_reports_the_device_and_dtype_the_worker_serves_with(tiny_service) -> None:  # type: ignore[no-untyped-def]
    got = info(tiny_service)
    with redis_of(tiny_service) as redis:
        [key] = list(redis.scan_iter(match=keys_of(tiny_service).workers_pattern))
        worker = WorkerInfo.model_validate_json(redis.get(key))
    # --device auto (the tiny service's) is resolved by the worker; /info says what it resolved to.
    assert (got["model_device_type"], got["model_dtype"]) == (worker.device.split(":")[0], worker.dtype)
