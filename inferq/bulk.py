"""`inferq batch MODEL PATH...`: upload images or JSONL as bulk batches, follow them, write the results.

PATHs may be image files, folders of images (searched recursively) or JSONL files of
``{"custom_id", "inputs" | "image"}`` lines. An image's custom_id is its path as given (files in a
folder: the folder's path joined with the file's path inside it), so a re-run with the same ``--out``
skips what that file already holds. Large inputs go up as several batches, each under the API's
upload limit. Ctrl-C cancels what has not run and keeps what finished.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from inferq.client import Batch, Client, Conflict, InferqError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"}
# Per upload: well under the API's default INFERQ_MAX_BATCH_BYTES (256 MiB).
UPLOAD_BYTES = 64 * 1024 * 1024
# Per request: the API checks every line of an upload before it answers.
UPLOAD_TIMEOUT_S = 300.0
POLL_S = 0.5


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``batch`` subcommand; the caller adds --api and --api-key, as for every command that uses the SDK."""
    parser: argparse.ArgumentParser = sub.add_parser("batch", help="run files or JSONL through a model as bulk batches")
    parser.add_argument("model")
    parser.add_argument("paths", nargs="+", type=Path, help="image files, folders of images, JSONL files")
    parser.add_argument("--out", type=Path, default=Path("results.jsonl"), help="results JSONL (appended)")
    parser.add_argument("--priority", choices=("bulk", "interactive"), default="bulk")
    parser.add_argument("--version", type=int, help="the model's version to run on (default: as its traffic routes)")
    return parser


class BatchError(RuntimeError):
    """A reason to stop, said in one line."""


def lines_of(paths: list[Path]) -> Iterator[tuple[str, bytes]]:
    """(custom_id, JSONL line) for every item the paths hold."""
    for path in paths:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES):
                yield _image_line(file, str(path / file.relative_to(path)))
        elif path.suffix.lower() in (".jsonl", ".ndjson"):
            with path.open("rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    if raw.strip():
                        yield _custom_id(raw, path, number), raw.rstrip(b"\r\n")
        elif path.is_file():
            yield _image_line(path, str(path))
        else:
            raise BatchError(f"{path}: no such file or folder")


def _image_line(file: Path, custom_id: str) -> tuple[str, bytes]:
    image = base64.b64encode(file.read_bytes()).decode()
    return custom_id, json.dumps({"custom_id": custom_id, "image": image}).encode()


def _custom_id(raw: bytes, path: Path, number: int) -> str:
    try:
        custom_id = json.loads(raw).get("custom_id")
    except (ValueError, AttributeError):
        custom_id = None
    # A line the API will refuse still goes up, so the refusal names it; its id here only for skipping.
    return custom_id if isinstance(custom_id, str) else f"{path}:{number}"


def done_ids(out: Path) -> set[str]:
    """The custom_ids a previous run already wrote."""
    if not out.exists():
        return set()
    ids = set()
    for raw in out.read_bytes().splitlines():
        try:
            ids.add(json.loads(raw)["custom_id"])
        except (ValueError, KeyError, TypeError):
            continue
    return ids


def uploads(lines: Iterator[tuple[str, bytes]], skip: set[str]) -> Iterator[list[bytes]]:
    """The lines not done yet, grouped into uploads under UPLOAD_BYTES."""
    group: list[bytes] = []
    size = 0
    for custom_id, line in lines:
        if custom_id in skip:
            continue
        if group and size + len(line) + 1 > UPLOAD_BYTES:
            yield group
            group, size = [], 0
        group.append(line)
        size += len(line) + 1
    if group:
        yield group


def cmd_batch(args: argparse.Namespace, client: Client) -> int:
    """Upload, follow and write the results; 0 when every batch ended, 1 on an error, 130 at Ctrl-C."""
    skip = done_ids(args.out)
    batches: list[Batch] = []
    try:
        try:
            for group in uploads(lines_of(args.paths), skip):
                batch = client.create_batch(args.model, group, priority=args.priority, version=args.version)
                batches.append(batch)
                for refused in batch.refused:
                    print(f"refused: {refused.error}", file=sys.stderr)
            if not batches:
                print(f"nothing to do: every item is already in {args.out}" if skip else "no items found")
                return 0
            _follow(client, batches, args.out, len(skip))
        except KeyboardInterrupt:
            for batch in batches:
                with contextlib.suppress(Conflict):  # it had ended
                    client.cancel_batch(batch.id)
            print(f"\ncanceled; what finished is in {args.out}", file=sys.stderr)
            return 130
    except (BatchError, InferqError, OSError) as exc:
        print(f"inferq batch: {exc}", file=sys.stderr)
        return 1
    return 0


def _follow(client: Client, batches: list[Batch], out: Path, already: int) -> None:
    """Append result lines as they arrive, with a progress bar, until every batch has ended."""
    read = {batch.id: 0 for batch in batches}
    total = sum(batch.total for batch in batches)
    with out.open("ab") as sink, tqdm(total=total, unit="item", desc="items", dynamic_ncols=True) as bar:
        if already:
            bar.write(f"skipping {already} item(s) already in {out}")
        following = list(batches)
        while following:
            for batch in list(following):
                # One read of each batch per round: a single bar over all of them, resumed at the lines read.
                for line in client.batch_results(batch.id, offset=read[batch.id]):
                    sink.write(json.dumps(line.to_dict(), separators=(",", ":")).encode() + b"\n")
                    read[batch.id] += 1
                    bar.update(1)
                sink.flush()
                if read[batch.id] >= batch.total:
                    following.remove(batch)
            if following:
                time.sleep(POLL_S)
