"""`conveyor`: run the service, one of its roles, or manage the model.

    conveyor serve              everything on this machine: embedded Redis, api, workers, webhooks
    conveyor api                the HTTP front end only (fleet deployments)
    conveyor worker             one engine worker (fleet deployments; start more to scale)
    conveyor webhooks           one webhook delivery process (an RQ worker with its scheduler)
    conveyor model convert      convert the model once (GGUF → safetensors cache)
    conveyor model info         show the model's shape, vocabulary and EOS tokens
    conveyor kernels            build the engine's C++ kernels now (else the first worker start does)
    conveyor bench              load a server over HTTP (OpenAI, TGI, /v1/jobs): latency, throughput, plots

Every setting is a flag here and an environment variable (CONVEYOR_<NAME>, and REDIS_URL).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import types
import typing
from typing import Any

from pydantic import ValidationError

from conveyor.settings import Settings
from conveyor.telemetry.logs import setup_logging

log = logging.getLogger("conveyor")


def _flag_type(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) and args else annotation
    if typing.get_origin(base) is typing.Literal:
        return str
    return base if base in (int, float) else str


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (also CONVEYOR_<NAME> environment variables)")
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = (field.description or "") + f" [default: {field.get_default(call_default_factory=True)}]"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help: a literal "100 %" breaks it
        if field.annotation is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)
        else:
            group.add_argument(flag, dest=name, type=_flag_type(field.annotation), default=None,
                               help=help_text, metavar=name.upper())


def settings_from(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        )
        raise SystemExit(f"conveyor: invalid settings: {problems}") from None


def _cmd_model(args: argparse.Namespace) -> int:
    from conveyor.engine.loader import ModelError, model_info, resolve_model

    settings = settings_from(args)
    try:
        source = resolve_model(settings.model, settings.model_cache_dir)
    except ModelError as exc:
        raise SystemExit(f"conveyor: {exc}") from None
    if args.model_command == "convert":
        print(source.path)
    else:
        print(json.dumps({"model_id": source.model_id, "path": str(source.path), **model_info(source)},
                         indent=2, default=str))
    return 0


def _cmd_kernels() -> int:
    """Build every C++ extension of the engine into its cache, one progress line each."""
    import time

    from conveyor.engine.native import extensions

    failed = []
    for ext in extensions.EXTENSIONS:
        print(f"{ext.name}: {extensions.build_dir(ext)} ...", end=" ", flush=True)
        started = time.perf_counter()
        try:
            extensions.build(ext)
        except Exception as exc:  # noqa: BLE001 - reported with the fix, then the next one
            print(f"failed: {extensions.build_failure(exc)}")
            failed.append(ext.name)
            continue
        print(f"ok ({time.perf_counter() - started:.0f} s)")
    if failed:
        raise SystemExit(f"conveyor kernels: could not build {', '.join(failed)}: {extensions.INSTALL_HINT}. "
                         "Without them the engine runs its slower torch paths.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conveyor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run everything: embedded Redis (unless REDIS_URL), api, "
                                         "workers, webhook worker; Ctrl-C stops all")
    api = sub.add_parser("api", help="run the HTTP api only (needs REDIS_URL)")
    worker = sub.add_parser("worker", help="run one engine worker (needs REDIS_URL)")
    worker.add_argument("--worker-id", default=None, help="consumer name in the group (default: random)")
    webhooks = sub.add_parser("webhooks", help="deliver webhooks: an RQ worker with its scheduler for "
                                               "retries (needs REDIS_URL)")
    model = sub.add_parser("model", help="convert or describe the model")
    model.add_argument("model_command", choices=["convert", "info"])
    for p in (serve, api, worker, webhooks, model):
        add_settings_flags(p)
    sub.add_parser("kernels", help="build the engine's C++ kernels now, into the cache every process on "
                                   "this machine loads them from (needs g++ and the Python headers)")
    from conveyor.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(sub.add_parser("bench", help="load a server over HTTP (OpenAI, TGI or /v1/jobs), "
                                                     "report latency and throughput (benchmarks/README.md)"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":  # a client: no settings of its own
        from conveyor.bench.cli import main as bench_main

        return bench_main(args)
    if args.command == "kernels":  # no settings: the cache is TORCH_EXTENSIONS_DIR's
        return _cmd_kernels()
    settings = settings_from(args)
    setup_logging(settings.log_level, settings.log_format, args.command)
    for name in ("max_waiting_tokens", "waiting_served_ratio"):
        if getattr(settings, name) != Settings.model_fields[name].default:
            log.warning("--%s has no effect: Conveyor admits waiting requests at every step "
                        "(chunked prefill); it is accepted for TGI compatibility", name.replace("_", "-"))
    if args.command == "model":
        return _cmd_model(args)
    if args.command == "serve":
        from conveyor.launcher.serve import serve

        return serve(settings)
    if args.command == "api":
        from conveyor.launcher.roles import run_api

        return run_api(settings)
    if args.command == "webhooks":
        from conveyor.launcher.roles import run_webhooks

        return run_webhooks(settings)
    from conveyor.launcher.roles import run_worker

    return run_worker(settings, args.worker_id)


if __name__ == "__main__":
    sys.exit(main())
