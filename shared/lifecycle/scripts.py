"""The Lua scripts that move a job through its life, each named and declaring every key it touches.

Each script's source is shared/lifecycle/lua/<name>.lua, headed by what it does, its KEYS and its ARGV;
the functions several scripts share are in lua/lib/ and named by a script's ``uses:`` line (``Script.load``).

Every key a script reads or writes arrives in KEYS, never built inside the script from a prefix or
taken from ARGV: that is Redis's rule for scripts (and what a Redis Cluster enforces). A script
declares its fixed keys and, for scripts over a batch, the keys it takes per job; ``Script.__call__``
checks what it is given against that declaration. ARGV carries values only.

Every call goes by the script's hash (EVALSHA), its body only once per server (``Script.__call__``):
redis-py's Script objects add a SCRIPT EXISTS round trip to every pipeline that uses them.
"""

from __future__ import annotations

from inferq.shared.lifecycle import bulk_scripts
from inferq.shared.lifecycle.lua import Script

CLAIM_FIRST = Script.load("claim-first")
POP = Script.load("pop")
ENQUEUE = Script.load("enqueue")
START = Script.load("start")
FINISH = Script.load("finish")
CANCEL = Script.load("cancel")
ANNOUNCE_FAILED = Script.load("announce-failed")
GIVE_BACK = Script.load("give-back")
GIVE_BACK_HELD = Script.load("give-back-held")
RESCUE = Script.load("rescue")
JUDGE = Script.load("judge")
WITHDRAW = Script.load("withdraw")
FIELD_OF_EACH = Script.load("field-of-each")

ALL = (
    CLAIM_FIRST,
    POP,
    ENQUEUE,
    START,
    FINISH,
    CANCEL,
    ANNOUNCE_FAILED,
    GIVE_BACK,
    GIVE_BACK_HELD,
    RESCUE,
    JUDGE,
    WITHDRAW,
    FIELD_OF_EACH,
    *bulk_scripts.ALL,
)
