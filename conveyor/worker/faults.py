"""Test-only fault injection: a way to make a job kill its worker, every time. Off by default.

With CONVEYOR_TEST_CRASH_ON_TOKEN=<token id> in a worker's environment, the worker exits at once
(os._exit, like a segfault or an OOM kill: no cleanup, no acknowledgement) when it is about to start
or resume a job whose prompt contains that token id. The tests use it to check that such a poison
job ends in the dead-letter stream after max_attempts instead of killing the fleet one by one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

log = logging.getLogger(__name__)

CRASH_ON_TOKEN_ENV = "CONVEYOR_TEST_CRASH_ON_TOKEN"
CRASH_EXIT_CODE = 70


def crash_token() -> int | None:
    value = os.environ.get(CRASH_ON_TOKEN_ENV, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{CRASH_ON_TOKEN_ENV}={value!r}: set a token id (an integer) or unset it") from None


def maybe_crash(token: int | None, prompt_ids: Sequence[int]) -> None:
    if token is not None and token in prompt_ids:
        log.error("%s: prompt holds token %d, exiting now (fault injection)", CRASH_ON_TOKEN_ENV, token)
        logging.shutdown()
        os._exit(CRASH_EXIT_CODE)
