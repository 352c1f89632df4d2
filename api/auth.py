"""API keys → tenants. A job is visible only to the tenant that submitted it.

Keys come from the `api_keys` setting (`KEY=TENANT,...`) and/or the JSON file `api_keys_file`
(`{"KEY": "TENANT"}`). With no keys the api is open — every caller is tenant `default` — which
Settings allows only on a loopback host unless `allow_unauthenticated` is set.
"""

from __future__ import annotations

import hmac
import json
import logging

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import Unauthorized
from schemas.settings import Settings

log = logging.getLogger(__name__)

OPEN_TENANT = "default"

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


def _check_tenant(tenant: str, where: str) -> str:
    tenant = tenant.strip()
    if not tenant or not all(c.isalnum() or c in "-_." for c in tenant) or len(tenant) > 64:
        raise ValueError(f"{where}: tenant {tenant!r} must be 1-64 letters, digits, '-', '_' or '.'")
    return tenant


def load_api_keys(settings: Settings) -> dict[str, str]:
    """key → tenant, from the settings; a ValueError names the setting that is wrong."""
    keys: dict[str, str] = {}
    if settings.api_keys:
        for i, item in enumerate(p.strip() for p in settings.api_keys.split(",")):
            if not item:
                continue
            key, _, tenant = item.partition("=")
            if not key.strip():
                raise ValueError(f"api_keys: entry {i} has an empty key")
            keys[key.strip()] = _check_tenant(tenant or OPEN_TENANT, f"api_keys entry {i}")
    if settings.api_keys_file:
        try:
            data = json.loads(settings.api_keys_file.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"api_keys_file {settings.api_keys_file}: {exc}") from exc
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in data.items()):
            raise ValueError(f"api_keys_file {settings.api_keys_file}: must be a JSON object "
                             '{"KEY": "TENANT", ...} of strings')
        for key, tenant in data.items():
            if not key.strip():
                raise ValueError(f"api_keys_file {settings.api_keys_file}: an empty key")
            keys[key.strip()] = _check_tenant(tenant, f"api_keys_file {settings.api_keys_file}")
    return keys


class Auth:
    def __init__(self, keys: dict[str, str]) -> None:
        self._keys = keys

    @property
    def open(self) -> bool:
        return not self._keys

    @property
    def num_keys(self) -> int:
        return len(self._keys)

    def tenant(self, credentials: HTTPAuthorizationCredentials | None) -> str:
        if self.open:
            return OPEN_TENANT
        if credentials is None:
            raise Unauthorized("missing API key: send `Authorization: Bearer <key>`")
        given = credentials.credentials.encode()
        for key, tenant in self._keys.items():
            if hmac.compare_digest(given, key.encode()):
                return tenant
        raise Unauthorized("invalid API key")


async def tenant(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)  # noqa: B008
) -> str:
    """FastAPI dependency: the caller's tenant (401 without a valid key when keys are configured)."""
    auth: Auth = request.app.state.auth
    return auth.tenant(credentials)
