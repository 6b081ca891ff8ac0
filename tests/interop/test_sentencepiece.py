"""SentencePiece tokenizers of real checkpoints: Marian's source.spm/target.spm + vocab.json
and T5's spiece.model, from models trained here on Bible verses by ``sentencepiece`` itself.
attnkit reads the files without ``sentencepiece``; the ids and texts must equal
``transformers``' MarianTokenizer and T5Tokenizer (and SentencePiece's own encoding) on real
sentences, and ``attnkit translate`` on the directory must give ``transformers.generate``'s
translation with the checkpoint's generation_config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.cli import main
from attnkit.data import corpora
from attnkit.data.sentencepiece import parse_model, read_model

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

EDGE_CASES = [
    "  Extra   spaces  around  ",
    "Ωmega café naïve — “quoted” 1,024",
    "你好 world",  # characters the models never saw
    "▁a piece marker written in the text",
    "a\nnew line",
    "",
]


@pytest.fixture(scope="module")
def pairs() -> corpora.Split:
    return corpora.bible_pairs("4", "l")


def train_spm(texts: list[str], prefix: Path, vocab_size: int, **options: object) -> Path:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=str(prefix), vocab_size=vocab_size, minloglevel=2, **options
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory: pytest.TempPathFactory, pairs: corpora.Split) -> Path:
    """source.spm (English), target.spm (French) and one vocab.json numbering both, Marian's
    way: its own order, not SentencePiece's (</s> first, <pad> last)."""
    root = tmp_path_factory.mktemp("marian-spm")
    train = pairs.train[:3000]
    for name, texts in (("source", [s for s, _ in train]), ("target", [t for _, t in train])):
        shutil.copy(train_spm(texts, root / name, 600), root / f"{name}.spm")
    vocab: dict[str, int] = {"</s>": 0, "<unk>": 1}
    for name in ("target", "source"):
        model = spm.SentencePieceProcessor(model_file=str(root / f"{name}.spm"))
        for i in range(model.get_piece_size()):
            if not model.is_control(i) and not model.is_unknown(i):
                vocab.setdefault(model.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return root


def marian_directory(files: Path, path: Path) -> Path:
    """A random MarianMTModel over ``files``' vocabulary, saved by transformers, with its
    SentencePiece files beside it (no tokenizer.json, as OPUS-MT ships)."""
    vocab = json.loads((files / "vocab.json").read_text())
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.3 if p.dim() == 2 else 0.1)
    model.generation_config.update(num_beams=3, max_length=12, bad_words_ids=[[pad]], length_penalty=1.0)
    model.save_pretrained(path)
    for name in ("source.spm", "target.spm", "vocab.json"):
        shutil.copy(files / name, path / name)
    return path


def test_the_model_file_reader_equals_protobuf(marian_files: Path) -> None:
    """attnkit's own reader of the ModelProto wire format against protobuf's generated one."""
    pytest.importorskip("google.protobuf")
    from transformers.convert_slow_tokenizer import import_protobuf

    pb = import_protobuf()  # the module transformers itself reads SentencePiece files with

    for name in ("source.spm", "target.spm"):
        data = (marian_files / name).read_bytes()
        proto = pb.ModelProto()
        proto.ParseFromString(data)
        ours = parse_model(data)
        assert [(p.text, p.score, p.kind) for p in ours.pieces] == [(p.piece, p.score, p.type) for p in proto.pieces]
        assert (ours.model_type, ours.unk_id, ours.byte_fallback) == (
            proto.trainer_spec.model_type, proto.trainer_spec.unk_id, proto.trainer_spec.byte_fallback,
        )  # fmt: skip
        spec = proto.normalizer_spec
        assert ours.precompiled_charsmap == spec.precompiled_charsmap and ours.precompiled_charsmap
        assert (ours.add_dummy_prefix, ours.remove_extra_whitespaces, ours.escape_whitespaces) == (
            spec.add_dummy_prefix, spec.remove_extra_whitespaces, spec.escape_whitespaces,
        )  # fmt: skip


def test_marian_spm_gives_marian_tokenizer_ids_and_text(
    marian_files: Path, pairs: corpora.Split, tmp_path: Path
) -> None:
    directory = marian_directory(marian_files, tmp_path / "opus-mt")
    model = attnkit.from_pretrained(directory)
    reference = transformers.MarianTokenizer.from_pretrained(directory)
    sources = [s for s, _ in pairs.test[:300]] + EDGE_CASES
    for text in sources:
        assert model.tokenizer.encode(text).ids == reference(text).input_ids, text
    target = spm.SentencePieceProcessor(model_file=str(directory / "target.spm"))
    vocab = reference.get_vocab()
    for text in [t for _, t in pairs.test[:300]] + EDGE_CASES:
        ids = [vocab.get(p, vocab["<unk>"]) for p in target.encode(text, out_type=str)] + [0]
        assert model.tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    # Written again by attnkit, both directories still tokenize the same: the SentencePiece
    # files travel with the model (transformers' MarianTokenizer has no tokenizer.json form).
    attnkit.export_hf(model, tmp_path / "exported")
    model.save_pretrained(tmp_path / "own")
    again = transformers.MarianTokenizer.from_pretrained(tmp_path / "exported")
    own = attnkit.from_pretrained(tmp_path / "own")
    for text in sources[:50]:
        assert again(text).input_ids == own.tokenizer.encode(text).ids == reference(text).input_ids


def test_translate_cli_decodes_as_transformers_with_the_files_defaults(
    marian_files: Path, pairs: corpora.Split, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The CLI takes generation_config.json's beams, length and banned pad where no flag is given;
    a flag wins over the file."""
    directory = marian_directory(marian_files, tmp_path / "opus-mt")
    hf = transformers.MarianMTModel.from_pretrained(directory).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    sources = [s for s, _ in pairs.test[:4]]
    for flags, options in [
        ([], {}),
        (["--num-beams", "1", "--max-new-tokens", "5"], {"num_beams": 1, "max_new_tokens": 5}),
    ]:
        batch = tokenizer(sources, return_tensors="pt", padding=True)
        expected = tokenizer.batch_decode(hf.generate(**batch, **options), skip_special_tokens=True)
        assert main(["translate", "--model", str(directory), *flags, *sources]) == 0
        assert capsys.readouterr().out.splitlines() == expected


def test_t5_spiece_gives_t5_tokenizer_ids_and_text(pairs: corpora.Split, tmp_path: Path) -> None:
    """T5's layout (pad 0, </s> 1, <unk> 2, <extra_id_0> last): ids equal SentencePiece's own
    encoding plus </s>, and transformers' T5Tokenizer built from the same file."""
    pytest.importorskip("google.protobuf")  # transformers reads spiece.model with protobuf
    directory = tmp_path / "t5"
    directory.mkdir()
    texts = [s for s, _ in pairs.train[:3000]]
    path = train_spm(texts, directory / "spiece", 500, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    config = transformers.T5Config(vocab_size=600, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8)
    transformers.T5ForConditionalGeneration(config).save_pretrained(directory)
    model = attnkit.from_pretrained(directory)
    reference = transformers.T5Tokenizer.from_pretrained(directory)
    own = spm.SentencePieceProcessor(model_file=str(path))
    assert model.tokenizer.get_vocab_size() == len(reference) == 600
    assert model.tokenizer.token_to_id("<extra_id_0>") == reference.convert_tokens_to_ids("<extra_id_0>") == 599
    for text in [s for s, _ in pairs.test[:300]] + EDGE_CASES + ["fill: the <extra_id_0> of <extra_id_1>."]:
        ids = model.tokenizer.encode(text).ids
        assert ids == reference(text).input_ids, text
        if "<extra_id" not in text:
            assert ids == [*own.encode(text), 1]
        assert model.tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_bad_sentencepiece_files_are_one_clear_error(
    marian_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    directory = marian_directory(marian_files, tmp_path / "opus-mt")
    data = (directory / "source.spm").read_bytes()
    (directory / "source.spm").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match=r"source\.spm is not a SentencePiece model .*replace it"):
        attnkit.from_pretrained(directory)
    assert main(["translate", "--model", str(directory), "Hello."]) == 2
    err = capsys.readouterr().err
    assert "source.spm is not a SentencePiece model" in err and "Traceback" not in err
    (directory / "source.spm").write_bytes(b"\x00\x01 not a model at all")
    with pytest.raises(ValueError, match=r"source\.spm is not a SentencePiece model"):
        attnkit.from_pretrained(directory)
    shutil.copy(marian_files / "source.spm", directory / "source.spm")
    vocab = json.loads((directory / "vocab.json").read_text())
    vocab["<oov>"] = vocab.pop("<unk>")
    (directory / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match="lacks the unknown piece '<unk>'"):
        attnkit.from_pretrained(directory)
    del vocab["<oov>"]  # an id left out
    (directory / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match=r"ids are not 0\.\.n-1, each once; re-create vocab\.json"):
        attnkit.from_pretrained(directory)
    (directory / "vocab.json").write_text('{"a": 0, "b": "one"}')
    with pytest.raises(ValueError, match=r"vocab\.json is not a JSON object of piece -> id"):
        attnkit.from_pretrained(directory)
    shutil.copy(marian_files / "vocab.json", directory / "vocab.json")
    (directory / "target_vocab.json").write_text("{}")
    with pytest.raises(ValueError, match="separate source and target vocabularies is not supported"):
        attnkit.from_pretrained(directory)


def test_reader_refuses_models_it_cannot_encode_with(marian_files: Path) -> None:
    data = (marian_files / "source.spm").read_bytes()
    assert len(read_model(marian_files / "source.spm").pieces) == 600
    with pytest.raises(ValueError, match="runs past the end"):
        parse_model(data[:-3])
    word_model = data + bytes([0x12, 0x02, 0x18, 0x03])  # a second trainer_spec: model_type = WORD
    with pytest.raises(ValueError, match="only unigram"):
        parse_model(word_model)
