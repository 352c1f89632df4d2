"""conveyor/launcher/redis_server.py: a port picked free and taken before valkey-server binds it (by
another process on the machine, such as a second test run) is picked again; a port the caller
chose is not."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.launcher.redis_server import EmbeddedRedis, PortTaken


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another listener holds for the test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_picked_port_taken_before_the_bind_is_picked_again(tmp_path: Path, held_port: int) -> None:
    server = EmbeddedRedis(tmp_path)
    server.port = held_port  # as if someone bound our pick between free_port() and the server's bind
    with server:
        assert server.port != held_port
        assert server._ping()


def test_a_port_the_caller_chose_is_kept_and_its_conflict_named(tmp_path: Path, held_port: int) -> None:
    with pytest.raises(PortTaken, match=str(held_port)):
        EmbeddedRedis(tmp_path, port=held_port).start()
