"""conveyor/engine/native/extensions.py: a build lock left by a process killed while it compiled does
not hang the next start (torch's own lock file would be waited on forever), and two checkouts of the
same sources share one build."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conveyor.engine.native import extensions

REPO = Path(__file__).resolve().parents[2]
# A tiny extension: pybind11 only, so that building it twice stays cheap.
TINY_SOURCE = """
#include <pybind11/pybind11.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", [] { return 42; }); }
"""
TINY = extensions.Extension("conveyor_test_tiny", "a test extension", "nothing", ("tiny.cpp",), (), ("-O0",))


def _in_fresh_process(code: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=300, check=True, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    return out.stdout.strip()


def test_a_stale_torch_lock_is_removed_and_the_module_loads() -> None:
    extensions.build(extensions.GREEDY)  # built (once per machine)
    build = extensions.build_dir(extensions.GREEDY)
    (build / extensions.TORCH_BATON).write_text("")  # as a killed compile leaves it
    # in a fresh process, as a restarted worker: torch alone would wait for the file forever
    out = _in_fresh_process("""
        from conveyor.engine.native import extensions
        print(callable(extensions.build(extensions.GREEDY).greedy))
    """)
    assert out == "True"
    assert not (build / extensions.TORCH_BATON).exists()


def test_two_checkouts_of_the_same_sources_share_one_build(tmp_path: Path) -> None:
    """torch's ninja file names the sources by absolute path: built from each checkout's own path,
    the second would recompile what the first had built. Built from the copies in the keyed
    directory, the second loads the first's binary."""
    cache = tmp_path / "cache"
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        (tmp_path / checkout / "tiny.cpp").write_text(TINY_SOURCE)
    code = """
        import sys
        from pathlib import Path
        from tests.engine.test_native_build import TINY
        from conveyor.engine.native import extensions
        module = extensions.build(TINY, Path(sys.argv[1]))
        print(module.answer(), extensions.build_dir(TINY, Path(sys.argv[1])))
    """
    env = {"TORCH_EXTENSIONS_DIR": str(cache)}

    def build(checkout: str) -> tuple[str, Path, int]:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / checkout)],
                             capture_output=True, text=True, timeout=300, check=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), **env})
        answer, where = out.stdout.split()
        (so,) = Path(where).glob("*.so")
        return answer, Path(where), so.stat().st_mtime_ns

    answer_a, dir_a, built_a = build("a")
    answer_b, dir_b, built_b = build("b")
    assert answer_a == answer_b == "42"
    assert dir_a == dir_b and [p.name for p in cache.iterdir()] == [dir_a.name]
    assert built_b == built_a  # not rebuilt
    build("a")
    (so,) = dir_a.glob("*.so")
    assert so.stat().st_mtime_ns == built_a


@pytest.mark.parametrize("ext", extensions.EXTENSIONS, ids=lambda e: e.name)
def test_every_extensions_files_are_in_the_native_folder(ext: extensions.Extension) -> None:
    assert all((extensions.NATIVE_DIR / name).is_file() for name in ext.files)


def test_conveyor_kernels_reports_each_extension_and_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conveyor.launcher.cli import main

    built: list[str] = []

    def build(ext: extensions.Extension, source_dir: Path = extensions.NATIVE_DIR) -> object:
        built.append(ext.name)
        if ext is extensions.GREEDY:
            raise RuntimeError("Error building extension 'conveyor_greedy'")
        return object()

    monkeypatch.setattr(extensions, "build", build)
    monkeypatch.setenv("CXX", "no-such-c++")
    with pytest.raises(SystemExit, match=r"could not build conveyor_greedy: .*apt-get install g\+\+"):
        main(["kernels"])
    assert built == [ext.name for ext in extensions.EXTENSIONS]  # a failure does not stop the others
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(extensions.EXTENSIONS)
    assert "failed: no C++ compiler: 'no-such-c++' is not on PATH" in lines[1] and lines[0].endswith("s)")
