"""From text to the ids a model decodes from, and back as the tokens arrive: shared by the
commands (``generate``, ``translate``, ``chat``) and the server, so both feed a model alike."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from attnkit.config import ModelConfig
from attnkit.data.specials import BOS
from attnkit.data.tokenizer import encode_with_specials


def until_eos(tokens: list[int], ends: tuple[int, ...]) -> list[int]:
    """The generated tokens before the first of the end tokens ``ends`` (the rest is padding):
    :meth:`~attnkit.generation.options.DecodingOptions.end_tokens`, which a checkpoint's
    ``generation_config.json`` may make several."""
    return next((tokens[:n] for n, token in enumerate(tokens) if token in ends), tokens)


def prompt_ids(tokenizer: Tokenizer, cfg: ModelConfig, texts: Sequence[str], first: int = 1) -> list[list[int]]:
    """Decoder-only prompts: each text's ids with the tokenizer's special tokens, after ``<s>``
    where the model is attnkit's own (its causal-LM objective trains on ``<s>`` + text); an
    empty prompt is the start token alone, refused where the model has none (named by its
    number, ``first`` for the first text)."""
    starts_with_bos = cfg.bos_token_id is not None and tokenizer.token_to_id(BOS) == cfg.bos_token_id
    prompts = encode_with_specials(tokenizer, list(texts))
    for n, prompt in enumerate(prompts):
        if starts_with_bos and prompt[:1] != [cfg.bos_token_id]:
            prompt.insert(0, cfg.bos_token_id)  # type: ignore[arg-type]
        if not prompt:
            if cfg.bos_token_id is None:
                raise ValueError(
                    f"prompt {first + n} is empty and the model has no bos_token_id to start from; give it some text"
                )
            prompt.append(cfg.bos_token_id)
    return prompts


def source_ids(tokenizer: Tokenizer, eos: int | None, texts: Sequence[str]) -> list[list[int]]:
    """Encoder–decoder sources: each text's ids ending with the end token, appended where the
    tokenizer does not add it (attnkit's translation objective trains on source + eos, as
    Marian and T5 do). An empty text stays empty."""
    sources = encode_with_specials(tokenizer, list(texts))
    for source in sources:
        if source and eos is not None and source[-1] != eos:
            source.append(eos)
    return sources


class TemplateRefusalError(ValueError):
    """A chat template's own refusal of a conversation (``raise_exception`` in the template:
    roles that do not alternate, a system message it does not take)."""


def chat_prompt(
    template: str, tokenizer: Tokenizer, cfg: ModelConfig, messages: list[dict[str, str]], open_turn: bool = True
) -> list[int]:
    """The conversation as the model was trained to read it, the assistant's turn opened
    (``open_turn``: the template's ``add_generation_prompt``), as ids; rendered in a sandbox
    (a template is data from the checkpoint, not code to trust)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    specials = {
        name: tokenizer.id_to_token(i) or ""
        for name, i in (("bos_token", cfg.bos_token_id), ("eos_token", cfg.eos_token_id))
        if i is not None
    }

    def refuse(message: str) -> None:  # templates call it on a conversation they do not take
        raise TemplateRefusalError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = refuse
    try:
        text = environment.from_string(template).render(messages=messages, add_generation_prompt=open_turn, **specials)
    except TemplateError as err:
        raise ValueError(
            f"the model's chat template cannot be rendered ({err}); fix its tokenizer_config.json"
        ) from None
    return tokenizer.encode(text, add_special_tokens=False).ids


class TextStream:
    """The text of a growing list of new tokens, handed out as it grows: :meth:`push` returns
    what a token added. A character whose bytes are split across tokens waits until it is whole
    (byte-level BPE decodes a partial one as U+FFFD); special tokens are left out."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.text):
            return ""
        delta, self.text = text[len(self.text) :], text
        return delta

    def finish(self) -> str:
        """Whatever is still held back, once no token follows."""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        delta = text[len(self.text) :] if text.startswith(self.text) else ""
        self.text = text
        return delta
