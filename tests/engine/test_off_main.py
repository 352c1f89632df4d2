"""conveyor/engine/off_main.py: the factory runs on a thread that is gone when the result comes back."""

from __future__ import annotations

import threading

import pytest

from conveyor.engine.off_main import build_off_main


def test_builds_on_a_thread_that_has_exited() -> None:
    seen: list[threading.Thread] = []

    def factory() -> str:
        seen.append(threading.current_thread())
        return "built"

    assert build_off_main(factory) == "built"
    assert seen and seen[0] is not threading.main_thread()
    assert not seen[0].is_alive()


def test_reraises_the_factory_error() -> None:
    def factory() -> None:
        raise FileNotFoundError("no weights")

    with pytest.raises(FileNotFoundError, match="no weights"):
        build_off_main(factory)
