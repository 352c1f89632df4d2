"""conveyor/engine/native_build.py: a build lock left by a process killed while it compiled does not hang the
next start (torch's own lock file would be waited on forever)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

from conveyor.engine import native_build
from conveyor.engine.attention import cpu_kernel
from conveyor.engine.greedy_kernel import _SOURCE as GREEDY


def test_a_stale_torch_lock_is_removed_and_the_module_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    shared = cpu_kernel.build_dir("greedy", [GREEDY])
    flags = ["-O3", "-march=native", "-fopenmp"]
    native_build.load("conveyor_greedy", [GREEDY], shared, flags)  # built (once per machine)
    # A copy (mtimes kept: ninja finds it built): in the shared cache the lock would stop any other
    # process loading the module now, such as a worker of another checkout's test run.
    build = tmp_path / "greedy"
    shutil.copytree(shared, build)
    (build / native_build.TORCH_BATON).write_text("")  # as a killed compile leaves it
    # in a fresh process, as a restarted worker: torch alone would wait for the file forever
    code = textwrap.dedent(f"""
        from pathlib import Path
        from conveyor.engine import native_build
        source, build = Path({str(GREEDY)!r}), Path({str(build)!r})
        module = native_build.load("conveyor_greedy", [source], build, {flags!r})
        print(callable(module.greedy))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         check=True)
    assert out.stdout.strip() == "True"
    assert not (build / native_build.TORCH_BATON).exists()
