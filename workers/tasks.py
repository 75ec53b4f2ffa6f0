"""The function every inference job names, for RQ workers that do not batch.

inferq's BatchWorker never calls it: it runs whole batches itself. A plain ``rq worker``
pointed at a model queue (with ``--serializer rq.serializers.JSONSerializer``) still gets a
correct, unbatched answer from it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, cast

from rq import get_current_job

from inferq.shared import keys
from inferq.shared.errors import InvalidInput
from inferq.shared.lifecycle.info import F
from inferq.shared.models import load_model_config
from inferq.shared.settings import get_settings
from inferq.workers.handlers import Handler, load_handler, resolve_device


@lru_cache(maxsize=8)
def _handler(model: str) -> Handler:
    settings = get_settings()
    config = load_model_config(settings.models_dir / model)
    handler = load_handler(config, resolve_device(config.device), max_image_pixels=settings.max_image_pixels)
    handler.load()
    return handler


def infer(model: str) -> Any:
    """Run one job's input through its model."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("infer() runs inside an RQ job")
    connection = job.connection
    payload = cast(bytes | None, connection.get(keys.payload_key(job.id)))
    content_type = cast(bytes, connection.hget(keys.info_key(job.id), F.CONTENT_TYPE) or b"")
    if payload is None:
        raise InvalidInput("the job's input expired before it ran")
    (result,) = _handler(model).run([(payload, content_type.decode())])
    connection.delete(keys.payload_key(job.id))
    return result
