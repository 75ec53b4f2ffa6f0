"""A bulk upload read as it arrives: the JSONL body (or a multipart file) a slice of lines at a time, each line
checked as a single submit is and handed to a ``BatchWriter``, which stages a slice at a time. Whatever the
upload's size, the API holds one slice of lines and one line of at most ``line_limit`` bytes."""

from __future__ import annotations

import binascii
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import pybase64
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from inferq.api.inputs import check_json_size
from inferq.shared import tracing
from inferq.shared.errors import AppError, InvalidInput, PayloadTooLarge
from inferq.shared.inputs import input_kind
from inferq.shared.lifecycle import upload
from inferq.shared.lifecycle.upload import BulkItem
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings

CUSTOM_ID_MAX = 256
# How many refused lines the upload's answer lists (all of them are counted).
REFUSED_SHOWN = 100
# Lines checked per call into the threadpool: as many as one staging call takes, or this many bytes of them. Each
# call costs a thread hop and a Redis round trip (the ids' check); at staging's 256 KB, five 45 KB image lines
# shared them. The chunks still stage as before (a staging call's bound is its script's items, not the bytes
# beside it: each chunk's body is a SET of its own).
SLICE_LINES = upload.SLICE_ITEMS
SLICE_BYTES = 4 * 1024 * 1024
READ_BYTES = 64 * 1024
_LINE_FIELDS = {"custom_id", "inputs", "image", "traceparent", "tracestate"}


def line_limit(settings: Settings) -> int:
    """The longest line an upload may hold: an image of INFERQ_MAX_BODY_BYTES in base64, or text escaped."""
    return 2 * settings.max_body_bytes + 64 * 1024


class Sink(Protocol):
    """Where checked lines go (a ``BatchWriter``)."""

    def check_ids(self, pairs: Sequence[tuple[str, int]]) -> list[int]: ...

    def add(self, item: BulkItem) -> None: ...

    def fail(self, line: str) -> None: ...


@dataclass
class Refusals:
    """The lines an upload refused: all counted, the first ``REFUSED_SHOWN`` listed."""

    count: int = 0
    shown: list[dict[str, Any]] = field(default_factory=list)

    def add(self, number: int, custom_id: str | None, error: str) -> None:
        self.count += 1
        if len(self.shown) < REFUSED_SHOWN:
            self.shown.append({"line": number, "custom_id": custom_id, "error": error})


class LineChecker:
    """An upload's lines, a slice at a time; a bad line is refused alone, by line number and custom_id."""

    def __init__(self, config: ModelConfig, settings: Settings, sink: Sink) -> None:
        self.config, self.settings, self.sink = config, settings, sink
        self.kind = input_kind(config.input)
        self.limit = line_limit(settings)
        self.refusals = Refusals()
        # An image model's lines carry no numbers it reads: orjson may parse them (see ``_loads``).
        self.loads = _loads if self.kind.from_json is None else json.loads

    def take(self, lines: Sequence[tuple[int, bytes | None]]) -> None:
        """Check a slice of (line number, line; None for one over ``line_limit``, dropped unread)."""
        outcomes: dict[int, BulkItem | tuple[str | None, AppError]] = {}  # by line: an item, or a refusal
        candidates: list[tuple[int, dict[str, Any], str]] = []
        for number, raw in lines:
            if raw is not None and not raw.strip():
                continue
            try:
                candidates.append((number, *self._parsed(raw)))
            except AppError as exc:
                outcomes[number] = (None, exc)
        # Repeats are found in Redis, across slices: the API keeps no set of every id an upload held.
        firsts = self.sink.check_ids([(custom_id, number) for number, _, custom_id in candidates])
        for (number, line, custom_id), first in zip(candidates, firsts, strict=True):
            try:
                if first:
                    raise InvalidInput(f"custom_id {custom_id!r} repeats line {first}")
                unknown = set(line) - _LINE_FIELDS
                if unknown:
                    raise InvalidInput(f"unknown fields: {', '.join(sorted(unknown))}")
                outcomes[number] = self._item(line, custom_id)
            except AppError as exc:
                outcomes[number] = (None if first else custom_id, exc)
        for number in sorted(outcomes):  # in line order, as the answer lists them and the results hold them
            outcome = outcomes[number]
            if isinstance(outcome, BulkItem):
                self.sink.add(outcome)  # may refuse the whole upload: past its lane's bound or its whole quota
            else:
                self._refuse(number, *outcome)

    def _parsed(self, raw: bytes | None) -> tuple[dict[str, Any], str]:
        if raw is None:
            raise PayloadTooLarge(f"the line is over {self.limit} bytes, the most a line may hold")
        check_json_size(self.config, self.kind, raw, "line")
        try:
            line = self.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise InvalidInput(f"not valid JSON: {exc}") from None
        if not isinstance(line, dict):
            raise InvalidInput("each line must be a JSON object")
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= CUSTOM_ID_MAX:
            raise InvalidInput(f"custom_id must be a string of 1 to {CUSTOM_ID_MAX} characters")
        if not _is_unicode(custom_id):
            raise InvalidInput("custom_id must be Unicode text: it holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
        return line, custom_id

    def _refuse(self, number: int, custom_id: str | None, exc: AppError) -> None:
        error = f"line {number}: {exc.message}"
        self.refusals.add(number, custom_id, error)
        if custom_id is not None:  # it counts, and fails alone
            self.sink.fail(
                json.dumps({"custom_id": custom_id, "status": "failed", "error": error}, separators=(",", ":"))
            )

    def _item(self, line: dict[str, Any], custom_id: str) -> BulkItem:
        config, kind, settings = self.config, self.kind, self.settings
        trace = tracing.given(line.get("traceparent"), line.get("tracestate"))
        if "inputs" in line and kind.from_json is not None:
            payload = kind.from_json(config.input, line["inputs"], config.name, settings)
        elif "image" in line and kind.from_bytes is not None:
            if not isinstance(line["image"], str):
                raise InvalidInput("image must be a base64 string")
            try:
                data = pybase64.b64decode(line["image"], validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInput("image is not valid base64") from None
            payload = kind.from_bytes(config.input, data, "", config.name, settings)
        else:
            field_name = "inputs" if kind.from_json is not None else "image"
            raise InvalidInput(f"each line needs '{field_name}': model {config.name} takes {kind.takes}")
        return BulkItem(custom_id, payload.data, payload.content_type, trace)


def _loads(raw: bytes) -> Any:
    """An image model's line, as ``json.loads`` reads it: by orjson (a 45 KB base64 line in half the time), and by
    ``json`` where orjson refuses (NaN, a lone surrogate's escape) or the line is bad, so every error is ``json``'s.
    Not for lines whose numbers are read: orjson makes an integer past 64 bits a float, where ``json`` keeps it."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _is_unicode(text: str) -> bool:
    # json.loads takes a lone surrogate escape; such a string has no UTF-8 form, and Redis's cjson refuses it.
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


async def read_upload(request: Request, settings: Settings, checker: LineChecker | None, hasher: Any) -> None:
    """Read the whole upload into ``hasher`` (its fingerprint; None: it has no Idempotency-Key, so none is kept)
    and, unless None, ``checker``, a slice at a time."""
    lines: list[tuple[int, bytes | None]] = []
    size = 0
    async for number, raw in _numbered_lines(_body_blocks(request, settings), line_limit(settings), hasher):
        if checker is None:
            continue
        lines.append((number, raw))
        size += len(raw or b"")
        if len(lines) >= SLICE_LINES or size >= SLICE_BYTES:
            await run_in_threadpool(checker.take, lines)
            lines, size = [], 0
    if checker is not None and lines:
        await run_in_threadpool(checker.take, lines)


async def _numbered_lines(
    blocks: AsyncIterator[bytes], limit: int, hasher: Any
) -> AsyncIterator[tuple[int, bytes | None]]:
    """(number, line) for each line; a line over ``limit`` bytes is dropped as it arrives and given as None.

    A line is copied once: sliced from its block, or joined from the views of the blocks it spans (a bytearray
    grown block by block, then copied out, was three copies of every 45 KB image line)."""
    pieces: list[memoryview] = []  # the line so far, from earlier blocks
    held = 0
    number, dropping = 0, False
    async for block in blocks:
        if hasher is not None:
            hasher.update(block)
        view, start = memoryview(block), 0
        while (end := block.find(b"\n", start)) >= 0:
            number += 1
            if dropping or held + end - start > limit:
                yield number, None
            elif pieces:
                pieces.append(view[start:end])
                yield number, b"".join(pieces)
            else:
                yield number, block[start:end]
            pieces.clear()
            held, dropping = 0, False
            start = end + 1
        if not dropping and start < len(block):
            held += len(block) - start
            if held > limit:
                pieces.clear()
                dropping = True
            else:
                pieces.append(view[start:])
    if pieces or dropping:
        yield number + 1, None if dropping else b"".join(pieces)


async def _body_blocks(request: Request, settings: Settings) -> AsyncIterator[bytes]:
    """The JSONL, as it arrives: the body, or the multipart form's ``file`` (spooled to disk past 1 MiB)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = _limited(request, settings.max_batch_bytes)
    if media_type != "multipart/form-data":
        async for block in body:
            yield block
        return
    try:
        form = await MultiPartParser(request.headers, body, max_files=1, max_fields=5).parse()
    except AppError:
        raise
    except (MultiPartException, ValueError) as exc:
        raise InvalidInput(f"malformed multipart body: {exc}") from None
    try:
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise InvalidInput("the form needs a 'file' field holding the JSONL")
        while block := await file.read(READ_BYTES):
            yield block
    finally:
        await form.close()


async def _limited(request: Request, max_bytes: int) -> AsyncGenerator[bytes, None]:
    """The body's blocks, refused as soon as it passes the limit (chunked bodies too)."""
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {max_bytes}")
    size = 0
    async for block in request.stream():
        size += len(block)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body is over the limit of {max_bytes} bytes")
        if block:
            yield block
