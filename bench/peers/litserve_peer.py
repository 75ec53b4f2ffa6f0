"""LitServe as its users write it: a ``LitAPI`` whose ``decode_request`` reads the multipart upload LitServe's docs
show (or, for a text model, the JSON ``{"input": "..."}`` its docs decode), batched by LitServe itself
(``max_batch_size``, ``batch_timeout``).

    python -m bench.peers.litserve_peer api --port 8300 --model-dir DIR [--max-batch 8] [--batch-timeout 0.005]
        [--text] [--stats FILE]

``POST /predict`` takes the input as the multipart field ``file`` (``--text``: the JSON field ``input``) and
answers ``200 {"status": "finished", "result": ...}``; ``GET /healthz`` answers once the model is loaded. As for
every peer, the model is run by inferq's own handler (``bench.peers.load_model``), a whole LitServe batch in one
call, so pre- and postprocessing are the same as inferq's and only the serving differs: a text batch is padded to
its longest text, as a LitServe user's batch is. ``--stats`` keeps the token counts there (JSON: batches, items,
tokens, padded_tokens), so the benchmark can set LitServe's padding waste beside inferq's.
"""

# No ``from __future__ import annotations``: LitServe reads decode_request's annotation as a class (Request: the
# raw request, its form parsed), and FastAPI would take a string for a query parameter.
import json
import os
from typing import Any

import litserve as ls
import torch
from fastapi import Request

from bench.peers import job_view, load_model, parser


class HandlerAPI(ls.LitAPI):
    """One inferq model folder behind LitServe's batching."""

    def __init__(self, model_dir: str, threads: int, max_batch: int, batch_timeout_s: float, stats: str = "") -> None:
        super().__init__(max_batch_size=max_batch, batch_timeout=batch_timeout_s, api_path="/predict")
        self.model_dir, self.threads, self.stats = model_dir, threads, stats
        self.counts = {"batches": 0, "items": 0, "tokens": 0, "padded_tokens": 0}

    def setup(self, device: str) -> None:
        self.handler = load_model(self.model_dir, self.threads)

    def decode_request(self, request: Request) -> tuple[bytes, str]:
        upload = request["file"]
        return upload.file.read(), upload.content_type or "application/octet-stream"

    def batch(self, inputs: list[tuple[bytes, str]]) -> list[tuple[bytes, str]]:
        return inputs  # the handler collates: its preprocess and collate run inside predict

    def predict(self, inputs: list[tuple[bytes, str]]) -> list[Any]:
        # The handler's run() (preprocess, collate, predict, postprocess), with the lengths counted on the way.
        handler = self.handler
        items = [handler.preprocess(payload, content_type) for payload, content_type in inputs]
        with torch.inference_mode():
            outputs = handler.uncollate(handler.predict(handler.collate(items)), len(items))
        if self.stats:
            self._count([handler.item_length(item) for item in items])
        return [handler.postprocess(output) for output in outputs]

    def _count(self, lengths: list[int | None]) -> None:
        known = [length for length in lengths if length is not None]
        self.counts["batches"] += 1
        self.counts["items"] += len(lengths)
        self.counts["tokens"] += sum(known)
        self.counts["padded_tokens"] += len(known) * max(known, default=0)
        with open(f"{self.stats}.tmp", "w") as out:
            json.dump(self.counts, out)
        os.replace(f"{self.stats}.tmp", self.stats)

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs

    def encode_response(self, output: Any) -> dict[str, Any]:
        return job_view(None, "finished", output)


class TextAPI(HandlerAPI):
    """A text model: the JSON body ``{"input": "..."}`` that LitServe decodes for its users."""

    def decode_request(self, request):  # type: ignore[no-untyped-def]  # unannotated: LitServe parses the JSON
        return str(request["input"]).encode(), "text/plain; charset=utf-8"


def main() -> None:
    args = parser(__doc__, ["api"], redis=False, port=8300)
    args.add_argument("--max-batch", type=int, default=8)
    args.add_argument("--batch-timeout", type=float, default=0.005, help="seconds LitServe waits to fill a batch")
    args.add_argument("--text", action="store_true", help='a text model: the body is JSON {"input": "..."}')
    args.add_argument("--stats", default="", help="a file to keep the token counts in (JSON), for padding waste")
    options = args.parse_args()
    kind = TextAPI if options.text else HandlerAPI
    api = kind(options.model_dir, options.threads, options.max_batch, options.batch_timeout, options.stats)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, healthcheck_path="/healthz")
    server.run(host=options.host, port=options.port, generate_client_file=False)


if __name__ == "__main__":
    main()
