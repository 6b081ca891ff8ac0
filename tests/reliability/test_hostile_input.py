"""Hostile input, wherever a user types or points: every case gets a one-line error that names
the bad value and the fix, a non-zero exit status, no traceback (unless ``--debug``), and leaves
every file of the user's as it was.

Exit statuses of ``attnkit``:

* 2, a usage error: the command line, a config value, or a file it names is wrong. Errors
  found by argparse (an unknown subcommand or flag, a flag's type or choice) print argparse's
  usage and then its ``attnkit ...: error: ...`` line; every other usage error is exactly one
  line, ``attnkit: error: ...``.
* 1: the command ran and failed (a permission, a full disk, a bug): one line,
  ``attnkit: error: <exception type>: ...``, with a pointer to ``--debug``.

Cases covered elsewhere, not repeated: tests/data/test_text_files.py (every way a text file can
be wrong, at the API), tests/models/test_models.py::test_bad_token_ids and
test_input_longer_than_learned_positions, tests/generation/test_greedy_sampling.py::
test_bad_settings_are_refused_before_any_model_work, tests/nn/test_attention.py::
test_bad_input_raises_value_error, tests/cli/test_generate_translate.py::test_bad_flags_are_one_line,
tests/training/test_run.py::test_cli_train_bad_options, tests/reliability/test_model_files.py
(hostile model directories).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import attnkit
from attnkit.cli import main
from attnkit.config import (
    DataConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_run_config,
    preset,
    run_from_dict,
    run_preset,
)
from attnkit.models import build_model
from attnkit.models.core import Model
from attnkit.nn.masks import causal_mask
from attnkit.training.distributed import pick_device

VOCAB, MAX_LEN = 30, 16  # the test model's vocabulary and learned positions
LATIN1 = "café\n".encode("latin1")


@dataclass(frozen=True)
class Case:
    """One command line; ``{root}`` in ``argv``/``expect`` is the directory of the user's files,
    ``{out}`` a fresh path for a run directory."""

    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]  # substrings of the error: the bad value, and the fix
    usage: bool = False  # found by argparse: its usage lines, then its error line
    stdin: bytes = b""


def train(*options: str, data: str = "{root}/notes.txt", preset_name: str = "gpt-tiny") -> tuple[str, ...]:
    return ("train", "--preset", preset_name, "--data.path", data, "--out", "{out}", "--quiet", *options)


def config(name: str) -> tuple[str, ...]:
    return ("train", "--config", f"{{root}}/{name}", "--out", "{out}")


def gen(*options: str) -> tuple[str, ...]:
    return ("generate", "--model", "{root}/gpt", *options)


CLI_CASES = [
    # -- argparse: the command line itself
    Case("unknown-subcommand", ("trian",), ("'trian'", "choose from", "'train'"), usage=True),
    Case("no-subcommand", (), ("required: COMMAND",), usage=True),
    Case("unknown-flag", gen("--ids", "1", "--temprature", "2"), ("unrecognized arguments: --temprature",), usage=True),
    Case(
        "flag-not-an-int", gen("--max-new-tokens", "ten"), ("--max-new-tokens", "invalid int value: 'ten'"), usage=True
    ),
    Case(
        "flag-bad-choice",
        gen("--length-penalty-style", "linear"),
        ("'linear'", "choose from 'gnmt', 'power'"),
        usage=True,
    ),
    Case("missing-required-flag", ("generate", "--ids", "1"), ("required: --model",), usage=True),
    # -- config keys and values
    Case("mistyped-key", train("--model.d_modle=8"), ("--model.d_modle", "did you mean --model.d_model?")),
    Case("key-in-wrong-section", train("--train.dropout=0.2"), ("--train.dropout", "did you mean --model.dropout?")),
    Case("mistyped-section", train("--modle.d_model=8"), ("--modle.d_model", "did you mean --model.d_model?")),
    Case("option-without-section", train("--lr=3"), ("'--lr=3'", "--train.max_steps=100")),
    Case(
        "unknown-preset", ("train", "--preset", "gpt-tiyn", "--out", "{out}"), ("'gpt-tiyn'", "did you mean 'gpt-tiny'")
    ),
    Case("negative-size", train("--model.d_model=-8"), ("d_model must be a positive integer, got -8",)),
    Case("zero-layers", train("--model.n_layers=0"), ("n_layers must be a positive integer, got 0",)),
    Case("dropout-one", train("--model.dropout=1"), ("dropout must be in [0, 1), got 1.0",)),
    Case("heads-do-not-divide", train("--model.n_heads=3"), ("d_model (64)", "n_heads (3)", "among its divisors")),
    Case("value-not-a-number", train("--train.lr=fast"), ("--train.lr=fast", "expected a number")),
    Case("nan-learning-rate", train("--train.lr=nan"), ("lr must be a finite number, got nan",)),
    Case("negative-time-budget", train("--train.time_budget=-5"), ("train.time_budget must be > 0", "-5")),
    Case("negative-skip-budget", train("--train.skip_nonfinite=-1"), ("train.skip_nonfinite must be >= 0, got -1",)),
    Case("unknown-device", train("--train.device=tpu"), ("train.device='tpu'", "use 'auto', 'cpu'")),
    Case("tiny-max-tokens", train("--data.max_tokens=2"), ("data.max_tokens >= 4", "got 8000 and 2")),
    Case(
        "curriculum-too-short",
        train("--data.curriculum_max_tokens=1"),
        ("data.curriculum_max_tokens must be >= 2", "or null, got 1"),
    ),
    Case("task-weights-without-tasks", train("--data.task_weights=2"), ("data.task_weights=[2.0]", "set data.tasks")),
    Case(
        "tokenizer-weights-not-bible",
        train("--data.tokenizer_weights=fr=2"),
        ("data.tokenizer_weights", "set data.corpus=bible (got 'files')"),
    ),
    Case("curriculum-no-epochs", train("--data.curriculum_epochs=0"), ("data.curriculum_epochs must be >= 1, got 0",)),
    Case(
        "curriculum-keeps-nothing",
        train("--data.curriculum_max_tokens=2", "--data.vocab_size=300"),
        ("data.curriculum_max_tokens=2 leaves no training example", "raise it, or set it to null"),
    ),
    Case(
        "budget-schedule-without-budget",
        train("--train.schedule=budget-linear"),
        ("train.schedule=budget-linear", "train.time_budget is null", "--train.time_budget=SECONDS"),
    ),
    Case("progress-every-zero", train("--progress-every", "0"), ("--progress-every must be > 0 seconds, got 0.0",)),
    Case("session-steps-zero", train("--session-steps", "0"), ("--session-steps must be >= 1, got 0",)),
    Case(
        "preset-and-config",
        ("train", "--preset", "gpt-tiny", "--config", "{root}/typo.json", "--out", "{out}"),
        ("--preset or --config, not both",),
    ),
    # -- config files
    Case("config-mistyped-key", config("typo.json"), ("{root}/typo.json", "'d_modle'", "did you mean 'd_model'?")),
    Case("config-not-json", config("broken.json"), ("{root}/broken.json is not valid JSON", "line 1 column")),
    Case(
        "config-not-utf8", config("latin1.json"), ("{root}/latin1.json is not valid UTF-8", "0xe9", "save it as UTF-8")
    ),
    Case("config-is-a-directory", config("folder"), ("{root}/folder is a directory", "a JSON or YAML file")),
    Case("config-missing", config("nope.json"), ("{root}/nope.json not found",)),
    Case("config-not-a-mapping", config("list.json"), ("{root}/list.json", "must be a mapping, got list")),
    # -- data files
    Case("data-missing", train(data="{root}/nope.txt"), ("{root}/nope.txt not found", "check the path")),
    Case("data-empty", train(data="{root}/empty.txt"), ("{root}/empty.txt has no non-blank line", "one example per")),
    Case("data-blank", train(data="{root}/blank.txt"), ("{root}/blank.txt has no non-blank line", "one example per")),
    Case("data-binary", train(data="{root}/binary.txt"), ("{root}/binary.txt looks binary", "NUL byte", "UTF-8")),
    Case("data-utf16", train(data="{root}/utf16.txt"), ("{root}/utf16.txt looks binary", "re-encoded as UTF-8")),
    Case("data-latin1", train(data="{root}/latin1.txt"), ("{root}/latin1.txt: line 1", "0xe9", "iconv -f latin1")),
    Case("data-is-a-directory", train(data="{root}/folder"), ("{root}/folder is a directory", "text files inside it")),
    Case(
        "tsv-three-columns",
        train(data="{root}/three.tsv", preset_name="transformer-tiny"),
        ("{root}/three.tsv:2", "expected 2 tab-separated columns", "found 3", "replaced by a space"),
    ),
    Case(
        "tsv-one-column",
        train(data="{root}/one.tsv", preset_name="transformer-tiny"),
        ("{root}/one.tsv:1", "found 1", "source<TAB>target"),
    ),
    # -- output directories
    Case(
        "out-holds-a-run",
        ("train", "--preset", "gpt-tiny", "--data.path", "{root}/notes.txt", "--out", "{root}/run"),
        ("{root}/run already holds a run", "--resume", "--force", "another --out"),
    ),
    Case(
        "out-is-a-file",
        ("train", "--preset", "gpt-tiny", "--data.path", "{root}/notes.txt", "--out", "{root}/notes.txt"),
        ("{root}/notes.txt exists and is not a directory", "another --out"),
    ),
    Case(
        "out-holds-other-files",
        ("train", "--preset", "gpt-tiny", "--data.path", "{root}/notes.txt", "--out", "{root}/folder"),
        ("{root}/folder is not empty and holds no run", "empty or new"),
    ),
    Case(
        "convert-into-a-full-dir",
        ("convert", "{root}/gpt", "{root}/folder"),
        ("{root}/folder already exists and is not empty", "--force"),
    ),
    Case(
        "figures-into-a-full-dir",
        ("figures", "--out", "{root}/folder", "--only", "variance"),
        ("--out {root}/folder is not empty", "--force"),
    ),
    # -- token ids, prompts, positions
    Case("id-at-vocab-size", gen("--ids", "5 30"), ("token id 30", f"[0, {VOCAB})")),
    Case(
        "max-new-tokens-past-the-context",  # refused before the cache is sized from it
        gen("--ids", "5", "--max-new-tokens", "100000000"),
        ("max_new_tokens=100000000 exceeds the model's context", "lower max_new_tokens"),
    ),
    Case("unknown-weight-format", gen("--ids", "5", "--weights", "int3"), ("--weights", "'int3'"), usage=True),
    Case("negative-id", gen("--ids", "-4"), ("token id -4", f"[0, {VOCAB})")),
    Case("ids-not-integers", gen("--ids", "5 six"), ("'5 six'", "space-separated integer")),
    Case("ids-empty", gen("--ids", " "), ("--ids needs at least one token id",)),
    Case(
        "prompt-past-positions",
        gen("--ids", " ".join(["5"] * (MAX_LEN + 1)), "--max-new-tokens", "1"),
        (f"prompt of length {MAX_LEN + 1}", f"{MAX_LEN} positions", "shorten the prompt"),
    ),
    Case(
        "continuation-past-positions",
        gen("--ids", "5 6", "--max-new-tokens", "15"),
        ("max_new_tokens=15", f"{MAX_LEN} positions", "lower max_new_tokens"),
    ),
    Case("empty-prompt-no-bos", gen("--prompt", ""), ("prompt 1 is empty", "no bos_token_id", "give it some text")),
    # -- decoding settings
    Case("zero-beams", gen("--ids", "5", "--num-beams", "0"), ("--num-beams must be an integer >= 1, got 0",)),
    Case("negative-max-new-tokens", gen("--ids", "5", "--max-new-tokens", "-1"), ("--max-new-tokens", "got -1")),
    Case(
        "infinite-temperature",
        gen("--ids", "5", "--do-sample", "--temperature", "inf"),
        ("--temperature must be a finite number, got inf",),
    ),
    Case("zero-temperature", gen("--ids", "5", "--do-sample", "--temperature", "0"), ("--temperature must be > 0",)),
    Case(
        "nan-length-penalty",
        gen("--ids", "5", "--num-beams", "2", "--length-penalty", "nan"),
        ("--length-penalty must be a finite number, got nan",),
    ),
    Case(
        "negative-top-k",
        gen("--ids", "5", "--do-sample", "--top-k", "-3"),
        ("--top-k must be an integer >= 1, got -3",),
    ),
    Case("top-p-above-one", gen("--ids", "5", "--do-sample", "--top-p", "1.5"), ("--top-p must be in (0, 1]", "1.5")),
    Case("top-p-without-sampling", gen("--ids", "5", "--top-p", "0.9"), ("--top-p applies only", "add --do-sample")),
    Case(
        "sampling-with-beams", gen("--ids", "5", "--do-sample", "--num-beams", "3"), ("set --num-beams to 1", "got 3")
    ),
    Case(
        "eos-outside-vocab",
        gen("--ids", "5", "--eos-id", "-1"),
        (f"--eos-id must be a token id in [0, {VOCAB})", "got -1"),
    ),
    Case("pad-outside-vocab", gen("--ids", "5", "--pad-id", "1000000"), ("--pad-id", "got 1000000")),
    Case("negative-batch-size", gen("--ids", "5", "--batch-size", "-2"), ("--batch-size must be >= 1, got -2",)),
    # -- input files and standard input
    Case("input-not-utf8", gen("--input", "{root}/latin1.txt"), ("--input {root}/latin1.txt: line 1", "0xe9", "iconv")),
    Case("input-binary", gen("--input", "{root}/binary.txt"), ("--input {root}/binary.txt looks binary", "UTF-8 text")),
    Case(
        "input-empty", gen("--input", "{root}/empty.txt"), ("--input {root}/empty.txt is empty", "one input per line")
    ),
    Case("input-missing", gen("--input", "{root}/nope.txt"), ("--input {root}/nope.txt is not a file",)),
    Case(
        "stdin-not-utf8", gen(), ("standard input: line 2", "0xe9", "re-encode it as UTF-8"), stdin=b"fine\n" + LATIN1
    ),
    # -- model directories
    Case(
        "model-missing",
        ("generate", "--model", "{root}/nope", "--ids", "5"),
        ("{root}/nope is not a directory", "save_pretrained"),
    ),
    Case("model-is-a-data-file", ("info", "{root}/notes.txt"), ("{root}/notes.txt is not a directory",)),
    Case(
        "model-dir-without-config",
        ("info", "{root}/folder"),
        ("{root}/folder/config.json not found", "not a complete model directory"),
    ),
    Case(
        "translate-with-a-gpt",
        ("translate", "--model", "{root}/gpt", "hello"),
        ("decoder-only", "use: attnkit generate --model {root}/gpt"),
    ),
    Case("fill-mask-with-a-gpt", ("fill-mask", "--model", "{root}/gpt", "a [MASK]"), ("fill-mask needs a BERT",)),
    Case("evaluate-a-model-dir", ("evaluate", "--model", "{root}/gpt"), ("not a run directory", "--out of attnkit")),
    Case(
        "average-zero-checkpoints",
        ("average", "{root}/run", "--last", "0", "--out", "{out}"),
        ("--last must be >= 1, got 0",),
    ),
    Case("smoke-zero-steps", ("smoke", "--steps", "0"), ("--steps must be >= 1, got 0",)),
]


def word_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = ["the cat sat on the mat", "a dog ran in the park"]
    tokenizer.train_from_iterator(words, trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"]))
    return tokenizer


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's files: a model directory, a run directory, data and config files of every
    kind of wrong, and a folder holding a file of its own."""
    root = tmp_path_factory.mktemp("user")
    torch.manual_seed(0)
    model = build_model(preset("gpt-tiny", vocab_size=VOCAB, max_len=MAX_LEN, bos_token_id=None, eos_token_id=2))
    model.tokenizer = word_tokenizer()
    model.save_pretrained(root / "gpt")
    (root / "run").mkdir()
    (root / "run" / "run.json").write_text('{"model": {"family": "gpt", "vocab_size": 30}}\n')  # what train looks for
    (root / "folder").mkdir()
    (root / "folder" / "keep.txt").write_text("mine\n")
    files = {
        "notes.txt": b"the cat sat on the mat\na dog ran in the park\n",
        "empty.txt": b"",
        "blank.txt": b"\n  \n\t\n",
        "binary.txt": bytes(range(64)) * 4,  # e.g. raw int8 data
        "utf16.txt": "the cat\n".encode("utf-16"),
        "latin1.txt": LATIN1,
        "three.tsv": b"a cat\tun chat\nthe dog\tle chien\textra\n",
        "one.tsv": b"a cat without its translation\n",
        "typo.json": b'{"model": {"family": "gpt", "vocab_size": 100, "d_modle": 8}}',
        "broken.json": b'{"model": ',
        "latin1.json": b'{"model": "\xe9"}',
        "list.json": b"[1, 2]",
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def snapshot(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every path under ``root``: a file's bytes and modification time, None for a directory."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def fill(text: str, root: Path, out: Path) -> str:
    return text.replace("{root}", str(root)).replace("{out}", str(out))


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_cli_refuses_hostile_input(
    case: Case, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    argv = [fill(a, root, out) for a in case.argv]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(case.stdin), encoding="utf-8"))
    before = snapshot(root)
    if case.usage:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        code = exit_.value.code
    else:
        code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, captured.err
    assert captured.out == ""
    assert "Traceback" not in captured.err
    if case.usage:
        assert lines[0].startswith("usage: attnkit"), captured.err
        assert re.match(r"attnkit( [a-z-]+)?: error: ", lines[-1]), captured.err
    else:
        assert len(lines) == 1 and lines[0].startswith("attnkit: error: "), captured.err
    for expected in case.expect:
        assert fill(expected, root, out) in lines[-1]
    assert snapshot(root) == before  # nothing of the user's changed, moved, or was added to
    assert not [p for p in out.rglob("*") if p.is_file()]  # a refused run writes nothing


@dataclass(frozen=True)
class Env:
    """What the Python API cases call: two small models, and the user's files."""

    gpt: Model  # gpt-tiny, VOCAB tokens, MAX_LEN learned positions
    translator: Model  # transformer-tiny, VOCAB tokens
    root: Path


@dataclass(frozen=True)
class ApiCase:
    id: str
    call: Callable[[Env], object]
    match: str  # a regex of the ValueError's message


IDS = torch.tensor([[5, 6, 7]])
NAN, INF = float("nan"), float("inf")

API_CASES = [
    # -- configs
    ApiCase("preset-negative-size", lambda e: preset("gpt-tiny", d_ff=-1), r"d_ff must be a positive integer, got -1"),
    ApiCase(
        "preset-dropout-above-one",
        lambda e: preset("gpt-tiny", attention_dropout=1.5),
        r"attention_dropout must be in \[0, 1\), got 1\.5",
    ),
    ApiCase(
        "preset-heads-do-not-divide",
        lambda e: preset("gpt-tiny", n_heads=5),
        r"d_model \(64\) must be divisible by n_heads \(5\)",
    ),
    ApiCase("preset-nan-eps", lambda e: preset("gpt-tiny", eps=NAN), r"eps must be a finite number, got nan"),
    ApiCase("preset-unknown", lambda e: preset("gtp-tiny"), r"unknown preset 'gtp-tiny'; did you mean 'gpt-tiny'\?"),
    ApiCase(
        "model-config-typo",
        lambda e: from_dict({"family": "gpt", "vocab_size": 9, "n_head": 1}),
        r"unknown model config key 'n_head'; did you mean 'n_heads'\?",
    ),
    ApiCase("train-infinite-lr", lambda e: TrainConfig(lr=INF), r"lr must be a finite number, got inf"),
    ApiCase("train-nan-beta", lambda e: TrainConfig(betas=(0.9, NAN)), r"betas must be a finite number"),
    ApiCase(
        "train-negative-skip-budget",
        lambda e: TrainConfig(skip_nonfinite=-2),
        r"train\.skip_nonfinite must be >= 0, got -2",
    ),
    ApiCase("data-valid-fraction", lambda e: DataConfig(valid_fraction=0.9), r"valid_fraction .* got 0\.9"),
    ApiCase(
        "override-typo",
        lambda e: apply_overrides(run_preset("gpt-tiny"), {"train.warmpu": "3"}),
        r"unknown option --train\.warmpu; did you mean --train\.warmup\?",
    ),
    ApiCase(
        "run-section-typo",
        lambda e: run_from_dict({"model": {}, "trian": {}}),
        r"unknown run config section 'trian'; did you mean 'train'\?",
    ),
    ApiCase("config-file-is-a-directory", lambda e: load_run_config(e.root / "folder"), r"folder is a directory"),
    ApiCase("device-unknown", lambda e: pick_device("gpu:0"), r"train\.device='gpu:0' is not a device"),
    # -- model inputs
    ApiCase("ids-empty-batch", lambda e: e.gpt(torch.zeros(0, 3, dtype=torch.long)), r"batch size 0"),
    ApiCase("ids-uint8", lambda e: e.gpt(IDS.to(torch.uint8)), r"got dtype torch\.uint8; pass input_ids\.long\(\)"),
    ApiCase("ids-at-vocab-size", lambda e: e.gpt(torch.tensor([[VOCAB]])), rf"token id {VOCAB}, outside .*{VOCAB}\)"),
    ApiCase(
        "ids-past-positions", lambda e: e.gpt(torch.zeros(1, MAX_LEN + 1, dtype=torch.long)), rf"max_len={MAX_LEN}"
    ),
    ApiCase("mask-of-twos", lambda e: e.gpt(IDS, attention_mask=torch.full((1, 3), 2)), r"only 0 .* got value 2"),
    ApiCase("mask-float", lambda e: e.gpt(IDS, attention_mask=torch.ones(1, 3)), r"attention_mask\.long\(\)"),
    ApiCase(
        "decoder-ids-at-vocab-size",
        lambda e: e.translator(IDS, decoder_input_ids=torch.tensor([[1, VOCAB]])),
        rf"decoder_input_ids holds token id {VOCAB}",
    ),
    ApiCase("causal-mask-more-queries-than-keys", lambda e: causal_mask(5, 3), r"0 <= n <= m, got n=5, m=3"),
    # -- decoding settings
    ApiCase("generate-empty-batch", lambda e: e.gpt.generate(torch.zeros(0, 2, dtype=torch.long)), r"batch size 0"),
    ApiCase(
        "generate-mask-shape",
        lambda e: e.gpt.generate(IDS, torch.ones(1, 4, dtype=torch.long)),
        r"attention_mask has shape \(1, 4\), expected \(1, 3\)",
    ),
    ApiCase(
        "generate-infinite-temperature",
        lambda e: e.gpt.generate(IDS, do_sample=True, temperature=INF),
        r"temperature must be a finite number, got inf",
    ),
    ApiCase(
        "generate-nan-length-penalty",
        lambda e: e.gpt.generate(IDS, num_beams=2, length_penalty=NAN),
        r"length_penalty must be a finite number, got nan",
    ),
    ApiCase(
        "generate-eos-at-vocab-size",
        lambda e: e.gpt.generate(IDS, max_new_tokens=2, eos_token_id=VOCAB),
        rf"eos_token_id must be a token id in \[0, {VOCAB}\), got {VOCAB}",
    ),
    ApiCase("generate-fractional-top-k", lambda e: e.gpt.generate(IDS, do_sample=True, top_k=2.5), r"top_k .* 2\.5"),
    ApiCase(
        "translate-negative-offset",
        lambda e: e.translator.generate(IDS, source_length_offset=-1),
        r"source_length_offset must be >= 0, got -1",
    ),
    ApiCase(
        "offset-on-a-decoder-only",
        lambda e: e.gpt.generate(IDS, source_length_offset=3),
        r"source_length_offset .* needs an encoder-decoder",
    ),
    ApiCase(
        "generate-with-bert",
        lambda e: build_model(preset("bert-tiny", n_layers=1)).generate(IDS),
        r"BERT is an encoder .* use attnkit fill-mask",
    ),
]


@pytest.fixture(scope="module")
def env(root: Path) -> Env:
    torch.manual_seed(0)
    gpt = build_model(preset("gpt-tiny", vocab_size=VOCAB, max_len=MAX_LEN)).eval()
    translator = build_model(preset("transformer-tiny", vocab_size=VOCAB, n_layers=1)).eval()
    return Env(gpt, translator, root)


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_api_refuses_hostile_input(case: ApiCase, env: Env) -> None:
    before = snapshot(env.root)
    with pytest.raises(ValueError, match=case.match) as error:
        case.call(env)
    assert "\n" not in str(error.value)
    assert snapshot(env.root) == before


def test_an_unexpected_failure_is_one_line_with_status_1(
    root: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(root / "gpt" / "model.safetensors"))

    monkeypatch.setattr(attnkit, "from_pretrained", fail)
    assert main(["info", str(root / "gpt")]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"attnkit: error: PermissionError: [Errno 13] Permission denied: '{root / 'gpt' / 'model.safetensors'}' "
        "(--debug shows the traceback)"
    ]
    with pytest.raises(PermissionError):
        main(["--debug", "info", str(root / "gpt")])


def attnkit_process(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnkit", *argv], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


def test_a_real_process_prints_one_line_and_no_traceback(root: Path) -> None:
    result = attnkit_process("generate", "--model", str(root / "gpt"), "--ids", f"5 {VOCAB}")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"attnkit: error: input_ids holds token id {VOCAB}, outside the vocabulary "
                                          f"[0, {VOCAB})"]  # fmt: skip


def test_debug_shows_the_traceback(root: Path) -> None:
    before = snapshot(root)
    result = attnkit_process("--debug", "train", "--preset", "gpt-tiny", "--data.path", str(root / "notes.txt"),
                             "--out", str(root / "run"))  # fmt: skip
    assert result.returncode == 1  # the uncaught exception: Python's own status
    assert "Traceback (most recent call last)" in result.stderr
    assert "FileExistsError" in result.stderr and "already holds a run" in result.stderr
    assert snapshot(root) == before
