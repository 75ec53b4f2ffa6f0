"""Which webhook targets are allowed, and that checking one never stalls the API."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.api.app import create_app
from inferq.shared.errors import InvalidInput
from inferq.shared.settings import Settings
from inferq.shared.urls import _allowed, check_webhook_target, is_public
from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("::", False),
        # Shared address space (RFC 6598) is not private, and not public either: carrier NAT,
        # and Alibaba Cloud's metadata service at 100.100.100.200.
        ("100.64.0.1", False),
        ("100.100.100.200", False),
        ("192.0.0.170", False),
        ("198.18.0.1", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("ff02::1", False),
        ("fec0::1", False),
        ("2001:db8::1", False),
        # IPv6 forms that carry an IPv4 address: as public as the address they carry.
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", False),  # 6to4 of 169.254.169.254
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1
        ("64:ff9b::6464:64c8", False),  # NAT64 of 100.100.100.200
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
        ("::ffff:100.100.100.200", False),
        ("::ffff:8.8.8.8", True),
        ("::7f00:1", False),  # IPv4-compatible (deprecated) 127.0.0.1
        ("::808:808", False),  # IPv4-compatible: deprecated, never a real destination
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo: reached through a relay to a NAT
    ],
)
def test_public_addresses(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


def test_allow_list_takes_hosts_and_cidrs() -> None:
    assert check_webhook_target("http://127.0.0.1:8080/x", ["127.0.0.0/8"])
    assert check_webhook_target("http://localhost:8080/x", ["localhost"])
    with pytest.raises(InvalidInput, match="INFERQ_WEBHOOK_ALLOW"):
        check_webhook_target("http://127.0.0.1:8080/x", ["10.0.0.0/8"])
    with pytest.raises(InvalidInput, match="does not resolve"):
        check_webhook_target("http://no-such-host.invalid/x", [])


@pytest.mark.parametrize(
    ("addresses", "allow", "allowed"),
    [
        (["100.100.100.200"], [], False),
        (["100.100.100.200"], ["100.64.0.0/10"], True),
        (["2002:7f00:1::"], ["127.0.0.0/8"], False),  # a CIDR allows what it says, not what maps into it
        (["127.0.0.1", "10.0.0.1"], ["127.0.0.0/8"], False),  # every address must be allowed
        (["127.0.0.1", "10.0.0.1"], ["127.0.0.0/8", "10.0.0.0/8"], True),
        (["8.8.8.8", "10.0.0.1"], [], False),
        (["8.8.8.8", "10.0.0.1"], ["10.0.0.0/8"], True),
        (["8.8.8.8", "2001:4860:4860::8888"], [], True),
        ([], ["0.0.0.0/0"], False),
        (["127.0.0.1", "::1"], ["hooks.internal"], True),  # a host name allows whatever it resolves to
        (["127.0.0.1"], ["not a cidr", "127.0.0.1"], True),
    ],
)
def test_allow_list_entries(addresses: list[str], allow: list[str], allowed: bool) -> None:
    assert _allowed("hooks.internal", [ipaddress.ip_address(a) for a in addresses], allow) is allowed


def _answer(address: str, port: int = 80) -> list[Any]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]


@pytest.mark.parametrize("address", ["100.100.100.200", "2002:7f00:1::", "64:ff9b::a9fe:a9fe"])
def test_a_name_resolving_to_a_hidden_internal_address_is_refused(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        return _answer(address) if host == "hooks.example.com" else real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(InvalidInput, match="INFERQ_WEBHOOK_ALLOW"):
        check_webhook_target("https://hooks.example.com/x", [])


SLOW_DNS_S = 3.0
SLOW_SUBMITS = 40


def test_slow_webhook_dns_does_not_stall_other_requests(
    tmp_path: Path, redis_url: str, redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "models" / "pair"
    model.mkdir(parents=True)
    config = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}
    (model / "config.json").write_text(json.dumps(config))
    settings = Settings(redis_url=redis_url, models_dir=tmp_path / "models")
    real_getaddrinfo = socket.getaddrinfo
    lookups = {"running": 0, "started": 0}
    lock = threading.Lock()

    def slow_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "slow.example.com":
            return real_getaddrinfo(host, *args, **kwargs)
        with lock:
            lookups["running"] += 1
            lookups["started"] += 1
        try:
            time.sleep(SLOW_DNS_S)
            return _answer("8.8.8.8")
        finally:
            with lock:
                lookups["running"] -= 1

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    done: list[str] = []

    async def run() -> tuple[list[httpx.Response], httpx.Response]:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq", timeout=30) as client:
                accepted = await client.post("/v1/models/pair/jobs", json={"inputs": [1, 2]})
                assert accepted.status_code == 202, accepted.text

                async def submit() -> httpx.Response:
                    body = {"inputs": [1, 2], "webhook": "https://slow.example.com/hook"}
                    response = await client.post("/v1/models/pair/jobs", json=body)
                    done.append("submit")
                    return response

                async def look() -> httpx.Response:
                    await asyncio.sleep(0.5)  # the slow lookups have all begun by now
                    response = await client.get(f"/v1/jobs/{accepted.json()['id']}")
                    done.append("get")
                    return response

                *submits, got = await asyncio.gather(*(submit() for _ in range(SLOW_SUBMITS)), look())
                return submits, got

    try:
        submits, got = asyncio.run(run())
    finally:
        wait_until(lambda: lookups["running"] == 0, 30, "the slow lookups to end")
    assert got.status_code == 200 and got.json()["status"] == "queued"
    # Another client's GET is answered while every slow lookup is still pending or cut off.
    assert done[0] == "get", done
    assert [r.status_code for r in submits] == [422] * SLOW_SUBMITS
    assert {r.json()["error"]["message"] for r in submits} == {
        "could not resolve webhook host 'slow.example.com' within 2 s"
    }
    # Lookups run a few at a time; the ones still waiting for a turn when time ran out never ran.
    assert lookups["started"] <= 8
    assert redis.llen("rq:queue:inferq.pair") == 1
