"""API keys → tenants, and the rule that the api never runs open on a non-loopback host by accident."""

from __future__ import annotations

import pytest
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError

from conveyor.api.auth import Auth, load_api_keys
from conveyor.api.errors import Unauthorized
from conveyor.settings import Settings


def bearer(key: str) -> HTTPAuthorizationCredentials:
    return HTTPAuthorizationCredentials(scheme="Bearer", credentials=key)


def test_keys_from_the_setting_and_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "keys.json"
    path.write_text('{"k3": "team-c"}')
    keys = load_api_keys(Settings(api_keys="k1=team-a, k2", api_keys_file=path))
    assert keys == {"k1": "team-a", "k2": "default", "k3": "team-c"}
    auth = Auth(keys)
    assert auth.tenant(bearer("k1")) == "team-a" and auth.tenant(bearer("k3")) == "team-c"
    for credentials in (None, bearer("k4")):
        with pytest.raises(Unauthorized):
            auth.tenant(credentials)


@pytest.mark.parametrize(("settings", "names"), [
    ({"api_keys": "k1=bad tenant"}, "api_keys entry 0"),
    ({"api_keys": "=team"}, "api_keys: entry 0"),
])
def test_bad_keys_name_the_setting(settings: dict, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        load_api_keys(Settings(**settings))


@pytest.mark.parametrize("content", ["not json", '["k"]', '{"k": 1}'])
def test_bad_keys_file_names_the_file(tmp_path, content: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="api_keys_file"):
        load_api_keys(Settings(api_keys_file=path))


def test_open_only_on_loopback_unless_allowed() -> None:
    assert Auth(load_api_keys(Settings())).open
    for host in ("127.0.0.1", "localhost", "::1"):
        Settings(host=host)
    with pytest.raises(ValidationError, match="allow_unauthenticated"):
        Settings(host="0.0.0.0")
    Settings(host="0.0.0.0", allow_unauthenticated=True)
    Settings(host="0.0.0.0", api_keys="k1=team-a")
