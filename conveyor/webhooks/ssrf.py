"""Where a webhook may go: public addresses only, unless the operator allows more (SSRF).

A webhook URL is the caller's, but the request comes from inside our network: a URL that resolves
to loopback, a private or link-local range, a cloud metadata service or any other non-public
address would let a tenant reach what only we can. So every address a host resolves to must be
public, or allowed by `webhook_allow` (CIDRs, or host names that are then trusted whatever they
resolve to). The api checks at submission (a clear 422); the delivery checks again at each attempt
(DNS may have changed) and connects to the very address it checked, so a name cannot be rebound
between the check and the connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud instance metadata services (AWS/GCP/Azure/OpenStack, AWS IPv6, ECS tasks, Alibaba).
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200"))
RESOLVE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Allow:
    """The operator's exceptions: networks, and host names (`.suffix` matches every name under it)."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> Allow:
        networks: list[IPNetwork] = []
        hosts: list[str] = []
        for item in (p.strip() for p in (text or "").split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
                continue
            except ValueError:
                pass
            name = item.lower().rstrip(".")
            if not name.lstrip(".") or not all(c.isalnum() or c in "-._" for c in name):
                raise ValueError(f"webhook_allow: {item!r} is neither a CIDR (10.1.0.0/16, 127.0.0.1) nor a "
                                 "host name (hooks.internal, .internal)")
            hosts.append(name)
        return cls(tuple(networks), tuple(hosts))

    def host(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        return any(name == h or (h.startswith(".") and name.endswith(h)) for h in self.hosts)

    def address(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks)


@dataclass(frozen=True, slots=True)
class Target:
    """A checked destination: connect to `address`, and say `host` in Host and TLS SNI."""

    host: str
    port: int
    address: str


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


def why_not_public(address: IPAddress) -> str | None:
    """Why a webhook may not go to this address; None if it is public."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_private:
        return "a private address"
    if not address.is_global or address.is_multicast:
        return "not a public address"
    return None


def literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _is_localhost(host: str) -> bool:
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")  # RFC 6761: always loopback


def judge(host: str, port: int, addresses: list[str], allow: Allow) -> Target | Refusal:
    """Every address must be public or allowed; the target is the first one."""
    if allow.host(host):
        return Target(host, port, addresses[0])
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone
        reason = why_not_public(address)
        if reason is not None and not allow.address(address):
            shown = host if host == text else f"{host} ({text})"
            return Refusal(f"webhook URL host {shown} is {reason}: webhooks may only go to public "
                           "addresses (an operator can allow it with the webhook_allow setting)")
    return Target(host, port, addresses[0])


def _addresses(infos: list[tuple]) -> list[str]:  # type: ignore[type-arg]
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve(host: str, port: int, allow: Allow) -> Target | Refusal:
    """Resolve and judge (blocking: the delivery's own process). socket.gaierror if the name fails."""
    ip = literal(host)
    if ip is not None:
        return judge(host, port, [str(ip)], allow)
    if _is_localhost(host) and not allow.host(host):
        return judge(host, port, ["127.0.0.1"], allow)
    return judge(host, port, _addresses(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)), allow)


async def check(host: str, port: int, allow: Allow) -> Refusal | None:
    """The api's check at submission. A name that does not resolve (now) passes: the delivery checks
    again, and an unresolvable name is only a failed delivery."""
    if allow.host(host):
        return None
    if literal(host) is not None or _is_localhost(host):
        verdict = resolve(host, port, allow)  # no DNS on these paths
        return verdict if isinstance(verdict, Refusal) else None
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):  # (wait_for may drop a cancel on Python 3.11)
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError):
        return None
    verdict = judge(host, port, _addresses(infos), allow)
    return verdict if isinstance(verdict, Refusal) else None
