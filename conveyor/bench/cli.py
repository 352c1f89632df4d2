r"""`conveyor bench`: load an OpenAI-, TGI- or Conveyor-job-compatible server over HTTP and report
throughput, TTFT, TPOT, ITL, E2E latency (mean, p50, p90, p99), errors, goodput and the client's
own CPU per request; a table, JSON (--result-json) and PNG plots (--plot-dir).

    conveyor bench --base-url http://127.0.0.1:8080 --num-prompts 64 --input-len 256 --output-len 128
    conveyor bench --base-url http://127.0.0.1:8100 --model smollm2-135m --request-rate 4 \
        --slo ttft=2s,tpot=200ms
    conveyor bench --backend jobs --jobs-mode webhook ...       # submit-to-webhook latency
    conveyor bench --sweep-rates 1,2,4,inf --plot-dir out/  # throughput, TTFT, TPOT vs rate
    conveyor bench --workload jsonl --dataset-path p.jsonl  # {"prompt"|"messages": ...} a line

Random prompts are made as `vllm bench serve --dataset-name random` makes them (same seed, exact
token length), so figures are comparable with that client's. It needs the `bench` extra (pip
install 'conveyor[bench]': aiohttp for the client, matplotlib for the plots).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

from conveyor.bench import plots
from conveyor.bench.arrival import KINDS, parse_rate
from conveyor.bench.metrics import parse_slo
from conveyor.bench.options import BACKENDS, JOBS_MODES, Options, RunConfig
from conveyor.bench.report import table, write_json
from conveyor.bench.workloads import HFTokenizer, Request, copy_workload, jsonl_workload, random_workload

WORKLOADS = ("random", "shared-prefix", "copy", "jsonl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description, p.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    t = p.add_argument_group("target")
    t.add_argument("--base-url", default="http://127.0.0.1:8080", help="the server [default: %(default)s]")
    t.add_argument("--backend", choices=BACKENDS, default="completions",
                   help="completions: /v1/completions; chat: /v1/chat/completions; tgi: /generate_stream; "
                        "jobs: Conveyor's /v1/jobs [default: %(default)s]")
    t.add_argument("--jobs-mode", choices=JOBS_MODES, default="stream",
                   help="jobs: follow /events, poll GET /v1/jobs/{id}, or wait for a webhook to a local "
                        "receiver (the server needs --webhook-allow 127.0.0.0/8 and a webhook secret) "
                        "[default: %(default)s]")
    t.add_argument("--poll-interval", type=float, default=0.05,
                   help="seconds between polls [default: %(default)s]")
    t.add_argument("--model", default="default",
                   help="the `model` field sent (vLLM checks it) [default: %(default)s]")
    t.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    t.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="ask for exactly --output-len tokens (OpenAI dialects; vLLM and Conveyor support it)")
    t.add_argument("--temperature", type=float, default=0.0, help="[default: %(default)s: greedy]")
    t.add_argument("--timeout", type=float, default=3600.0, help="seconds per request [default: %(default)s]")
    w = p.add_argument_group("workload (seeded: the same seed sends the same requests)")
    w.add_argument("--workload", choices=WORKLOADS, default="random",
                   help="random: random-token prompts of exact length (vLLM's random dataset); "
                        "shared-prefix: the same --prefix-len system prompt before each; "
                        "copy: repeat a document word for word (speculative decoding's case); "
                        "jsonl: --dataset-path")
    w.add_argument("--num-prompts", type=int, default=64, help="[default: %(default)s]")
    w.add_argument("--input-len", default="256",
                   help="prompt tokens: N or LOW-HIGH (uniform) [default: %(default)s]")
    w.add_argument("--output-len", default="128", help="output tokens: N or LOW-HIGH [default: %(default)s]")
    w.add_argument("--range-ratio", type=float, default=0.0,
                   help="N ± ratio·N, as vLLM's --random-range-ratio")
    w.add_argument("--prefix-len", type=int, default=256,
                   help="shared-prefix: its tokens [default: %(default)s]")
    w.add_argument("--dataset-path", type=Path, default=None, help="jsonl: the file")
    w.add_argument("--prompt-format", choices=("text", "ids"), default="text",
                   help="send prompts as text (as vLLM's client) or token-id lists [default: %(default)s]")
    w.add_argument("--tokenizer", type=Path, default=None,
                   help="a model directory or tokenizer.json [default: the model Conveyor serves by default]")
    w.add_argument("--seed", type=int, default=0, help="[default: %(default)s]")
    a = p.add_argument_group("arrival")
    a.add_argument("--request-rate", type=parse_rate, default=math.inf,
                   help="requests/s, or inf: all at once [default: inf]")
    a.add_argument("--arrival", choices=KINDS, default="poisson",
                   help="gaps at a finite rate [default: %(default)s]")
    a.add_argument("--max-concurrency", type=int, default=None, help="at most this many in flight")
    a.add_argument("--sweep-rates", default=None, help="one run per rate, e.g. 1,2,4,inf")
    a.add_argument("--sweep-concurrency", default=None, help="one run per concurrency cap, e.g. 1,4,16,64")
    a.add_argument("--warmup", type=int, default=0, help="requests sent (and not counted) first [default: 0]")
    o = p.add_argument_group("report")
    o.add_argument("--slo", default=None, help="goodput SLOs: ttft, tpot, e2el in s or ms (bare: ms), "
                                               "e.g. ttft=2s,tpot=200ms")
    o.add_argument("--result-json", type=Path, default=None, help="write the figures here")
    o.add_argument("--plot-dir", type=Path, default=None, help="write PNG plots here (needs matplotlib)")
    o.add_argument("--label", default="", help="a name for this run in the table and plots")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a progress bar")


def tokenizer(path: Path | None) -> HFTokenizer:
    if path is None:
        from conveyor.engine.loader import resolve_model  # the default model (converted once, cached)

        path = resolve_model(None).path
    return HFTokenizer(path)


def workload(args: argparse.Namespace) -> list[Request]:
    if args.workload == "jsonl":
        if args.dataset_path is None:
            raise SystemExit("conveyor bench: --workload jsonl needs --dataset-path FILE")
        return jsonl_workload(args.dataset_path, args.num_prompts, args.output_len, args.seed)
    tok = tokenizer(args.tokenizer)
    if args.workload == "copy":
        return copy_workload(tok, args.num_prompts, args.input_len, args.output_len, args.seed)
    prefix = args.prefix_len if args.workload == "shared-prefix" else 0
    return random_workload(tok, args.num_prompts, args.input_len, args.output_len, args.seed,
                           args.range_ratio, prefix, as_ids=args.prompt_format == "ids")


def _sweep(args: argparse.Namespace, base: RunConfig) -> tuple[list[RunConfig], list[float], str]:
    if args.sweep_rates and args.sweep_concurrency:
        raise SystemExit("conveyor bench: sweep rates or concurrency, not both")
    if args.sweep_rates:
        rates = [parse_rate(x) for x in args.sweep_rates.split(",")]
        return [dataclasses.replace(base, rate=r) for r in rates], rates, "request rate (req/s)"
    if args.sweep_concurrency:
        caps = [int(x) for x in args.sweep_concurrency.split(",")]
        runs = [dataclasses.replace(base, max_concurrency=c) for c in caps]
        return runs, [float(c) for c in caps], "concurrency"
    return [base], [], ""


def main(args: argparse.Namespace) -> int:
    try:
        from conveyor.bench.run import run
    except ImportError as exc:  # aiohttp: the bench extra
        raise SystemExit(f"conveyor bench: {exc.msg}; install the bench extra: "
                         "pip install 'conveyor[bench]'") from None
    try:
        slo = parse_slo(args.slo)
        requests = workload(args)
    except ValueError as exc:
        raise SystemExit(f"conveyor bench: {exc}") from None
    if args.plot_dir is not None and not plots.available():
        raise SystemExit(f"conveyor bench: --plot-dir needs matplotlib: {plots.INSTALL}")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    opts = Options(base_url=args.base_url.rstrip("/"), model=args.model, ignore_eos=args.ignore_eos,
                   temperature=args.temperature, headers=headers, jobs_mode=args.jobs_mode,
                   poll_interval_s=args.poll_interval)
    base = RunConfig(backend=args.backend, rate=args.request_rate, arrival=args.arrival, seed=args.seed,
                     max_concurrency=args.max_concurrency, timeout_s=args.timeout, progress=args.progress,
                     slo=slo)
    if args.warmup:
        run(requests[: args.warmup], opts, dataclasses.replace(base, rate=math.inf, progress=False))
    configs, xs, xlabel = _sweep(args, base)
    runs: list[dict[str, Any]] = []
    labels = []
    for cfg in configs:
        summary = run(requests, opts, cfg)
        label = args.label or "run"
        if xs:
            label += f" rate={cfg.rate}" if args.sweep_rates else f" concurrency={cfg.max_concurrency}"
        print(table(summary, label), flush=True)
        runs.append(summary)
        labels.append(label)
    spec = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
            if k in ("workload", "num_prompts", "input_len", "output_len", "range_ratio", "prefix_len",
                     "dataset_path", "prompt_format", "seed", "ignore_eos", "label")}
    if args.result_json is not None:
        write_json(runs, args.result_json, spec)
        print(f"figures: {args.result_json}", file=sys.stderr)
    if args.plot_dir is not None:
        args.plot_dir.mkdir(parents=True, exist_ok=True)
        written = [plots.cdfs(runs, labels, args.plot_dir)]
        if xs:
            written.append(plots.sweep(runs, xs, xlabel, args.plot_dir))
        print("plots: " + ", ".join(map(str, written)), file=sys.stderr)
    return 0 if all(r["failed"] == 0 for r in runs) else 1
