"""API keys → tenants. A job is visible only to the tenant that submitted it.

Keys come from the `api_keys` setting (`KEY=TENANT,...`) and/or the JSON file `api_keys_file`
(`{"KEY": "TENANT"}`). With no keys the api is open — every caller is tenant `default` — which
Settings allows only on a loopback host unless `allow_unauthenticated` is set.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conveyor.api.errors import Forbidden, Unauthorized
from conveyor.settings import Settings, read_string_map

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
    entries = read_string_map(settings.api_keys, settings.api_keys_file, "api_keys", "api_keys_file",
                              ("KEY", "TENANT"), bare_value=OPEN_TENANT)
    return {key: _check_tenant(tenant, where) for key, tenant, where in entries}


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


def admin_tenants(settings: Settings) -> frozenset[str]:
    """The tenants of `admin_tenants` (comma-separated)."""
    return frozenset(t.strip() for t in (settings.admin_tenants or "").split(",") if t.strip())


def is_admin(auth: Auth, tenant: str, settings: Settings) -> bool:
    """With no keys configured everyone is (the api is open); else the tenant is in admin_tenants."""
    return auth.open or tenant in admin_tenants(settings)


async def admin_tenant(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)  # noqa: B008
) -> str:
    """FastAPI dependency: the caller's tenant, which must be an operator's (401 without a valid key,
    403 for a tenant outside admin_tenants)."""
    auth: Auth = request.app.state.auth
    caller = auth.tenant(credentials)
    if not is_admin(auth, caller, request.app.state.context.settings):
        raise Forbidden(f"tenant {caller!r} is not an operator: the admin endpoints need a key whose tenant "
                        "is listed in the `admin_tenants` setting")
    return caller
