"""A script's named arguments as Lua reads them (real redis-server): every form a header declares arrives under its
name, in order, byte for byte."""

from __future__ import annotations

import json

import redis as redis_py

from inferq.shared.lifecycle.lua import Script, parse_args


def test_lua_reads_every_declared_form_by_name(redis: redis_py.Redis) -> None:
    declared = "id, blob, ids[], jobs[id, execution], info<>, @delivery, chunks[id, job<>], empty[]"
    script = Script("echo", ("k",), "return cjson.encode(A)", args=parse_args(declared))
    args = {
        "id": "j-1",
        "blob": b"\x00\xff\xfe raw",
        "ids": ["a", "b", "c"],
        "jobs": [("j1", "e1"), ("j2", "e2")],
        "info": {"model": "m", "items": 3},
        "delivery": {"ttl": 60, "prefix": "hook-", "fields": {"origin": "webhooks"}},
        "chunks": [("c0", {"status": "queued"}), ("c1", {})],
        "empty": [],
    }
    raw = script(redis, ["inferq:test:k"], args=args)
    got = json.loads(raw.decode("utf-8", "replace"))
    assert got["id"] == "j-1" and got["ids"] == ["a", "b", "c"]
    assert got["jobs"] == {"id": ["j1", "j2"], "execution": ["e1", "e2"]}  # by column
    assert got["info"] == ["model", "m", "items", "3"]  # HSET's form: field, value, ...
    assert got["delivery"] == {"ttl": "60", "prefix": "hook-", "fields": ["origin", "webhooks"]}
    assert got["chunks"]["id"] == ["c0", "c1"] and got["chunks"]["job"][0] == ["status", "queued"]
    assert got["empty"] == got["chunks"]["job"][1] == {}  # cjson: {} for an empty table
    blob = Script("blob", ("k",), "return A.blob", args=parse_args("blob"))
    assert blob(redis, ["inferq:test:k"], args={"blob": args["blob"]}) == args["blob"]


def test_a_list_longer_than_one_unpack_takes_arrives_whole(redis: redis_py.Redis) -> None:
    source = "return {#A.ids, A.ids[1], A.ids[#A.ids], #A.info}"
    script = Script("count", ("k",), source, args=parse_args("ids[], info<>"))
    ids = [f"id-{n}" for n in range(9001)]  # past the decoder's unpack bound and Lua's C stack
    info = {f"f{n}": n for n in range(2500)}  # 5,000 values
    assert script(redis, ["inferq:test:k"], args={"ids": ids, "info": info}) == [9001, b"id-0", b"id-9000", 5000]
