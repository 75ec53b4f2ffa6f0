"""The command packer of inferq's connections: hiredis for small commands, redis-py's Python packer, which sends a
large argument uncopied, for one that carries a big value."""

from __future__ import annotations

import os

import pytest
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

from inferq.shared.connections import BIG_ARGUMENT, PACKER


@pytest.mark.skipif(not HIREDIS_AVAILABLE, reason="hiredis is not installed")
@pytest.mark.parametrize("size", [0, 300, BIG_ARGUMENT, BIG_ARGUMENT + 1, 2_200_000])
def test_a_command_packs_to_the_bytes_hiredis_writes_and_a_big_value_goes_uncopied(size: int) -> None:
    value = os.urandom(size)
    command = ("SET", "inferq:payload:j", value, "EX", 60)
    chunks = PACKER.pack(*command)
    assert b"".join(chunks) == b"".join(HiredisRespSerializer().pack(*command))
    assert any(chunk is value for chunk in chunks) == (size > BIG_ARGUMENT)


def test_a_script_call_of_many_small_arguments_is_packed_whole() -> None:
    args = ["EVALSHA", "0" * 40, 2, "k1", "k2", *(os.urandom(50) for _ in range(60)), 42, "é"]
    chunks = PACKER.pack(*args)
    assert len(chunks) == 1 and b"\xc3\xa9" in chunks[0]
