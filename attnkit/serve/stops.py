"""Stop sequences over streamed text: the text a choice may show so far, holding back any
end of it that could still begin a stop sequence, and where the first stop sequence begins."""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """Text pushed in pieces, handed out up to (never including) the first of ``stops``.
    :meth:`push` returns what can be shown now; once a stop is found, :attr:`stopped` is True
    and nothing more is shown. :meth:`finish` returns what was held back at the end."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self.held + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped, self.held = True, ""
            return text[: min(found)]
        keep = max((_overlap(text, s) for s in self.stops), default=0)  # an end that may begin a stop
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def finish(self) -> str:
        held, self.held = self.held, ""
        return "" if self.stopped else held


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of ``text`` that is a beginning of ``stop`` (shorter than it)."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
