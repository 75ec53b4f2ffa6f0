"""Where webhooks may go: public addresses, or what INFERQ_WEBHOOK_ALLOW lists.

Checked at submit (API) and again just before each delivery (worker), on every address the
host resolves to, so a name that later resolves to 127.0.0.1 or a cloud metadata address is
refused too. Literal forms such as ``http://2130706433/`` or ``http://0x7f.1/`` resolve like
any other name and are caught the same way.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from shared.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public(address: IPAddress) -> bool:
    """False for loopback, private, link-local, multicast, unspecified and reserved addresses."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return is_public(address.ipv4_mapped)
        if address.is_site_local:
            return False
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    )


def _allowed(host: str, addresses: Iterable[IPAddress], allow: Iterable[str]) -> bool:
    for entry in allow:
        if entry.lower() == host.lower():
            return True
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue
        if all(address in network for address in addresses):
            return True
    return False


def resolve(host: str, port: int) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def check_webhook_target(url: str, allow: Iterable[str]) -> list[IPAddress]:
    """The addresses the URL resolves to; InvalidInput if any of them is not a public one."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("webhook must be an http(s) URL with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolve(parts.hostname, port)
    except (OSError, UnicodeError):
        raise InvalidInput(f"webhook host {parts.hostname!r} does not resolve") from None
    allow = list(allow)
    if not _allowed(parts.hostname, addresses, allow) and not all(is_public(a) for a in addresses):
        raise InvalidInput(
            f"webhook host {parts.hostname!r} is a loopback, private, link-local or metadata address; "
            "list it in INFERQ_WEBHOOK_ALLOW to allow it"
        )
    return addresses
