"""DecodingOptions: one frozen value, checked once when made, the same from keyword arguments as
from a checkpoint's generation_config.json; generate() takes it whole with options=."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.generation import DecodingOptions, generate
from attnkit.generation.options import OPTION_NAMES
from attnkit.models import build_model
from attnkit.models.generation_config import read_generation_config


def test_a_generation_config_gives_the_options_its_keywords_give(tmp_path: Path) -> None:
    file = {"num_beams": 4, "max_length": 40, "length_penalty": 0.6, "eos_token_id": [2, 3], "bad_words_ids": [[5]]}
    (tmp_path / "generation_config.json").write_text(json.dumps(file))
    from_file = DecodingOptions.over(read_generation_config(tmp_path, hugging_face=True))
    by_hand = DecodingOptions(
        num_beams=4, max_length=40, length_penalty=0.6, eos_token_id=[2, 3], bad_words_ids=[[5]],  # type: ignore[arg-type]
        length_penalty_style="power", early_stopping=False,  # Hugging Face's beam search, as the file implies
    )  # fmt: skip
    assert from_file == by_hand
    assert from_file.eos_token_id == (2, 3) and from_file.ends == (2, 3) and from_file.bad_words_ids == ((5,),)


def test_arguments_given_win_over_the_file_and_max_new_tokens_sets_its_max_length_aside() -> None:
    defaults = {"num_beams": 4, "max_length": 40}
    assert DecodingOptions.over(defaults, num_beams=2) == DecodingOptions(num_beams=2, max_length=40)
    assert DecodingOptions.over(defaults, max_new_tokens=5) == DecodingOptions(num_beams=4, max_new_tokens=5)
    assert DecodingOptions.over(defaults, max_new_tokens=None).max_length is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"num_beams": 0}, "num_beams must be an integer >= 1, got 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
        ({"length_penalty_style": "gmnt"}, "length_penalty_style must be 'gnmt' or 'power', got 'gmnt'"),
        (
            {"do_sample": True, "num_beams": 2},
            r"sampling \(do_sample\) draws one path per input; set num_beams to 1 \(got 2\)",
        ),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0 when sampling, got 0.0"),
        ({"top_k": 0}, "top_k must be an integer >= 1, got 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"no_repeat_ngram_size": 0}, r"no_repeat_ngram_size must be an integer >= 1, got 0 \(3 is usual\)"),
        ({"no_repeat_ngram_unit": "word"}, "no_repeat_ngram_size, which is not set; set both"),
        ({"source_length_offset": -1}, "source_length_offset must be >= 0, got -1"),
        ({"compile": "yes"}, "compile must be True, False or 'auto', got 'yes'"),
    ],
)
def test_an_invalid_option_is_refused_when_made(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**options)  # type: ignore[arg-type]


def test_options_are_frozen() -> None:
    options = DecodingOptions(num_beams=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_beams = 3  # type: ignore[misc]


def test_generate_takes_the_options_whole_or_as_arguments_not_both() -> None:
    torch.manual_seed(0)
    model = build_model("gpt-tiny").eval()
    model.generation_defaults = {"num_beams": 3}  # options= are whole: the file's beams do not come in
    ids = torch.tensor([[5, 6, 7]])
    options = DecodingOptions(max_new_tokens=4, do_sample=True, top_k=5, seed=1)
    expected = generate(model, ids, max_new_tokens=4, do_sample=True, top_k=5, seed=1)
    assert torch.equal(model.generate(ids, options=options), expected)
    assert torch.equal(generate(model, ids, options=options), expected)
    with pytest.raises(ValueError, match="either as options= or as arguments, not both"):
        generate(model, ids, num_beams=2, options=options)


def test_the_models_get_generate_from_the_room_that_decodes_them() -> None:
    """The models do not import attnkit.generation: their generate() is there once it is
    imported, as attnkit.build_model and attnkit.from_pretrained do; until then it says so."""
    code = (
        "import torch, attnkit\n"
        "from attnkit.models import build_model\n"
        "model = build_model('gpt-tiny')\n"
        "try:\n"
        "    model.generate(torch.tensor([[1, 2]]), max_new_tokens=2)\n"
        "except RuntimeError as err:\n"
        "    print(err)\n"
        "print(attnkit.build_model('gpt-tiny').generate(torch.tensor([[1, 2]]), max_new_tokens=2).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, second = out.strip().splitlines()
    assert first.startswith("model.generate decodes with attnkit.generation, which is not imported")
    assert second == "torch.Size([1, 4])"


@pytest.mark.parametrize(
    "options",
    [{"max_new_tokens": 0}, {"num_beams": 0}, {"temperature": float("nan")}, {"do_sample": True, "num_beams": 2},
     {"do_sample": True, "temperature": 0.0}, {"top_k": 0}, {"top_p": 1.5}, {"no_repeat_ngram_size": 0},
     {"no_repeat_ngram_unit": "word"}, {"source_length_offset": -1}, {"length_penalty_style": "x"}],
)  # fmt: skip
def test_a_refusal_names_the_options_as_their_giver_spells_them(options: dict[str, object]) -> None:
    """named(): a command's flags, an API's fields; no option is named as generate() names it."""
    spelling = {name: f"--{name.replace('_', '-')}" for name in OPTION_NAMES}
    with pytest.raises(ValueError) as refused:
        DecodingOptions.named(spelling, {}, **options)
    message = str(refused.value)
    assert all(spelling[name] in message for name in options if name != "do_sample" or options.get("num_beams"))
    assert not any(name in message.replace(spelling[name], "") for name in OPTION_NAMES if "_" in name), message
