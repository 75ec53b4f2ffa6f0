# syntax=docker/dockerfile:1
# One image for every inferq process: the API (the default CMD), `inferq worker` and `inferq webhooks`.
#
#   CPU:  docker build -t inferq .
#   GPU:  docker build -t inferq:cu128 --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# GPU images pass a CUDA wheel index in TORCH_INDEX_URL (pick the cuXXX build the host's driver supports);
# a small CPU-only image can pass https://download.pytorch.org/whl/cpu. Empty means PyPI's default wheel.
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 --user-group inferq

WORKDIR /app

# torch first, in its own layer: the largest download, and the same choice `make setup` makes.
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"

# The project itself, without the dev extras; the torch installed above satisfies its requirement.
COPY pyproject.toml README.md ./
COPY api/ api/
COPY shared/ shared/
COPY workers/ workers/
COPY inferq/ inferq/
RUN pip install '.[onnx]' && rm -rf build *.egg-info

# The model repository is read at run time, not installed; mount another over it to serve other models.
COPY models/ models/
ENV INFERQ_MODELS_DIR=/app/models

USER inferq
EXPOSE 8000
CMD ["inferq", "api", "--host", "0.0.0.0"]
