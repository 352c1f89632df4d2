"""The docs stay true to the repository: every path the README and docs/ name exists, the settings
table in docs/operations/configuration.md lists every setting and no other, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conveyor.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "operations" / "configuration.md"
README_MAX_LINES = 320

# A repository path: one of these folders, then path characters; not the tail of a longer path
# (`~/.cache/conveyor/models` is no repository path).
PATH = re.compile(r"(?<![\w./~-])((?:conveyor|benchmarks|deploy|tests|docs|scripts)/[\w./-]*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
# Written by the commands the docs show, not kept in git.
OUTPUTS = ("benchmarks/results/",)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def named_paths(text: str) -> set[str]:
    """The repository paths a page names in code spans and link targets, without trailing punctuation."""
    spans = CODE_SPAN.findall(text) + LINK_TARGET.findall(text)
    paths = {match.rstrip(".,:;") for span in spans for match in PATH.findall(span)}
    return {path for path in paths if not path.startswith(OUTPUTS)}


def test_named_paths_are_found_in_backticks_and_links_only() -> None:
    text = "see `conveyor/api/app.py`, [a](docs/index.md), `~/.cache/conveyor/models/` and conveyor/x.py."
    assert named_paths(text) == {"conveyor/api/app.py", "docs/index.md"}


@pytest.mark.parametrize("page", doc_files(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    missing = sorted(path for path in named_paths(page.read_text()) if not (ROOT / path).exists())
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_settings_table_lists_every_setting_and_no_other() -> None:
    flags = set(re.findall(r"^\| `--([a-z0-9-]+)`", CONFIGURATION.read_text(), flags=re.MULTILINE))
    settings = {name.replace("_", "-") for name in Settings.model_fields}
    assert not flags - settings, f"in the table but not settings: {sorted(flags - settings)}"
    assert not settings - flags, f"settings missing from the table: {sorted(settings - flags)}"


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"
