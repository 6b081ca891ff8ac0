"""``attnkit generate`` and ``attnkit translate``: the command line prints exactly what
``model.generate`` + ``tokenizer.decode`` give, one line per input in input order, batch by
batch; tokenizers travel with model directories; errors are one line with exit status 2."""

from __future__ import annotations

import importlib.util
import io
import json
import select
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

import attnkit
from attnkit.cli import build_parser, main
from attnkit.generation.text import prompt_ids
from attnkit.models import build_model

PAD, BOS, EOS = 0, 1, 2  # the tokenizer's special tokens <pad> <s> </s>, and the models' ids
SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "der hund lief im park",
    "die katze sass auf der matte",
    "hello world",
    "attention is all you need",
]
has_beam_search = importlib.util.find_spec("attnkit.generation.beam") is not None
needs_beams = pytest.mark.skipif(not has_beam_search, reason="attnkit/generation/beam.py is not there yet")


def word_tokenizer(end_token: bool) -> Tokenizer:
    """A word-level tokenizer over SENTENCES; ``end_token`` appends </s> to every encoding
    (as Marian's and T5's do to sources)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        SENTENCES, trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    )
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<s>", "</s>")] == [PAD, BOS, EOS]
    if end_token:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return tokenizer


def gpt_model(tokenizer: Tokenizer | None) -> torch.nn.Module:
    torch.manual_seed(0)
    vocab = 30 if tokenizer is None else tokenizer.get_vocab_size()
    config = attnkit.preset("gpt-tiny", vocab_size=vocab, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    model = build_model(config).eval()
    if tokenizer is not None:
        model.tokenizer = tokenizer
    return model


def translation_model(tokenizer: Tokenizer, steps: int = 100) -> torch.nn.Module:
    """transformer-tiny (pad 0, start 1, end 2, as the tokenizer), trained for a few steps to
    copy its source, so that different sources get different outputs (untrained, it says the
    same thing whatever the source, and a reordering would go unseen)."""
    torch.manual_seed(0)
    vocab = tokenizer.get_vocab_size()
    model = build_model(attnkit.preset("transformer-tiny", vocab_size=vocab, dropout=0.0))
    assert (model.config.pad_token_id, model.config.decoder_start_token_id, model.config.eos_token_id) == (0, 1, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread
    try:
        for _ in range(steps):
            length = int(torch.randint(2, 7, (1,), generator=generator))
            words = torch.randint(4, vocab, (32, length), generator=generator)
            source = torch.cat([words, torch.full((32, 1), EOS)], dim=1)
            target = torch.cat([torch.full((32, 1), BOS), source], dim=1)
            logits = model(source, decoder_input_ids=target[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.tokenizer = tokenizer
    return model


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "gpt"
    gpt_model(word_tokenizer(end_token=False)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def mt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "mt"
    translation_model(word_tokenizer(end_token=True)).save_pretrained(path)
    return path


def batched(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def reference_generate(model: torch.nn.Module, prompts: list[str], batch_size: int, only_new: bool = False, **options):
    """What the CLI should print: left-padded batches through model.generate, decoded."""
    tokenizer, lines = model.tokenizer, []
    for index, batch in enumerate(batched(prompts, batch_size)):
        # attnkit's causal LMs train on <s> + text, so the CLI starts prompts with <s> when the
        # tokenizer's <s> is the model's bos (as here)
        encoded = [[BOS, *tokenizer.encode(p).ids] for p in batch]
        width = max(map(len, encoded))
        ids = torch.tensor([[PAD] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        seed = options.pop("seed", None)
        seeded = {} if seed is None else {"seed": seed + index}
        out = model.generate(ids, mask, **options, **seeded)
        if seed is not None:
            options["seed"] = seed
        for row, e in enumerate(encoded):
            new = out[row, width:].tolist()
            lines.append(tokenizer.decode(new if only_new else e + new, skip_special_tokens=True))
    return lines


def reference_translate(model: torch.nn.Module, sources: list[str], batch_size: int, **options) -> list[str]:
    """What the CLI should print: right-padded batches of the non-empty sources through
    model.generate, the start token and special tokens skipped; empty sources, empty lines."""
    tokenizer, lines = model.tokenizer, []
    for batch in batched(sources, batch_size):
        texts = [s for s in batch if s.strip()]
        translations = iter([])
        if texts:
            encoded = [tokenizer.encode(t).ids for t in texts]
            width = max(map(len, encoded))
            ids = torch.tensor([e + [PAD] * (width - len(e)) for e in encoded])
            mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded])
            out = model.generate(ids, mask, **options)
            translations = iter(tokenizer.decode(row[1:].tolist(), skip_special_tokens=True) for row in out)
        lines.extend(next(translations) if s.strip() else "" for s in batch)
    return lines


def output_lines(capsys: pytest.CaptureFixture, argv: list[str]) -> list[str]:
    """stdout's lines; stderr says only, once, the format ``--weights auto`` (the default) chose."""
    assert main(argv) == 0
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if not line.startswith("compiled the decoding step (")]
    assert said == ([] if "--weights" in argv else [said[0]]) and said[0].startswith("weights auto: "), captured.err
    return captured.out.splitlines()


def one_line_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize("command", ["generate", "translate"])
def test_help_has_an_example(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out
    if command == "translate":  # the paper's decoding is the default, and the help says so
        assert "4 beams" in out and "0.6" in out and "+ 50" in out


def test_generate_prints_what_model_generate_gives(gpt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(gpt_dir, weights="auto")
    prompts = ["the cat", "a dog ran in the", "hello"]  # different lengths: the batch is left-padded
    argv = ["generate", "--model", str(gpt_dir), "--max-new-tokens", "6", "--batch-size", "2"]
    argv += [arg for p in prompts for arg in ("--prompt", p)]
    expected = reference_generate(model, prompts, 2, max_new_tokens=6)
    assert output_lines(capsys, argv) == expected
    assert [line.split()[: len(p.split())] for line, p in zip(expected, prompts, strict=True)] == [
        p.split() for p in prompts
    ]
    only_new = reference_generate(model, prompts, 2, only_new=True, max_new_tokens=6)
    assert output_lines(capsys, [*argv, "--only-new"]) == only_new
    assert [f"{p} {new}".strip() for p, new in zip(prompts, only_new, strict=True)] == expected


def test_generate_batch_of_one_is_unpadded_generation(gpt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(gpt_dir, weights="auto")
    argv = ["generate", "--model", str(gpt_dir), "--max-new-tokens", "5", "--batch-size", "1", "--prompt", "the cat"]
    out = model.generate(torch.tensor([model.tokenizer.encode("the cat").ids]), max_new_tokens=5)
    assert output_lines(capsys, argv) == [model.tokenizer.decode(out[0].tolist(), skip_special_tokens=True)]


def test_generate_reads_stdin_in_order(gpt_dir: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    model = attnkit.from_pretrained(gpt_dir, weights="auto")
    prompts = ["the cat", "", "attention is all", "der hund", "hello world"]  # "" starts from <s>
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(p + "\n" for p in prompts)))
    argv = ["generate", "--model", str(gpt_dir), "--max-new-tokens", "4", "--batch-size", "2"]
    assert output_lines(capsys, argv) == reference_generate(model, prompts, 2, max_new_tokens=4)


def test_generate_samples_reproducibly(gpt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(gpt_dir, weights="auto")
    prompts = ["the cat", "a dog", "hello"]
    argv = ["generate", "--model", str(gpt_dir), "--max-new-tokens", "8", "--batch-size", "2", "--do-sample"]
    argv += ["--seed", "7", "--top-k", "10", "--temperature", "1.5"]
    argv += [arg for p in prompts for arg in ("--prompt", p)]
    first = output_lines(capsys, argv)
    assert output_lines(capsys, argv) == first
    options = dict(max_new_tokens=8, do_sample=True, seed=7, top_k=10, temperature=1.5)
    assert first == reference_generate(model, prompts, 2, **options)


def test_generate_takes_and_prints_token_ids(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = gpt_model(tokenizer=None)  # no tokenizer needed for ids
    model.save_pretrained(tmp_path / "m")
    argv = ["generate", "--model", str(tmp_path / "m"), "--ids", "5 6 7", "--ids", "9", "--max-new-tokens", "5"]
    out = model.generate(
        torch.tensor([[5, 6, 7], [PAD, PAD, 9]]), torch.tensor([[1, 1, 1], [0, 0, 1]]), max_new_tokens=5
    )

    def until_eos(tokens: list[int]) -> list[int]:
        return tokens[: tokens.index(EOS)] if EOS in tokens else tokens

    expected = [" ".join(map(str, [5, 6, 7, *until_eos(out[0, 3:].tolist())]))]
    expected.append(" ".join(map(str, [9, *until_eos(out[1, 3:].tolist())])))
    assert output_lines(capsys, argv) == expected
    assert output_lines(capsys, [*argv, "--only-new"]) == [
        " ".join(line.split()[n:]) for line, n in zip(expected, (3, 1), strict=True)
    ]


def test_generate_ends_at_every_end_token_the_checkpoint_lists(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A generation_config.json's eos_token_id list (Llama 3's, SmolLM2's) ends each output at
    the first of its tokens, unless --eos-id says otherwise."""
    model = gpt_model(tokenizer=None)
    greedy = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=8)[0, 3:].tolist()
    assert EOS not in greedy[:3], greedy  # the test needs a third token that is not already the end
    stop = greedy[2]
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, stop]}))
    argv = ["generate", "--model", str(tmp_path / "m"), "--ids", "5 6 7", "--max-new-tokens", "8", "--only-new"]
    expected = greedy[: greedy.index(stop)]
    assert output_lines(capsys, argv) == [" ".join(map(str, expected))]
    ended_by_flag = greedy[: greedy.index(EOS)] if EOS in greedy else greedy
    assert output_lines(capsys, [*argv, "--eos-id", str(EOS)]) == [" ".join(map(str, ended_by_flag))]


@needs_beams
def test_generate_with_beams(gpt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(gpt_dir, weights="auto")
    prompts = ["the cat", "a dog ran in the", "hello"]
    argv = ["generate", "--model", str(gpt_dir), "--max-new-tokens", "6", "--num-beams", "3"]
    argv += ["--length-penalty", "1.0", "--length-penalty-style", "power"]
    argv += [arg for p in prompts for arg in ("--prompt", p)]
    options = dict(max_new_tokens=6, num_beams=3, length_penalty=1.0, length_penalty_style="power")
    assert output_lines(capsys, argv) == reference_generate(model, prompts, 16, **options)


def test_translate_passes_the_word_unit(mt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(mt_dir, weights="auto")
    sources = ["the cat sat on the mat", "der hund lief im park"]
    options = dict(num_beams=2, length_penalty=0.6, max_new_tokens=12, source_length_offset=50)
    words = dict(no_repeat_ngram_size=2, no_repeat_ngram_unit="word")
    argv = ["translate", "--model", str(mt_dir), "--num-beams", "2", "--max-new-tokens", "12"]
    argv += ["--no-repeat-ngram-size", "2", "--no-repeat-ngram-unit", "word", *sources]
    assert output_lines(capsys, argv) == reference_translate(model, sources, 16, **options, **words)


def test_the_word_unit_applies_to_the_checkpoints_own_size(
    mt_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--no-repeat-ngram-unit alone is the unit of the size a generation_config.json sets."""
    import shutil

    path = tmp_path / "mt"
    shutil.copytree(mt_dir, path)
    (path / "generation_config.json").write_text('{"no_repeat_ngram_size": 2}', encoding="utf-8")
    model = attnkit.from_pretrained(path, weights="auto")
    sources = ["the cat sat on the mat", "der hund lief im park"]
    options = dict(num_beams=2, length_penalty=0.6, max_new_tokens=12, source_length_offset=50)
    argv = ["translate", "--model", str(path), "--num-beams", "2", "--max-new-tokens", "12"]
    argv += ["--no-repeat-ngram-unit", "word", *sources]
    expected = reference_translate(model, sources, 16, **options, no_repeat_ngram_unit="word")
    assert output_lines(capsys, argv) == expected


GREEDY = ["--num-beams", "1", "--max-new-tokens", "12"]
GREEDY_OPTIONS = dict(num_beams=1, length_penalty=0.6, max_new_tokens=12, source_length_offset=50)


def test_translate_prints_what_model_generate_gives(mt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(mt_dir, weights="auto")
    sources = ["the cat sat on the mat", "hello world", "", "der hund lief im park"]
    expected = reference_translate(model, sources, 16, **GREEDY_OPTIONS)
    assert len(set(expected)) == 4 and expected[2] == ""
    assert output_lines(capsys, ["translate", "--model", str(mt_dir), *GREEDY, *sources]) == expected


def test_translate_source_length_offset_bounds_the_output(mt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(mt_dir, weights="auto")
    sources = ["hello world", "attention is all you need"]
    options = {**GREEDY_OPTIONS, "source_length_offset": 0}
    expected = reference_translate(model, sources, 16, **options)
    argv = ["translate", "--model", str(mt_dir), *GREEDY, "--source-length-offset", "0", *sources]
    lines = output_lines(capsys, argv)
    assert lines == expected
    # source length counts the appended </s>: at most len(words) + 1 tokens, the last may be </s>
    assert all(len(line.split()) <= len(s.split()) + 1 for line, s in zip(lines, sources, strict=True))


def test_translate_ends_sources_with_eos(mt_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A tokenizer that does not append </s> (attnkit's own BPE) gets it appended, as in training."""
    attnkit.from_pretrained(mt_dir).save_pretrained(tmp_path / "no-eos")  # saved fp32, as trained
    model = attnkit.from_pretrained(tmp_path / "no-eos", weights="auto")
    model.tokenizer = word_tokenizer(end_token=False)
    model.tokenizer.save(str(tmp_path / "no-eos" / "tokenizer.json"))
    sources = ["a dog ran in the park", "attention is all you need", "hello world"]
    with_eos = output_lines(capsys, ["translate", "--model", str(mt_dir), *GREEDY, *sources])
    assert output_lines(capsys, ["translate", "--model", str(tmp_path / "no-eos"), *GREEDY, *sources]) == with_eos
    without_eos = reference_translate(model, sources, 16, **GREEDY_OPTIONS)  # what the tokenizer alone gives
    assert without_eos != with_eos  # so the </s> matters to this model


def test_translate_reads_input_file(mt_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(mt_dir, weights="auto")
    (tmp_path / "src.txt").write_text("hello world\n\nthe cat sat\n", encoding="utf-8")
    expected = reference_translate(model, ["hello world", "", "the cat sat"], 2, **GREEDY_OPTIONS)
    argv = ["translate", "--model", str(mt_dir), *GREEDY, "--batch-size", "2", "--input", str(tmp_path / "src.txt")]
    assert output_lines(capsys, argv) == expected


def test_translate_input_file_in_sorted_batches_keeps_the_input_order_and_shows_progress(
    mt_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import random

    order = random.Random(0)
    sources = [order.choice(SENTENCES) for _ in range(1200)]  # 1,200 lines: long enough for progress
    (tmp_path / "doc.txt").write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    # fp32: int8 batches of 8 rows or more take the int8 GEMM, whose per-batch activation scale
    # may flip a near tie against a line translated alone; this test is about order, not format
    alone = reference_translate(attnkit.from_pretrained(mt_dir, weights="fp32"), SENTENCES, 1, **GREEDY_OPTIONS)
    assert len(set(alone)) == len(SENTENCES)  # all different, so a line out of place shows
    argv = ["translate", "--model", str(mt_dir), *GREEDY, "--weights", "fp32", "--input", str(tmp_path / "doc.txt")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [alone[SENTENCES.index(s)] for s in sources]
    assert "translate: 1200/1200 lines (100%)" in captured.err

    (tmp_path / "bad.txt").write_bytes("".join(s + "\n" for s in sources).encode() + b"caf\xe9\n")
    line = one_line_error(capsys, ["translate", "--model", str(mt_dir), *GREEDY, "--input", str(tmp_path / "bad.txt")])
    assert f"--input {tmp_path / 'bad.txt'}: line 1201 is not valid UTF-8 (byte 0xe9)" in line  # and nothing written


def test_translate_streams_stdin_one_line_per_line(mt_dir: Path) -> None:
    sources = [*SENTENCES, "", "the dog sat in the park"]
    command = [sys.executable, "-m", "attnkit", "translate", "--model", str(mt_dir), *GREEDY, "--batch-size", "3"]
    result = subprocess.run(
        command, input="".join(s + "\n" for s in sources), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("weights auto: ") and result.stderr.count("\n") == 1, result.stderr
    lines = result.stdout.split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == len(sources)  # one line out per line in
    expected = reference_translate(attnkit.from_pretrained(mt_dir, weights="auto"), sources, 3, **GREEDY_OPTIONS)
    assert len(set(expected)) == len(sources)  # all different, so any reordering shows
    assert lines[:-1] == expected


def test_translate_answers_each_batch_before_the_input_ends(mt_dir: Path) -> None:
    command = [sys.executable, "-m", "attnkit", "translate", "--model", str(mt_dir), *GREEDY, "--batch-size", "2"]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        process.stdin.write("hello world\nthe cat sat\n")
        process.stdin.flush()  # the input stays open: the first batch must come out anyway
        ready, _, _ = select.select([process.stdout], [], [], 120)
        assert ready, "no output for a full batch while standard input was still open"
        first = [process.stdout.readline(), process.stdout.readline()]
        process.stdin.write("der hund\n")
        process.stdin.close()
        rest = process.stdout.read()
        assert process.wait(timeout=120) == 0, process.stderr.read()
    finally:
        process.kill()
        process.wait()
    expected = reference_translate(
        attnkit.from_pretrained(mt_dir, weights="auto"), ["hello world", "the cat sat", "der hund"], 2, **GREEDY_OPTIONS
    )
    assert [*first, rest] == [expected[0] + "\n", expected[1] + "\n", expected[2] + "\n"]


@needs_beams
def test_translate_defaults_are_the_papers_beam_search(mt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = attnkit.from_pretrained(mt_dir, weights="auto")
    sources = ["the cat sat on the mat", "hello world", "attention is all you need"]
    options = dict(num_beams=4, length_penalty=0.6, length_penalty_style="gnmt", max_new_tokens=256)
    expected = reference_translate(model, sources, 16, source_length_offset=50, **options)
    assert output_lines(capsys, ["translate", "--model", str(mt_dir), *sources]) == expected


def test_hugging_face_directories_bring_their_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("transformers")
    model = gpt_model(word_tokenizer(end_token=False))
    attnkit.export_hf(model, tmp_path / "hf")
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    loaded = attnkit.from_pretrained(tmp_path / "hf", weights="auto")
    texts = ["the cat", "a dog sat on the mat"]
    # The export's tokenizer.json adds the <s> attnkit puts before a prompt: the same prompt ids.
    assert prompt_ids(loaded.tokenizer, loaded.config, texts) == prompt_ids(model.tokenizer, model.config, texts)
    argv = ["generate", "--model", str(tmp_path / "hf"), "--max-new-tokens", "4", "--prompt", "the cat"]
    assert output_lines(capsys, argv) == reference_generate(model, ["the cat"], 1, max_new_tokens=4)
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    capsys.readouterr()
    back = attnkit.from_pretrained(tmp_path / "back")
    assert prompt_ids(back.tokenizer, back.config, texts) == prompt_ids(model.tokenizer, model.config, texts)


def test_unreadable_tokenizer_is_a_value_error(tmp_path: Path) -> None:
    gpt_model(tokenizer=None).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a tokenizer"):
        attnkit.from_pretrained(tmp_path / "m")


@pytest.fixture(scope="module")
def bare_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories without tokenizer.json: a GPT, an encoder-decoder and a BERT."""
    root = tmp_path_factory.mktemp("bare")
    gpt_model(tokenizer=None).save_pretrained(root / "gpt")
    build_model("transformer-tiny").save_pretrained(root / "mt")
    build_model("bert-tiny").save_pretrained(root / "bert")
    return {name: root / name for name in ("gpt", "mt", "bert")}


def test_no_tokenizer_is_one_line(bare_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    line = one_line_error(capsys, ["generate", "--model", str(bare_dirs["gpt"]), "--prompt", "hi"])
    assert f"{bare_dirs['gpt']} has no tokenizer.json" in line and "--ids" in line
    line = one_line_error(capsys, ["translate", "--model", str(bare_dirs["mt"]), "hello"])
    assert f"{bare_dirs['mt']} has no tokenizer.json" in line


def test_wrong_family_points_at_the_right_command(bare_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    # generate answers text prompts with an encoder-decoder (text to text), never token-id ones
    line = one_line_error(capsys, ["generate", "--model", str(bare_dirs["mt"]), "--ids", "3 4"])
    assert "an encoder-decoder model reads text prompts" in line
    line = one_line_error(capsys, ["translate", "--model", str(bare_dirs["gpt"]), "hi"])
    assert "decoder-only" in line and "attnkit generate" in line
    line = one_line_error(capsys, ["generate", "--model", str(bare_dirs["bert"]), "--prompt", "hi"])
    assert "BERT" in line and "fill-mask" in line


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--do-sample", "--top-p", "2"], "--top-p must be in (0, 1], got 2.0"),
        (["--top-p", "0.9"], "--top-p applies only when sampling; add --do-sample"),
        (["--do-sample", "--temperature", "0"], "--temperature must be > 0 when sampling, got 0.0"),
        (["--do-sample", "--top-k", "0"], "--top-k must be an integer >= 1, got 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--do-sample", "--num-beams", "2"], "set --num-beams to 1 (got 2)"),
        (["--eos-id", "1000"], "--eos-id must be a token id in [0, 30), got 1000"),
        (["--ids", "1 two 3"], "--ids takes space-separated integer token ids, got '1 two 3'"),
        (["--no-repeat-ngram-unit", "word"], "--no-repeat-ngram-unit is the unit of --no-repeat-ngram-size"),
    ],
)
def test_bad_flags_are_one_line(
    flags: list[str], message: str, bare_dirs: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    argv = ["generate", "--model", str(bare_dirs["gpt"]), *flags]
    if "--ids" not in flags:
        argv += ["--ids", "4 5"]
    assert message in one_line_error(capsys, argv)


def test_translate_bad_flags_are_one_line(mt_dir: Path, capsys: pytest.CaptureFixture) -> None:
    line = one_line_error(capsys, ["translate", "--model", str(mt_dir), "--do-sample", "--top-p", "2", "hi"])
    assert "--top-p must be in (0, 1], got 2.0" in line
    line = one_line_error(capsys, ["translate", "--model", str(mt_dir), "--source-length-offset", "-1", "hi"])
    assert "--source-length-offset must be >= 0, got -1" in line
    line = one_line_error(capsys, ["translate", "--model", str(mt_dir), "--input", str(mt_dir / "nope.txt")])
    assert "nope.txt is not a file" in line


@pytest.mark.parametrize("command", ["generate", "translate"])
def test_missing_model_directory_is_one_line(command: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    given = ["--ids", "1 2"] if command == "generate" else ["hello"]
    line = one_line_error(capsys, [command, "--model", str(tmp_path / "nope"), *given])
    assert (
        line == f"attnkit: error: {tmp_path / 'nope'} is not a directory; pass a directory written by save_pretrained "
        "(or a .gguf file)"
    )


def chat_model(tmp_path: Path) -> torch.nn.Module:
    """A tiny Llama with a tokenizer, saved as ``plain`` (no chat template) and ``chat`` (one)."""
    from attnkit.data.tokenizer import train_tokenizer

    torch.manual_seed(0)
    model = attnkit.build_model(attnkit.preset("llama-tiny", vocab_size=300, eos_token_id=2)).eval()
    model.tokenizer = train_tokenizer(["the cat sat on the mat and the dog ran in the park"] * 50, 300)
    model.save_pretrained(tmp_path / "plain")
    model.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    model.save_pretrained(tmp_path / "chat")
    return model


def test_chat_streams_what_generate_decodes_and_refuses_a_model_without_a_template(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chat_model(tmp_path)
    model = attnkit.from_pretrained(tmp_path / "chat", weights="auto")  # as the command loads it by default
    assert main(["chat", "--model", str(tmp_path / "plain"), "--message", "hi"]) == 2
    assert "has no chat template" in capsys.readouterr().err
    assert main(["chat", "--model", str(tmp_path / "chat"), "--message", "the cat", "--max-new-tokens", "6"]) == 0
    prompt = model.tokenizer.encode("user: the cat\nassistant:", add_special_tokens=False).ids
    new = model.generate(torch.tensor([prompt]), max_new_tokens=6)[0, len(prompt) :].tolist()
    new = new[: new.index(2)] if 2 in new else new
    assert capsys.readouterr().out == model.tokenizer.decode(new, skip_special_tokens=True) + "\n"


def test_chat_ends_its_reply_at_every_end_token_the_checkpoint_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A generation_config.json's eos_token_id list ends the streamed reply at the first of its
    tokens, which is not printed (an instruct model's end-of-turn beside its end of text)."""
    model = chat_model(tmp_path)
    prompt = model.tokenizer.encode("user: the cat\nassistant:", add_special_tokens=False).ids
    greedy = model.generate(torch.tensor([prompt]), max_new_tokens=6)[0, len(prompt) :].tolist()
    assert 2 not in greedy[:3], greedy  # the test needs a third token that is not already the end
    stop = greedy[2]
    (tmp_path / "chat" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, stop]}))
    argv = ["chat", "--model", str(tmp_path / "chat"), "--weights", "fp32", "--message", "the cat"]
    assert main([*argv, "--max-new-tokens", "6"]) == 0
    expected = model.tokenizer.decode(greedy[: greedy.index(stop)], skip_special_tokens=True)
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.slow
def test_chat_compiled_replies_as_eager_and_reports_each_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnkit.generation import compiled

    monkeypatch.setattr(compiled, "MODE", "default")  # no autotuning: tests/generation/test_compiled.py says why
    chat_model(tmp_path)
    argv = ["chat", "--model", str(tmp_path / "chat"), "--message", "the cat", "--message", "the dog"]
    argv += ["--max-new-tokens", "5"]
    eager = output_lines(capsys, argv)
    before = len(compiled.COMPILES)
    assert main([*argv, "--compile"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == eager
    reported = [line for line in captured.err.splitlines() if line.startswith(("compiled the ", "loaded the "))]
    assert len(reported) == len(compiled.COMPILES) - before >= 1  # each step once, after the reply it served


@pytest.mark.parametrize("command", ["generate", "translate", "chat"])
def test_the_compile_flags_are_auto_by_default_and_on_or_off_when_given(command: str) -> None:
    from attnkit.cli import build_parser
    from attnkit.cli.common import compile_option

    parser = build_parser()
    flags = ([], ["--compile"], ["--no-compile"])
    chosen = [compile_option(parser.parse_args([command, "--model", "m", *flag])) for flag in flags]
    assert chosen == ["auto", True, False]


@pytest.mark.slow
def test_compile_prints_what_eager_decoding_prints_and_the_compile_time(
    gpt_dir: Path, mt_dir: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnkit.generation import compiled

    monkeypatch.setattr(compiled, "MODE", "default")  # no autotuning: tests/generation/test_compiled.py says why
    runs = [
        ["generate", "--model", str(gpt_dir), "--max-new-tokens", "6", "--prompt", "the cat", "--prompt", "hello"],
        ["translate", "--model", str(mt_dir), *GREEDY, "the cat sat on the mat", "hello world"],
    ]
    for argv in runs:
        eager = output_lines(capsys, argv)
        assert main([*argv, "--compile"]) == 0
        captured = capsys.readouterr()
        assert captured.out.splitlines() == eager
        assert "the decoding step (" in captured.err and captured.err.rstrip().endswith(" s")  # compiled or loaded
    beams = ["translate", "--model", str(mt_dir), "the cat sat on the mat", "hello world"]  # the preset's beam 4
    eager = output_lines(capsys, beams)
    assert main([*beams, "--compile"]) == 0
    assert capsys.readouterr().out.splitlines() == eager


def test_chat_answers_json_valid_against_a_schema(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``attnkit chat --json-schema FILE``: the reply is generate's under the schema, and valid."""
    pytest.importorskip("llguidance", reason="the grammar extra is not installed: pip install 'attnkit[grammar]'")
    jsonschema = pytest.importorskip("jsonschema")
    chat_model(tmp_path)
    model = attnkit.from_pretrained(tmp_path / "chat", weights="fp32")
    schema = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}, "n": {"type": "integer",
              "minimum": 0, "maximum": 9}}, "required": ["pet", "n"], "additionalProperties": False}  # fmt: skip
    (tmp_path / "pet.json").write_text(json.dumps(schema), encoding="utf-8")
    argv = ["chat", "--model", str(tmp_path / "chat"), "--weights", "fp32", "--message", "the cat",
            "--max-new-tokens", "24", "--json-schema", str(tmp_path / "pet.json")]  # fmt: skip
    assert main(argv) == 0
    prompt = model.tokenizer.encode("user: the cat\nassistant:", add_special_tokens=False).ids
    new = model.generate(torch.tensor([prompt]), max_new_tokens=24, grammar=schema)[0, len(prompt) :].tolist()
    assert 2 in new
    reply = capsys.readouterr().out
    assert reply == model.tokenizer.decode(new[: new.index(2)], skip_special_tokens=True) + "\n"
    jsonschema.validate(json.loads(reply), schema)
