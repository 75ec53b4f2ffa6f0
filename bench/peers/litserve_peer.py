"""LitServe as its users write it: a ``LitAPI`` whose ``decode_request`` reads the multipart upload LitServe's docs
show, batched by LitServe itself (``max_batch_size``, ``batch_timeout``).

    python -m bench.peers.litserve_peer api --port 8300 --model-dir DIR [--max-batch 8] [--batch-timeout 0.005]

``POST /predict`` takes the input as the multipart field ``file`` and answers ``200 {"status": "finished",
"result": ...}``; ``GET /healthz`` answers once the model is loaded. As for every peer, the model is run by inferq's
own handler (``bench.peers.load_model``), a whole LitServe batch in one call, so pre- and postprocessing are the
same as inferq's and only the serving differs.
"""

# No ``from __future__ import annotations``: LitServe reads decode_request's annotation as a class (Request: the
# raw request, its form parsed), and FastAPI would take a string for a query parameter.
from typing import Any

import litserve as ls
from fastapi import Request

from bench.peers import job_view, load_model, parser


class HandlerAPI(ls.LitAPI):
    """One inferq model folder behind LitServe's batching."""

    def __init__(self, model_dir: str, threads: int, max_batch: int, batch_timeout_s: float) -> None:
        super().__init__(max_batch_size=max_batch, batch_timeout=batch_timeout_s, api_path="/predict")
        self.model_dir, self.threads = model_dir, threads

    def setup(self, device: str) -> None:
        self.handler = load_model(self.model_dir, self.threads)

    def decode_request(self, request: Request) -> tuple[bytes, str]:
        upload = request["file"]
        return upload.file.read(), upload.content_type or "application/octet-stream"

    def batch(self, inputs: list[tuple[bytes, str]]) -> list[tuple[bytes, str]]:
        return inputs  # the handler collates: its preprocess and collate run inside predict

    def predict(self, inputs: list[tuple[bytes, str]]) -> list[Any]:
        return list(self.handler.run(inputs))

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs

    def encode_response(self, output: Any) -> dict[str, Any]:
        return job_view(None, "finished", output)


def main() -> None:
    args = parser(__doc__, ["api"], redis=False, port=8300)
    args.add_argument("--max-batch", type=int, default=8)
    args.add_argument("--batch-timeout", type=float, default=0.005, help="seconds LitServe waits to fill a batch")
    options = args.parse_args()
    api = HandlerAPI(options.model_dir, options.threads, options.max_batch, options.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, healthcheck_path="/healthz")
    server.run(host=options.host, port=options.port, generate_client_file=False)


if __name__ == "__main__":
    main()
