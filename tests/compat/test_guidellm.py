"""guidellm (through its Python API: see requirements.txt): a synchronous benchmark of synthetic
prompts, streamed with usage; every request must succeed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import Service
from guidellm.benchmark import benchmark_generative_text


def test_synchronous_benchmark_has_no_errors(conveyor: Service, tmp_path: Path) -> None:
    report, _ = asyncio.run(benchmark_generative_text(
        target=conveyor.base_url, backend_type="openai_http", backend_args=None, model=conveyor.model,
        processor=str(conveyor.model_dir), processor_args=None, data="prompt_tokens=32,output_tokens=16",
        data_args=None, data_sampler=None, rate_type="synchronous", rate=None, max_seconds=None,
        max_requests=4, warmup_percent=None, cooldown_percent=None, output_path=tmp_path / "report.json",
        output_extras=None, output_sampling=None, random_seed=42, show_progress=False, output_console=False))
    totals = report.benchmarks[0].request_totals
    assert totals.errored == 0 and totals.incomplete == 0 and totals.successful == 4, totals
