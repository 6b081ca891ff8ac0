"""Configs from text: a model config's JSON round trip, a run config from a JSON or YAML
file, and the command line's typed ``--section.key=value`` overrides."""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from attnkit.config.model import ModelConfig, from_dict
from attnkit.config.run import DataConfig, RunConfig, TrainConfig, run_from_dict
from attnkit.config.typed import describe, options


def to_json(config: ModelConfig) -> str:
    """``config`` as JSON text, keys sorted: :func:`from_json` reads it back."""
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)


def from_json(text: str) -> ModelConfig:
    """A model config from the JSON text of :func:`to_json`, checked as :func:`from_dict` checks it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"model config is not valid JSON: {err}") from None
    return from_dict(data)


def _parse_scalar(text: str, hint: Any, key: str) -> Any:
    """``--key=text`` as a value of ``hint``: the first of its alternatives that ``text`` reads as."""
    if type(None) in options(hint) and text.lower() in ("null", "none"):  # before str: --train.init=null unsets
        return None
    for option in options(hint):
        if option is bool and text.lower() in ("true", "false", "1", "0", "yes", "no"):
            return text.lower() in ("true", "1", "yes")
        if option is int:
            try:
                return int(text)
            except ValueError:
                continue
        if option is float:
            try:
                return float(text)
            except ValueError:
                continue
        if get_origin(option) is tuple:
            args = get_args(option)
            items = [t for t in text.split(",") if t] if text else []
            element = args[0]
            return tuple(_parse_scalar(t.strip(), element, key) for t in items)
        if option is str or (get_origin(option) is Literal and text in get_args(option)):
            return text
    wanted = " or ".join(describe(o) for o in options(hint))
    raise ValueError(f"--{key}={text}: expected {wanted}")


def apply_overrides(run: RunConfig, overrides: dict[str, str]) -> RunConfig:
    """Apply typed ``section.key=value`` overrides (strings from the command line), each
    checked against the field's type, with a "did you mean" on unknown keys."""
    data = run.to_dict()
    sections = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
    all_keys = [f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)]
    for key, text in overrides.items():
        section, _, name = key.partition(".")
        if section not in sections or name not in {f.name for f in dataclasses.fields(sections[section])}:
            same_name = [k for k in all_keys if k.endswith(f".{name}")]  # right key, wrong section
            close = same_name or difflib.get_close_matches(key, all_keys, n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise ValueError(f"unknown option --{key}{hint}")
        data[section][name] = _parse_scalar(text, get_type_hints(sections[section])[name], key)
    return run_from_dict(data)


def load_run_config(path: str | Path) -> RunConfig:
    """A run config from a JSON or YAML file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"config file {path} is a directory; pass a JSON or YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} not found") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"config file {path} is not valid UTF-8 (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8"
        ) from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ModuleNotFoundError("reading YAML needs PyYAML: pip install 'attnkit[yaml]'", name="yaml") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{path} is not valid YAML: {err}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
    try:
        return run_from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
