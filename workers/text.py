"""Text handlers: the worker tokenizes, pads each batch to its longest item, and masks the padding."""

from __future__ import annotations

import math
from typing import Any

import torch

from inferq.shared.errors import ConfigError, InvalidInput
from inferq.shared.models import ModelConfig
from inferq.workers.collation import pad_sequences, to_device
from inferq.workers.formats import load_tokenizer
from inferq.workers.handlers import Handler, finite_list

# What a tokenizer reports as model_max_length when its files set none.
_UNSET_LENGTH = 1_000_000
_DEFAULT_MAX_TOKENS = 512


def _text(payload: bytes) -> str:
    """The stored text, checked: UTF-8 and not empty (the API checked it too; a bulk line's came the same way)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the text is not valid UTF-8: {exc}") from exc
    if not text.strip():
        raise InvalidInput("the text is empty")
    return text


def tokenizes_many(handler: Handler) -> TextHandler | None:
    """The handler when a batch's texts are tokenised in one call: a text handler whose ``preprocess`` is the
    built-in one (one that overrides only ``predict`` or ``postprocess`` included); else None."""
    if isinstance(handler, TextHandler) and type(handler).preprocess is TextHandler.preprocess:
        return handler
    return None


class TextHandler(Handler):
    """UTF-8 text in (the API stored the string as it was sent); token ids and an attention mask per item."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        if config.input.kind != "text":
            raise ConfigError(f"model {config.name!r}: handler {config.handler!r} needs a text input")
        self.tokenizer: Any = None
        self.max_tokens: int = _DEFAULT_MAX_TOKENS

    def load(self) -> None:
        super().load()
        self.tokenizer = load_tokenizer(self.config)
        if self.tokenizer.pad_token_id is None:
            raise ConfigError(
                f"model {self.config.name!r}: the tokenizer has no pad token, so batches cannot be padded"
            )
        model_config = getattr(self.model, "config", None)
        limits = [self.tokenizer.model_max_length, getattr(model_config, "max_position_embeddings", None)]
        known = [limit for limit in limits if isinstance(limit, int) and 0 < limit < _UNSET_LENGTH]
        self.max_tokens = min(known, default=_DEFAULT_MAX_TOKENS)

    def preprocess(self, payload: bytes, content_type: str) -> dict[str, torch.Tensor]:
        # Longer texts are cut at the model's limit, as every encoder server does.
        encoded = self.tokenizer(_text(payload), truncation=True, max_length=self.max_tokens)
        return {key: torch.tensor(value, dtype=torch.long) for key, value in encoded.items()}

    def preprocess_many(self, payloads: list[tuple[bytes, str]]) -> list[dict[str, torch.Tensor] | Exception]:
        """A batch's items at once, in order, an item that fails as its exception in its place: what ``preprocess``
        gives each, from one call of the tokenizer for them all (its per-call cost was most of a short text's;
        the worker calls this only while ``preprocess`` is this class's own: ``tokenizes_many``)."""
        out: list[Any] = []  # each place filled below: an item or its exception
        texts: list[str] = []
        places: list[int] = []
        for payload, _ in payloads:
            try:
                texts.append(_text(payload))
            except InvalidInput as exc:
                out.append(exc)
                continue
            places.append(len(out))
            out.append(None)
        if texts:
            try:
                encoded = self.tokenizer(texts, truncation=True, max_length=self.max_tokens)
            except Exception:  # one text the tokenizer refuses fails alone, as it would by itself
                for place in places:
                    try:
                        out[place] = self.preprocess(*payloads[place])
                    except Exception as exc:
                        out[place] = exc
                return out
            names = list(encoded.keys())
            for n, place in enumerate(places):
                out[place] = {name: torch.tensor(encoded[name][n], dtype=torch.long) for name in names}
        return out

    def item_length(self, item: dict[str, torch.Tensor]) -> int:
        return int(item["input_ids"].shape[0])

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        # Right padding with a zero attention mask: a padded item's result matches its result alone.
        batch = pad_sequences(items, pad_value={"input_ids": self.tokenizer.pad_token_id})
        return dict(to_device(batch, self.device))

    def warmup_payload(self) -> tuple[bytes, str] | None:
        return b"Warm-up text for the first batch.", "text/plain; charset=utf-8"


class TextClassifier(TextHandler):
    """A sequence-classification model; the result is the top label, its score and the top k."""

    auto_class = "AutoModelForSequenceClassification"

    def load(self) -> None:
        super().load()
        id2label = getattr(getattr(self.model, "config", None), "id2label", None) or {}
        self.labels = self.config.labels or [str(id2label.get(i, i)) for i in range(len(id2label))]

    def postprocess(self, output: torch.Tensor) -> dict[str, Any]:
        probs = torch.softmax(output.float().flatten(), dim=0)
        k = min(self.config.top_k, probs.numel())
        values, indices = torch.topk(probs, k)
        top = [
            {"label": self.labels[i] if i < len(self.labels) else str(i), "score": _score(p)}
            for p, i in zip(values.tolist(), indices.tolist(), strict=True)
        ]
        return {"label": top[0]["label"], "score": top[0]["score"], "top_k": top}


class TextEmbedding(TextHandler):
    """An encoder; the result is the mean of its token states over the attention mask, L2-normalised."""

    auto_class = "AutoModel"
    # Its result is the masked mean of the token states: the pooler, which encoders are often saved without, never runs.
    unused_weights = frozenset({"pooler"})

    def predict(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        outputs = self.model(**batch)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    def postprocess(self, output: torch.Tensor) -> dict[str, Any]:
        return {"embedding": finite_list(output), "dim": int(output.numel())}


def _score(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None
