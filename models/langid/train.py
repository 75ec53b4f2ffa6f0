"""Train the ``langid`` demo model: a tiny BERT that names the language of a short text.

Run from the repository root: ``.venv/bin/python models/langid/train.py``. It needs no download: the
sentences are random words from the per-language word lists the ``faker`` package ships, and the
WordPiece tokenizer is trained here on the training sentences. It writes ``models/langid/hf/``
(``save_pretrained`` output: config, safetensors weights and tokenizer files), which loads offline.

Each language's word list is split 80/20 once; the held-out sentences are made only of held-out words,
so the accuracy printed is on words the model (and its tokenizer) never saw.
"""

from __future__ import annotations

import math
import random
import re
import sys
import time
from collections.abc import Iterator
from functools import cache
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

if TYPE_CHECKING:
    from transformers import BertForSequenceClassification, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "hf"
# Language code (the model's label) -> the faker locale whose lorem word list supplies its words.
LANGUAGES = {
    "en": "en_US",
    "de": "de_DE",
    "fr": "fr_FR",
    "es": "es_ES",
    "it": "it_IT",
    "nl": "nl_NL",
    "pl": "pl_PL",
    "cs": "cs_CZ",
}
SPLIT_SEED = 0
HELDOUT_SEED = 20240
HELDOUT_FRACTION = 0.2
# Held-out texts are sentence-length, made only of words the model never saw: what a language
# identifier is asked in practice, and hard enough that the score means something.
HELDOUT_MIN_WORDS, HELDOUT_MAX_WORDS = 8, 14
MIN_ACCURACY = 0.97
VOCAB_SIZE = 1000
HIDDEN_SIZE = 64
TRAIN_MIN_WORDS = 1
MAX_LENGTH = 128
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
STEPS = 1500
BATCH_SIZE = 64
LEARNING_RATE = 3e-3
WARMUP_STEPS = 100
# BPE-dropout while training: a word is sometimes cut into smaller pieces, so the model learns what pieces
# say about a language, which is all it has for a word it never saw.
BPE_DROPOUT = 0.1
MASK_PROB = 0.0
DROPOUT = 0.1
EVAL_EVERY = 300
# Single words: entries with spaces, digits or punctuation (pl_PL's "stać się", "np.", "1000") are dropped.
PUNCTUATION = ".,;:!?'\"()-0123456789"
_WORD = re.compile(r"[^\W\d_]+")


@cache
def word_split() -> dict[str, tuple[list[str], list[str]]]:
    """Language code -> (train words, held-out words), from faker's word lists with a fixed seed."""
    lists: dict[str, list[str]] = {}
    for code, locale in LANGUAGES.items():
        provider = import_module(f"faker.providers.lorem.{locale}").Provider
        # Sorted before shuffling so the split depends on the seed, not on the list's order or duplicates.
        lists[code] = sorted({w.strip().lower() for w in provider.word_list if _WORD.fullmatch(w.strip())})
    heldout: dict[str, list[str]] = {}
    for code, words in lists.items():
        shuffled = words[:]
        random.Random(f"{SPLIT_SEED}-{code}").shuffle(shuffled)
        heldout[code] = sorted(shuffled[: max(1, round(len(shuffled) * HELDOUT_FRACTION))])
    # A word held out in any language (e.g. "a", held out in Italian) is kept out of every language's
    # training words, so a held-out sentence never contains a word seen in training.
    unseen = set().union(*heldout.values())
    return {code: ([w for w in words if w not in unseen], heldout[code]) for code, words in lists.items()}


def make_sentence(rng: random.Random, words: list[str], min_words: int = 4, max_words: int = 12) -> str:
    """min_words..max_words random words joined by spaces, sometimes capitalised and ending in a period."""
    text = " ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words)))
    if rng.random() < 0.5:
        text = text[0].upper() + text[1:]
    if rng.random() < 0.5:
        text += "."
    return text


def heldout_texts(n: int = 200, seed: int = HELDOUT_SEED) -> tuple[list[str], list[str]]:
    """(texts, language codes): n sentences made only of held-out words, the languages in turn."""
    split = word_split()
    codes = list(LANGUAGES)
    rng = random.Random(seed)
    labels = [codes[i % len(codes)] for i in range(n)]
    texts = [make_sentence(rng, split[code][1], HELDOUT_MIN_WORDS, HELDOUT_MAX_WORDS) for code in labels]
    return texts, labels


def training_sentences(rng: random.Random) -> Iterator[tuple[str, int]]:
    """An endless stream of (sentence, label id) from training words, the language drawn uniformly."""
    split = word_split()
    codes = list(LANGUAGES)
    while True:
        label = rng.randrange(len(codes))
        # Down to one word, so a served text of one or two words is not out of the training distribution.
        yield make_sentence(rng, split[codes[label]][0], min_words=TRAIN_MIN_WORDS), label


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """A lowercasing BPE tokenizer trained on the training words only, as a transformers tokenizer."""
    from transformers import PreTrainedTokenizerFast

    split = word_split()
    # Each training word once, not sentences: frequent whole words would otherwise take the vocabulary,
    # and an unseen word would then be cut into pieces the model rarely met in training.
    corpus = sorted({word for train_words, _ in split.values() for word in train_words})
    # Punctuation and digits as words of their own (twice, for min_frequency), so "." is a token, not [UNK].
    corpus += [char for char in PUNCTUATION for _ in range(2)]
    # "</w>" marks a word's last piece: endings such as "-ość", "-ción" or "-heit" say much about the language.
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    # Lowercase but keep accents: ł, ř, ñ and è are much of what tells these languages apart.
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        end_of_word_suffix="</w>",
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_LENGTH,
        padding_side="right",
    )


def build_model(tokenizer: PreTrainedTokenizerFast) -> BertForSequenceClassification:
    """A randomly initialised two-layer BERT with one label per language."""
    from transformers import BertConfig, BertForSequenceClassification

    codes = list(LANGUAGES)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * HIDDEN_SIZE,
        max_position_embeddings=MAX_LENGTH,
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
        hidden_dropout_prob=DROPOUT,
        num_labels=len(codes),
        id2label=dict(enumerate(codes)),
        label2id={code: i for i, code in enumerate(codes)},
    )
    return BertForSequenceClassification(config)


def predict(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, texts: list[str], batch: int = 64) -> list[str]:
    """The language code the model gives each text, in padded batches with their attention masks."""
    model.eval()
    id2label = model.config.id2label
    out: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            encoded = tokenizer(texts[start : start + batch], padding=True, truncation=True, return_tensors="pt")
            out.extend(id2label[i] for i in model(**encoded).logits.argmax(dim=-1).tolist())
    return out


def accuracy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, texts: list[str], labels: list[str]) -> float:
    """The fraction of texts whose predicted language is the label."""
    predicted = predict(model, tokenizer, texts)
    return sum(p == y for p, y in zip(predicted, labels, strict=True)) / len(labels)


def padding_difference(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> float:
    """Max abs difference between each text's logits alone and in one right-padded batch with the others."""
    model.eval()
    with torch.inference_mode():
        batched = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
        alone = torch.cat([model(**tokenizer([t], truncation=True, return_tensors="pt")).logits for t in texts])
    return float((batched - alone).abs().max())


def train(seed: int = 0) -> tuple[BertForSequenceClassification, PreTrainedTokenizerFast]:
    """Train the tokenizer, then the model for STEPS batches of fresh training sentences."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    tokenizer = build_tokenizer(seed)
    model = build_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)

    def schedule(step: int) -> float:
        # Linear warm-up, then cosine decay: a high peak rate for a tiny model, tapered to settle the weights.
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        return 0.5 * (1 + math.cos(math.pi * (step - WARMUP_STEPS) / (STEPS - WARMUP_STEPS)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    stream = training_sentences(random.Random(f"train-{seed}"))
    texts, labels = heldout_texts()
    bpe = tokenizer.backend_tokenizer.model
    model.train()
    bpe.dropout = BPE_DROPOUT
    for step in range(STEPS):
        pairs = [next(stream) for _ in range(BATCH_SIZE)]
        encoded = tokenizer([text for text, _ in pairs], padding=True, truncation=True, return_tensors="pt")
        targets = torch.tensor([label for _, label in pairs])
        if MASK_PROB:
            ids = encoded["input_ids"]
            # Hide some word pieces so that no one piece decides; special tokens and padding stay.
            hide = (torch.rand(ids.shape, generator=generator) < MASK_PROB) & (ids > 4)
            encoded["input_ids"] = ids.masked_fill(hide, tokenizer.mask_token_id)
        loss = model(**encoded, labels=targets).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if (step + 1) % EVAL_EVERY == 0:
            bpe.dropout = None
            acc = accuracy(model, tokenizer, texts, labels)
            bpe.dropout = BPE_DROPOUT
            model.train()
            print(f"step {step + 1:5d}  loss {loss.item():.4f}  held-out accuracy {acc:.4f}")
    # Served texts are cut one way only; the saved tokenizer must not carry the dropout.
    bpe.dropout = None
    return model.eval(), tokenizer


def main() -> int:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    # One intra-op thread: these models are too small to gain from a second (7.1 against 8.3 s for digits), and
    # OpenMP's threads spin while they wait for each other, so beside other busy processes two of them took over
    # 600 s where one takes 35 (the README's rollout step, run under a loaded CI machine).
    torch.set_num_threads(1)
    started = time.monotonic()
    model, tokenizer = train()
    texts, labels = heldout_texts(2000)
    acc = accuracy(model, tokenizer, texts, labels)
    print(f"held-out accuracy {acc:.4f} on {len(texts)} texts ({time.monotonic() - started:.1f}s)")
    if acc < MIN_ACCURACY:
        print(f"accuracy below {MIN_ACCURACY}: {OUTPUT} not written", file=sys.stderr)
        return 1
    model.save_pretrained(OUTPUT)  # safetensors, the only format transformers 5 writes
    tokenizer.save_pretrained(OUTPUT)
    weights = OUTPUT / "model.safetensors"
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {OUTPUT}: {params} parameters, model.safetensors {weights.stat().st_size} bytes")

    # What a worker does: load the folder offline and get the same answers, padded or not.
    loaded_tokenizer = AutoTokenizer.from_pretrained(OUTPUT, local_files_only=True)
    loaded = AutoModelForSequenceClassification.from_pretrained(OUTPUT, local_files_only=True).eval()
    reloaded_acc = accuracy(loaded, loaded_tokenizer, texts, labels)
    # Short and long texts together, so most rows of the batch carry padding.
    mixed = heldout_texts(64, seed=HELDOUT_SEED + 1)[0] + [" ".join(texts[:2])]
    difference = padding_difference(loaded, loaded_tokenizer, mixed)
    print(f"reloaded: held-out accuracy {reloaded_acc:.4f}; alone vs padded batch max |logit diff| {difference:.2e}")
    if reloaded_acc != acc or difference > 1e-4:
        print("the reloaded folder does not reproduce the trained model", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
