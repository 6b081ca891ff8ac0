"""Tiny models trained for a few seconds on Bible verses, each with a byte-level BPE tokenizer
learnt from the same verses: a GPT (with a chat template) as a language model, and an
encoder-decoder Transformer and a T5 taught to copy their source (so that different sources
get different outputs, and a mix-up in a batch shows); shared by the server's tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tokenizers import Tokenizer

import attnkit
from attnkit.data import corpora
from attnkit.data.padding import pad_right
from attnkit.data.tokenizer import specials_of, train_tokenizer
from attnkit.models import Model, build_model
from attnkit.serve.server import spawn

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="session")
def verses() -> list[tuple[str, str]]:
    return corpora.bible_pairs("4", "l").train[:2000]


@pytest.fixture(scope="session")
def tokenizer(verses: list[tuple[str, str]]) -> Tokenizer:
    return train_tokenizer([text for pair in verses for text in pair], vocab_size=600)


def _train(model: Model, batches: list[tuple[torch.Tensor, torch.Tensor]], steps: int = 120) -> Model:
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread
    try:
        for step in range(steps):
            source, target = batches[step % len(batches)]
            if model.config.is_encoder_decoder:
                logits = model(source, decoder_input_ids=target[:, :-1]).logits
            else:
                logits = model(target[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten(), ignore_index=0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _batches(tokenizer: Tokenizer, verses: list[tuple[str, str]], bos: int, eos: int) -> list:
    """Batches of 16 (source, target): a verse + </s>, and <s> + the same verse + </s>."""
    out = []
    for start in range(0, 256, 16):
        words = [tokenizer.encode(s, add_special_tokens=False).ids[:30] for s, _ in verses[start : start + 16]]
        source, _ = pad_right([[*w, eos] for w in words], 0)
        target, _ = pad_right([[bos, *w, eos] for w in words], 0)
        out.append((source, target))
    return out


def _model(preset: str, tokenizer: Tokenizer, verses: list[tuple[str, str]], **changes: object) -> Model:
    s = specials_of(tokenizer)
    torch.manual_seed(0)
    config = attnkit.preset(preset, vocab_size=s.vocab_size, pad_token_id=s.pad, eos_token_id=s.eos, **changes)
    model = build_model(config)
    start = config.decoder_start_token_id if config.is_encoder_decoder else s.bos
    model = _train(model, _batches(tokenizer, verses, start, s.eos))
    model.tokenizer = tokenizer
    return model


@pytest.fixture(scope="session")
def gpt(tokenizer: Tokenizer, verses: list[tuple[str, str]]) -> Model:
    model = _model("gpt-tiny", tokenizer, verses, bos_token_id=specials_of(tokenizer).bos)
    model.chat_template = CHAT_TEMPLATE
    return model


@pytest.fixture(scope="session")
def long_gpt(tokenizer: Tokenizer, verses: list[tuple[str, str]]) -> Model:
    """The GPT with a context of 1,024 positions: room for a system message that lists tools."""
    model = _model("gpt-tiny", tokenizer, verses, bos_token_id=specials_of(tokenizer).bos, max_len=1024)
    model.chat_template = CHAT_TEMPLATE
    return model


@pytest.fixture(scope="session")
def translator(tokenizer: Tokenizer, verses: list[tuple[str, str]]) -> Model:
    return _model("transformer-tiny", tokenizer, verses, decoder_start_token_id=specials_of(tokenizer).bos)


@pytest.fixture(scope="session")
def t5(tokenizer: Tokenizer, verses: list[tuple[str, str]]) -> Model:
    return _model("t5-tiny", tokenizer, verses, decoder_start_token_id=specials_of(tokenizer).pad)


@pytest.fixture
def serving() -> Callable:
    """``attnkit serve`` as a real process on a free port (:func:`attnkit.serve.server.spawn`),
    decoding eagerly unless the flags say ``--compile``: every batch layout of a compiled server
    compiles at its first step, which these tests are not about. fp32 unless the flags say
    ``--weights``: the tests compare what the server answers with the library's fp32 model
    (``--weights auto``, the command's default, is tested in tests/models/test_auto.py)."""
    return lambda directory, *flags: spawn(
        directory,
        *flags,
        *([] if "--weights" in flags else ["--weights", "fp32"]),
        *([] if "--compile" in flags else ["--no-compile"]),
        threads=1,
        timeout=300 if "--compile" in flags else 90,  # a compiled server compiles before it listens
    )
