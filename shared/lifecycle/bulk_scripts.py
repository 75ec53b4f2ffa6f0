"""The Lua scripts of a bulk batch's upload and cancel (``upload``, ``bulk``), each named and declaring its keys
(their sources: shared/lifecycle/lua/<name>.lua, as ``scripts``).

Each does a bounded amount of work: one slice of an upload's lines or chunks, or one slice of a cancel's chunks
(the slice sizes are constants in ``upload`` and ``bulk``), so no request holds Redis for a whole upload, and
no cancel reads the queue once per chunk. How the steps of an upload fit together: ``upload``'s docstring.
"""

from __future__ import annotations

from inferq.shared.lifecycle.lua import Script

CHECK_IDS = Script.load("check-ids")
STAGE_CHUNKS = Script.load("stage-chunks")
QUEUE_BATCH = Script.load("queue-batch")
PUSH_CHUNKS = Script.load("push-chunks")
PUBLISH_BATCH = Script.load("publish-batch")
CANCEL_CHUNKS = Script.load("cancel-chunks")

ALL = (CHECK_IDS, STAGE_CHUNKS, QUEUE_BATCH, PUSH_CHUNKS, PUBLISH_BATCH, CANCEL_CHUNKS)
