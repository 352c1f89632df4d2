"""The fault tests that live elsewhere and join this suite by name (conftest.JOINED) still exist
under those names: a rename would otherwise drop them from `make test-faults` without a word."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.faults.conftest import JOINED

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("joined", JOINED)
def test_a_joined_fault_test_exists(joined: str) -> None:
    path, _, name = joined.partition("::")
    source = (REPO / path).read_text()
    if name:
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{joined}: no such test"
    else:
        assert re.search(r"^(async )?def test_", source, re.M), f"{path}: no test in it"
