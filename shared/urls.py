"""Where webhooks may go: globally routable addresses, or what INFERQ_WEBHOOK_ALLOW lists.

Checked at submit (API) and again at each delivery (worker), on every address the host
resolves to. The worker then connects to the very addresses it checked, never resolving the
name again: a DNS answer that changes between check and connect (rebinding) cannot steer a
delivery to 127.0.0.1 or a metadata service. Literal forms such as ``http://2130706433/`` or
``http://0x7f.1/`` resolve like any other name and are caught the same way.

Lookups run on a few threads of their own with a time limit, so slow DNS for one webhook
host never holds the API's shared thread pool (which every Redis call goes through).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from urllib.parse import urlsplit

from inferq.shared.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A submit waits this long for its webhook host to resolve (a delivery: its own deadline).
RESOLVE_TIMEOUT_S = 2.0
# Lookups in flight per process; more wait for a turn, within the same time limit.
RESOLVER_THREADS = 8

_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public(address: IPAddress) -> bool:
    """True only for globally routable unicast addresses, looking inside IPv6 forms that carry IPv4."""
    if isinstance(address, ipaddress.IPv6Address):
        # Teredo (2001::/32) reaches a host behind a NAT through a relay: never a webhook server.
        # IPv4-compatible addresses (::a.b.c.d) are deprecated and routed nowhere.
        if address.teredo is not None or address in _IPV4_COMPATIBLE:
            return False
        # These forms are delivered to the IPv4 address inside them (6to4 relays, NAT64
        # gateways, dual-stack sockets), so 2002:7f00:1:: is as much loopback as 127.0.0.1.
        carried = address.ipv4_mapped or address.sixtofour
        if carried is None and address in _NAT64:
            carried = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if carried is not None:
            return is_public(carried)
        if address.is_site_local:
            return False
    # is_global, not "not is_private": 100.64.0.0/10 (carrier NAT, and a cloud metadata
    # service at 100.100.100.200) is neither. ipaddress counts multicast as global.
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified)


def _allowed(host: str, addresses: Iterable[IPAddress], allow: Iterable[str]) -> bool:
    """True if the host is listed by name, or each address is public or inside a listed CIDR."""
    addresses, allow = list(addresses), list(allow)
    if not addresses:
        return False
    if any(entry.lower() == host.lower() for entry in allow):
        return True
    networks = []
    for entry in allow:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue
    return all(is_public(a) or any(a in network for network in networks) for a in addresses)


def webhook_origin(url: str) -> tuple[str, int]:
    """The URL's host and port; InvalidInput unless it is http(s) with a host."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput("webhook has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("webhook must be an http(s) URL with a host")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the host resolves to, in the resolver's order, each once (blocking)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


@cache
def _resolver() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="inferq-dns")


def _literal(host: str) -> list[IPAddress] | None:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        return None


def resolve_in_time(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    """``resolve`` on the resolver threads; TimeoutError past ``timeout_s``, OSError if it fails."""
    literal = _literal(host)
    if literal is not None:
        return literal
    future = _resolver().submit(resolve, host, port)
    try:
        return future.result(timeout=max(timeout_s, 0.0))
    except TimeoutError:
        future.cancel()  # if it is still waiting for a thread, it never runs
        raise
    except UnicodeError as exc:  # an unencodable name (IDNA) resolves to nothing
        raise OSError(str(exc)) from None


async def resolve_async(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    """``resolve_in_time`` without blocking the event loop or borrowing its shared threads."""
    literal = _literal(host)
    if literal is not None:
        return literal
    loop = asyncio.get_running_loop()
    try:
        # On timeout wait_for cancels the wrapped future, so a lookup still queued never runs.
        return await asyncio.wait_for(loop.run_in_executor(_resolver(), resolve, host, port), timeout_s)
    except UnicodeError as exc:
        raise OSError(str(exc)) from None


def check_addresses(host: str, addresses: Iterable[IPAddress], allow: Iterable[str]) -> None:
    """InvalidInput unless every address is public or allowed."""
    if not _allowed(host, addresses, allow):
        raise InvalidInput(
            f"webhook host {host!r} is not a public address (loopback, private, link-local, shared or "
            "metadata); list it in INFERQ_WEBHOOK_ALLOW to allow it"
        )


def _unresolved(host: str, timeout_s: float, exc: OSError) -> InvalidInput:
    if isinstance(exc, TimeoutError):
        return InvalidInput(f"could not resolve webhook host {host!r} within {timeout_s:g} s")
    return InvalidInput(f"webhook host {host!r} does not resolve")


def check_webhook_target(url: str, allow: Iterable[str], timeout_s: float = RESOLVE_TIMEOUT_S) -> list[IPAddress]:
    """The addresses the URL resolves to; InvalidInput if it does not resolve in time or any is refused."""
    host, port = webhook_origin(url)
    try:
        addresses = resolve_in_time(host, port, timeout_s)
    except OSError as exc:
        raise _unresolved(host, timeout_s, exc) from None
    check_addresses(host, addresses, allow)
    return addresses


async def check_webhook_target_async(
    url: str, allow: Iterable[str], timeout_s: float = RESOLVE_TIMEOUT_S
) -> list[IPAddress]:
    """``check_webhook_target`` for the API's event loop."""
    host, port = webhook_origin(url)
    try:
        addresses = await resolve_async(host, port, timeout_s)
    except OSError as exc:
        raise _unresolved(host, timeout_s, exc) from None
    check_addresses(host, addresses, allow)
    return addresses
