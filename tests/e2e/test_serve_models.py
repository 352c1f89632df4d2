"""`conveyor serve` with two models on one machine (docs/operations/multi-model.md): a worker for
each, and a request per model answered by its model (issue 41)."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import until
from tests.conftest import write_twin
from tests.e2e.serving import start_serve

pytestmark = pytest.mark.slow


def test_serve_starts_a_worker_per_model_and_routes_by_model(tmp_path, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    twin = write_twin(tmp_path / "twin", tiny_model_dir)
    served = start_serve(tmp_path, "--model", str(tiny_model_dir), "--served-model-name", "tiny",
                         "--models", f"twin={twin}", "--kv-cache-memory", "16MiB")
    try:
        until(lambda: served.workers() >= 2, "a worker for each model", 300)
        listed = httpx.get(served.base_url + "/v1/models", timeout=30).json()
        assert [m["id"] for m in listed["data"]] == ["tiny", "twin"]
        for model in ("tiny", "twin"):
            body = {"model": model, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
            r = httpx.post(served.base_url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200 and r.json()["model"] == model, r.text
        assert httpx.get(served.base_url + "/queue?model=twin", timeout=30).json()["jobs"] == 0
    finally:
        assert served.stop() == 0, served.logs()
