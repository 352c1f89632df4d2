"""Which webhook targets are refused (SSRF), without any network: literal addresses, `localhost`,
the allow-list, and the api's check at submission."""

from __future__ import annotations

import ipaddress

import pytest

from conveyor.webhooks.ssrf import Allow, Refusal, Target, check, judge, resolve, why_not_public


@pytest.mark.parametrize(("address", "why"), [
    ("169.254.169.254", "a cloud metadata address"),
    ("fd00:ec2::254", "a cloud metadata address"),
    ("100.100.100.200", "a cloud metadata address"),
    ("127.0.0.1", "a loopback address"),
    ("::1", "a loopback address"),
    ("::ffff:127.0.0.1", "a loopback address"),  # IPv4-mapped IPv6 is the IPv4 address
    ("169.254.1.1", "a link-local address"),
    ("fe80::1", "a link-local address"),
    ("10.0.0.1", "a private address"),
    ("172.16.5.4", "a private address"),
    ("192.168.1.1", "a private address"),
    ("fc00::1", "a private address"),
    ("100.64.0.1", "not a public address"),  # carrier-grade NAT
    ("0.0.0.0", "a private address"),
    ("224.0.0.1", "not a public address"),
    ("8.8.8.8", None),
    ("2606:4700:4700::1111", None),
])
def test_addresses(address: str, why: str | None) -> None:
    assert why_not_public(ipaddress.ip_address(address)) == why


def test_every_address_of_a_name_must_be_public() -> None:
    verdict = judge("hooks.example", 443, ["93.184.216.34", "10.1.2.3"], Allow())
    assert isinstance(verdict, Refusal) and "hooks.example (10.1.2.3) is a private address" in verdict.reason
    assert "webhook_allow" in verdict.reason
    target = Target("hooks.example", 443, "93.184.216.34")
    assert judge("hooks.example", 443, ["93.184.216.34"], Allow()) == target


def test_allow_list_of_networks_and_hosts() -> None:
    allow = Allow.parse("127.0.0.0/8, 10.1.0.0/16, hooks.internal, .corp.example")
    assert isinstance(judge("127.0.0.1", 80, ["127.0.0.1"], allow), Target)
    assert isinstance(judge("x", 80, ["10.1.9.9"], allow), Target)
    assert isinstance(judge("x", 80, ["10.2.0.1"], allow), Refusal)
    assert isinstance(judge("hooks.internal", 80, ["192.168.0.9"], allow), Target)
    assert isinstance(judge("a.b.corp.example", 80, ["192.168.0.9"], allow), Target)
    assert isinstance(judge("corp.example.evil", 80, ["192.168.0.9"], allow), Refusal)
    with pytest.raises(ValueError, match="neither a CIDR"):
        Allow.parse("10.0.0.0/8, not a host!")


def test_localhost_is_loopback_without_asking_dns() -> None:
    assert isinstance(resolve("localhost", 80, Allow()), Refusal)
    assert isinstance(resolve("api.localhost", 80, Allow()), Refusal)
    assert resolve("localhost", 8080, Allow.parse("127.0.0.1/32")) == Target("localhost", 8080, "127.0.0.1")


async def test_submission_check_refuses_literals_and_localhost() -> None:
    for host in ("169.254.169.254", "10.0.0.1", "[::1]", "localhost"):
        refusal = await check(host, 80, Allow())
        assert refusal is not None, host
    assert await check("127.0.0.1", 80, Allow.parse("127.0.0.0/8")) is None
    assert await check("8.8.8.8", 443, Allow()) is None  # public literal: no lookup, no connection
