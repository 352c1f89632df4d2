"""conveyor/engine/malloc_tuning.py: a freed multi-MB tensor stays mapped once the thresholds are raised
(so the next step's temporary of that size takes no page faults), and goes back to the kernel
without (glibc's defaults). Each case in a fresh process: the setting is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODE = """
import sys, threading, psutil, torch
from conveyor.engine import malloc_tuning
raised = malloc_tuning.retain_freed_memory() if sys.argv[1] == "retain" else False
proc = psutil.Process()
def work(out):  # on a thread, as the engine steps: its own malloc arena
    before = proc.memory_info().rss
    x = torch.ones(4 << 20)  # 16 MiB, every page touched
    del x
    out.append(proc.memory_info().rss - before)
out = []
t = threading.Thread(target=work, args=(out,))
t.start(); t.join()
print(raised, out[0])
"""


def _kept_after_free(choice: str) -> tuple[str, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", CODE, choice], env=env, capture_output=True, text=True,
                         check=True)
    raised, kept = out.stdout.split()
    return raised, int(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_temporaries_stay_mapped_only_when_retained() -> None:
    raised, kept = _kept_after_free("retain")
    assert raised == "True" and kept > 12 << 20
    raised, kept = _kept_after_free("system")
    assert raised == "False" and kept < 4 << 20
