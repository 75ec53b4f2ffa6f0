"""Which webhook targets are allowed."""

from __future__ import annotations

import ipaddress

import pytest

from shared.errors import InvalidInput
from shared.urls import check_webhook_target, is_public


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
