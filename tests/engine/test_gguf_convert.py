"""conveyor.engine.gguf_convert's progress: a tqdm bar on a terminal, a line per stage in a log, silence if
off.

(The conversion itself runs in test_loader.py, once per session.)"""

from __future__ import annotations

import io

import pytest

from conveyor.engine import gguf_convert
from conveyor.engine.gguf_convert import ConversionProgress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(progress: ConversionProgress) -> None:
    progress.say("converting m.gguf")
    for i in range(len(gguf_convert.STAGES)):
        progress.stage(i)
    progress.close(done=True)
    progress.say("done in 1.0 s")


def test_a_log_gets_one_line_per_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    _run(ConversionProgress(True))
    lines = log.getvalue().splitlines()
    assert lines == ["conveyor: converting m.gguf", *(f"conveyor: {s}" for s in gguf_convert.STAGES),
                     "conveyor: done in 1.0 s"]  # fmt: skip
    assert "\r" not in log.getvalue()


def test_a_terminal_gets_a_tqdm_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    progress = ConversionProgress(True)
    assert type(progress._bar).__module__.startswith("tqdm")
    _run(progress)
    frames = term.getvalue().replace("\n", "\r").split("\r")
    for i, stage in enumerate(gguf_convert.STAGES):  # each stage was drawn with the count before it
        assert any(stage in f and f" {i}/{len(gguf_convert.STAGES)} " in f for f in frames), stage
    assert any("converted" in f and " 4/4 " in f for f in frames)
    text = term.getvalue()
    assert "conveyor: converting m.gguf\n" in text and "conveyor: done in 1.0 s\n" in text


def test_a_failed_conversion_leaves_the_bar_where_it_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    progress = ConversionProgress(True)
    progress.stage(0)
    progress.stage(1)
    progress.close(done=False)
    assert "converted" not in term.getvalue() and " 1/4 " in term.getvalue().split("\r")[-1]


@pytest.mark.parametrize("stream", [io.StringIO, _Terminal])
def test_progress_off_writes_nothing(monkeypatch: pytest.MonkeyPatch, stream: type[io.StringIO]) -> None:
    out = stream()
    monkeypatch.setattr("sys.stderr", out)
    _run(ConversionProgress(False))
    assert out.getvalue() == ""
