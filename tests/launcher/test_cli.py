"""The `conveyor` CLI: every command's --help renders (argparse formats help text with %)."""

from __future__ import annotations

import pytest

from launcher.cli import build_parser
from schemas.settings import Settings


@pytest.mark.parametrize("command", ["serve", "api", "worker", "webhooks", "model"])
def test_help_of_every_command_renders_every_setting(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in text
    assert "50-100 % of its value" in text  # a literal % in a description survives formatting
