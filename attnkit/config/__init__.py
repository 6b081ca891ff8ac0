"""The configs: frozen, validated dataclasses for the model (:mod:`~attnkit.config.model`) and
the training run (:mod:`~attnkit.config.run`), the named presets
(:mod:`~attnkit.config.presets`), configs from JSON, YAML and the command line's typed
overrides (:mod:`~attnkit.config.parsing`), and the Bibles' tables a run is checked against
(:mod:`~attnkit.config.bible`). Pure Python, importing nothing else of attnkit: the command line
reads it without torch, and every other room may import it.

Its modules import one way: typed and bible import none of them, model imports typed, run
imports model and bible, presets and parsing import model and run.
"""

from attnkit.config.model import UNUSED, Family, ModelConfig, Positional, from_dict
from attnkit.config.parsing import apply_overrides, from_json, load_run_config, to_json
from attnkit.config.presets import PRESETS, RUN_PRESETS, TRAIN_DEFAULTS, preset, run_preset
from attnkit.config.run import (
    OBJECTIVE_FAMILIES,
    OBJECTIVES,
    DataConfig,
    Objective,
    RunConfig,
    TrainConfig,
    objective_mismatch,
    run_from_dict,
)

__all__ = [
    "OBJECTIVES",
    "OBJECTIVE_FAMILIES",
    "PRESETS",
    "RUN_PRESETS",
    "TRAIN_DEFAULTS",
    "UNUSED",
    "DataConfig",
    "Family",
    "ModelConfig",
    "Objective",
    "Positional",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "from_dict",
    "from_json",
    "load_run_config",
    "objective_mismatch",
    "preset",
    "run_from_dict",
    "run_preset",
    "to_json",
]
