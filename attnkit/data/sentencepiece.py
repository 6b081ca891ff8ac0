"""SentencePiece models (``*.spm``, ``spiece.model``, ``tokenizer.model``) as ``tokenizers``
tokenizers that encode as ``SentencePieceProcessor.encode`` does.

A SentencePiece model file is one protobuf ``ModelProto``: its pieces with their scores and
types, the trainer's settings (unigram or BPE, byte fallback, the unknown piece) and the
normalizer's (the precompiled NFKC character map, whitespace handling). It is read here with a
small reader of the protobuf wire format, so loading needs neither ``sentencepiece`` nor
``protobuf``; both are used by the tests, as the oracles. The tokenizer built from it follows
the model's own settings, in SentencePiece's order: the character map, extra spaces removed,
spaces written as ``▁``, a ``▁`` before the text; decoding reverses the last three.

Marian (OPUS-MT) numbers its pieces with its own ``vocab.json``, not by their place in the
SentencePiece file: :func:`spm_tokenizer` takes that numbering, keeps the SentencePiece scores
of the pieces the model has, and gives the vocabulary's other pieces (the target language's)
a score so low that the lattice takes them only where the model has nothing else, as
``MarianTokenizer`` does when it looks a piece up by its text.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, Unigram

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece.Type
UNIGRAM, BPE_MODEL = 1, 2  # TrainerSpec.ModelType
UNREACHABLE = -1e9  # the score of a vocabulary piece the SentencePiece model lacks


@dataclass(frozen=True)
class Piece:
    text: str
    score: float
    kind: int  # NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED or BYTE


@dataclass(frozen=True)
class SentencePieceModel:
    """The parts of a ``ModelProto`` a tokenizer needs; the defaults are the proto's own."""

    pieces: tuple[Piece, ...]
    model_type: int = UNIGRAM
    byte_fallback: bool = False
    unk_id: int = 0
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("a varint runs past the end")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: an int for a varint, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
            continue
        if wire == 2:
            size, i = _varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"field {number} has wire type {wire}, which a SentencePiece model never uses")
        if i + size > len(buf):
            raise ValueError(f"field {number} runs past the end")
        yield number, buf[i : i + size]
        i += size


def _int32(value: int) -> int:
    """A varint read as protobuf's int32 (negatives are written as 10-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def parse_model(data: bytes) -> SentencePieceModel:
    """The ``ModelProto`` in ``data``; a ``ValueError`` where it is not one."""
    pieces: list[Piece] = []
    trainer: dict[int, int | bytes] = {}
    normalizer: dict[int, int | bytes] = {}
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):  # pieces
            fields = dict(_fields(value))
            text, score = fields.get(1, b""), fields.get(2, b"\0\0\0\0")
            if not isinstance(text, bytes) or not isinstance(score, bytes) or len(score) != 4:
                raise ValueError("a piece is malformed")
            pieces.append(Piece(text.decode("utf-8"), struct.unpack("<f", score)[0], int(fields.get(3, NORMAL))))
        elif number == 2 and isinstance(value, bytes):
            trainer = dict(_fields(value))
        elif number == 3 and isinstance(value, bytes):
            normalizer = dict(_fields(value))
    if not pieces:
        raise ValueError("it holds no pieces")
    charsmap = normalizer.get(2, b"")
    model = SentencePieceModel(
        pieces=tuple(pieces),
        model_type=int(trainer.get(3, UNIGRAM)),
        byte_fallback=bool(trainer.get(35, 0)),
        unk_id=_int32(int(trainer.get(40, 0))),
        precompiled_charsmap=charsmap if isinstance(charsmap, bytes) else b"",
        add_dummy_prefix=bool(normalizer.get(3, 1)),
        remove_extra_whitespaces=bool(normalizer.get(4, 1)),
        escape_whitespaces=bool(normalizer.get(5, 1)),
    )
    if model.model_type not in (UNIGRAM, BPE_MODEL):
        raise ValueError(f"its model type is {model.model_type}; only unigram (1) and BPE (2) models are read")
    if not 0 <= model.unk_id < len(pieces):
        raise ValueError(f"its unknown-piece id {model.unk_id} is outside its {len(pieces)} pieces")
    return model


def read_model(path: Path) -> SentencePieceModel:
    """The SentencePiece model in ``path``: one ``ValueError`` naming the file where it cannot be read."""
    try:
        return parse_model(path.read_bytes())
    except (ValueError, UnicodeDecodeError, struct.error) as err:
        raise ValueError(f"{path} is not a SentencePiece model ({err}); it may be truncated, replace it") from None


def _merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece BPE model: every split of a piece into two pieces, the
    higher-scoring result first (SentencePiece merges by score; the file has no merge list)."""
    ranked = []
    for token, score in scores.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in scores and right in scores:
                ranked.append((-score, vocab[token], left, right))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def spm_tokenizer(
    model: SentencePieceModel, vocab: dict[str, int] | None = None, end: str | None = None, trim: bool = False
) -> Tokenizer:
    """A tokenizer encoding as ``model`` does. ``vocab``: piece -> id where the checkpoint
    numbers pieces itself (Marian's ``vocab.json``); None numbers them by their place in the
    model. ``end``: a token appended to every encoding (``</s>`` for Marian and T5). ``trim``:
    decoded text loses the spaces at both ends (``MarianTokenizer`` strips them), not only the
    ``▁`` SentencePiece put before it."""
    if vocab is None:
        vocab = {}
        for i, piece in enumerate(model.pieces):
            vocab.setdefault(piece.text, i)
    known = {p.text: p for p in model.pieces}
    order = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in order] != list(range(len(order))):
        raise ValueError("the vocabulary's ids are not 0..n-1, each once; re-create vocab.json")
    unk = model.pieces[model.unk_id].text
    if unk not in vocab:
        raise ValueError(f"the vocabulary lacks the unknown piece {unk!r}; add it to vocab.json")
    if model.model_type == UNIGRAM:
        scored = [(t, known[t].score if t in known else UNREACHABLE) for t in order]
        tokenizer = Tokenizer(Unigram(scored, unk_id=vocab[unk], byte_fallback=model.byte_fallback))
    else:
        normal = {t: known[t].score for t in order if t in known and known[t].kind == NORMAL}
        tokenizer = Tokenizer(
            BPE(vocab, _merges(vocab, normal), unk_token=unk, fuse_unk=True, byte_fallback=model.byte_fallback)
        )
    steps = []
    if model.precompiled_charsmap:
        steps.append(normalizers.Precompiled(model.precompiled_charsmap))
    if model.remove_extra_whitespaces:  # spaces only: SentencePiece leaves newlines alone
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if model.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if model.add_dummy_prefix:  # Metaspace adds no prefix to a text already starting with ▁; SentencePiece does
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    tokenizer.normalizer = normalizers.Sequence(steps)
    steps = [decoders.Replace("▁", " ")]
    if model.byte_fallback:
        steps.append(decoders.ByteFallback())
    steps.append(decoders.Fuse())
    if trim:
        steps.append(decoders.Replace(Regex(r"\A +| +\z"), ""))
    elif model.add_dummy_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(steps)
    controls = [p.text for p in model.pieces if p.kind in (CONTROL, UNKNOWN) and p.text in vocab]
    codes = [t for t in order if re.fullmatch(r">>[^<>\s]+<<", t)]  # Marian's target-language tokens
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in controls])
    tokenizer.add_tokens([AddedToken(p.text, normalized=False) for p in model.pieces if p.kind == USER_DEFINED])
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in codes])
    if end is not None:
        if end not in vocab:
            raise ValueError(f"the vocabulary lacks the end token {end!r}; add it to vocab.json")
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {end}", pair=f"$A $B {end}", special_tokens=[(end, vocab[end])]
        )
    return tokenizer
