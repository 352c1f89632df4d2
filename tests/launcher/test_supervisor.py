"""conveyor/launcher/supervisor.py's policy, on fake processes and a fake clock: a dead child is
restarted after its backoff while the others run on; a crash loop stops the service."""

from __future__ import annotations

import signal

from conveyor.launcher import supervisor as sup
from conveyor.launcher.supervisor import Supervisor, describe


class FakeProcess:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet() -> tuple[Supervisor, Clock, list[FakeProcess]]:
    clock, spawned = Clock(), []

    def spawn(argv: list[str], env: dict[str, str]) -> FakeProcess:
        spawned.append(FakeProcess(argv))
        return spawned[-1]

    supervisor = Supervisor({}, spawn, clock)  # type: ignore[arg-type]
    supervisor.start("worker-0", ["worker"])
    supervisor.start("api", ["api"])
    return supervisor, clock, spawned


def test_a_dead_child_is_restarted_after_its_backoff_and_the_others_keep_running() -> None:
    supervisor, clock, spawned = fleet()
    spawned[0].returncode = -signal.SIGKILL
    assert supervisor.poll() is None
    assert len(spawned) == 2  # not yet: it waits out the first backoff
    clock.now += sup.BACKOFF_S[0]
    assert supervisor.poll() is None
    assert len(spawned) == 3 and spawned[2].argv == ["worker"]
    assert supervisor.children["worker-0"].process is spawned[2]
    assert supervisor.children["api"].process is spawned[1] and spawned[1].returncode is None


def test_backoff_grows_with_each_exit_in_the_window() -> None:
    supervisor, clock, spawned = fleet()
    for n in range(1, sup.CRASH_LIMIT):
        spawned[-2 if n == 1 else -1].returncode = 1
        assert supervisor.poll() is None
        clock.now += sup.BACKOFF_S[n - 1] - 0.01
        before = len(spawned)
        supervisor.poll()
        assert len(spawned) == before  # still waiting
        clock.now += 0.01
        supervisor.poll()
        assert len(spawned) == before + 1


def test_a_crash_loop_stops_the_service_and_names_the_child() -> None:
    supervisor, clock, spawned = fleet()
    problem = None
    for _ in range(sup.CRASH_LIMIT):
        supervisor.children["worker-0"].process.returncode = 3  # type: ignore[union-attr]
        problem = supervisor.poll()
        clock.now += sup.BACKOFF_S[-1]
        if problem is None:
            supervisor.poll()  # restarts it
    assert problem is not None and "worker-0" in problem and "code 3" in problem


def test_exits_older_than_the_window_are_forgotten() -> None:
    supervisor, clock, spawned = fleet()
    for _ in range(sup.CRASH_LIMIT * 2):
        supervisor.children["worker-0"].process.returncode = 1  # type: ignore[union-attr]
        assert supervisor.poll() is None
        clock.now += sup.CRASH_WINDOW_S / (sup.CRASH_LIMIT - 1) + 1  # too slow to be a crash loop
        supervisor.poll()


def test_no_restart_while_stopping() -> None:
    supervisor, clock, spawned = fleet()
    spawned[0].returncode = 1
    supervisor.poll()
    supervisor.stopping = True
    clock.now += sup.BACKOFF_S[-1]
    supervisor.poll()
    assert len(spawned) == 2


def test_describe_names_signals() -> None:
    assert describe(-9) == "SIGKILL" and describe(1) == "code 1"
