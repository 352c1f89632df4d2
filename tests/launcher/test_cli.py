"""The `conveyor` CLI: every command's --help renders (argparse formats help text with %). That the
docs' settings table names every setting is tests/test_docs.py's."""

from __future__ import annotations

import pytest

from conveyor.launcher.cli import build_parser
from conveyor.settings import Settings


@pytest.mark.parametrize("command", ["serve", "api", "worker", "webhooks", "model"])
def test_help_of_every_command_renders_every_setting(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in text
    assert "50-100 % of its value" in text  # a literal % in a description survives formatting


def test_bench_help_explains_itself(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("--base-url", "--backend", "--sweep-rates", "--slo", "--plot-dir", "vllm bench serve",
                  "pip install 'conveyor[bench]'", "ttft=2s,tpot=200ms", "--max-concurrency", "--jobs-mode"):
        assert words in text


def test_attention_flags_reach_the_engine_config() -> None:
    from conveyor.launcher.cli import settings_from
    from conveyor.launcher.roles import engine_config

    args = build_parser().parse_args(["worker", "--attention", "triton", "--cuda-graphs", "1,2,8"])
    config = engine_config(settings_from(args))
    assert (config.attention, config.cuda_graphs) == ("triton", (1, 2, 8))
    assert engine_config(Settings(cuda_graphs="0")).cuda_graphs == ()
    assert engine_config(Settings()).cuda_graphs is None
    for bad in (["--attention", "sdpa"], ["--cuda-graphs", "1,x"]):
        with pytest.raises(SystemExit, match="invalid settings: --(attention|cuda-graphs)"):
            settings_from(build_parser().parse_args(["worker", *bad]))


def test_admission_order_reaches_the_engine_config() -> None:
    from conveyor.launcher.cli import settings_from
    from conveyor.launcher.roles import engine_config

    args = build_parser().parse_args(["worker", "--admission-order", "arrival"])
    assert engine_config(settings_from(args)).admission_order == "arrival"
    assert engine_config(Settings()).admission_order == "shortest"
    with pytest.raises(SystemExit, match="invalid settings: --admission-order"):
        settings_from(build_parser().parse_args(["worker", "--admission-order", "sjf"]))


def test_kv_cache_dtype_reaches_the_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.launcher.cli import settings_from
    from conveyor.launcher.roles import engine_config

    args = build_parser().parse_args(["worker", "--kv-cache-dtype", "bfloat16"])
    assert engine_config(settings_from(args)).kv_cache_dtype == "bfloat16"
    assert engine_config(Settings()).kv_cache_dtype == "auto"
    monkeypatch.setenv("CONVEYOR_KV_CACHE_DTYPE", "bfloat16")  # what benchmarks/peers.py --dtype bf16 sets
    assert engine_config(Settings()).kv_cache_dtype == "bfloat16"
    with pytest.raises(SystemExit, match="invalid settings: --kv-cache-dtype"):
        settings_from(build_parser().parse_args(["worker", "--kv-cache-dtype", "fp8"]))


def test_the_sim_flags_reach_the_step_time_model() -> None:
    from conveyor.launcher.cli import settings_from
    from conveyor.launcher.roles import ignored_settings, step_time_model

    args = build_parser().parse_args(["worker", "--engine", "sim", "--sim-tflops", "600",
                                      "--sim-step-fixed-ms", "2", "--sim-memory-bandwidth-gbs", "4000"])
    settings = settings_from(args)
    model = step_time_model(settings)
    assert settings.engine == "sim"
    assert (model.flops, model.fixed_s, model.memory_bandwidth) == (600e12, 0.002, 4e12)
    assert model == step_time_model(Settings(engine="sim", sim_tflops=600, sim_step_fixed_ms=2,
                                             sim_memory_bandwidth_gbs=4000))
    # a knob the chosen engine does not use is named at start-up, not silently dropped
    assert ignored_settings(Settings(engine="sim", attention="torch")) == ["attention"]
    assert ignored_settings(Settings(engine="sim", speculate=4)) == ["speculate"]  # no logits to verify
    assert ignored_settings(Settings(sim_tflops=600)) == ["sim_tflops"]
    assert ignored_settings(Settings(engine="sim")) == ignored_settings(Settings()) == []
