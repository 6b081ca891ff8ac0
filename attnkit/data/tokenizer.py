"""One byte-level BPE vocabulary shared by source and target, as the paper's shared BPE.

The tokenizer is a Hugging Face ``tokenizers.Tokenizer``: a ``ByteLevel`` pre-tokenizer
(GPT-2's: text is read as UTF-8 bytes, so nothing is ever out of vocabulary), a BPE model
learnt over those bytes, and a ``ByteLevel`` decoder. ``add_prefix_space=False``: a space is
never invented before the first word, so ``decode(encode(text)) == text`` exactly; the cost
is that a sentence's first word is tokenized without its leading ``Ġ``, as in GPT-2. There is
no normalizer: text is kept as written, accents included (NFC and NFD spellings of the same
word stay different byte sequences).

The special tokens of :mod:`attnkit.data.specials` come first, at ids 0..36, and are added
tokens: BPE never splits them, and ``<mask>`` written in a text encodes to its one id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from attnkit.data.specials import BOS, EOS, MASK, N_SENTINELS, PAD, SPECIAL_TOKENS, UNK, Specials, sentinel

BYTE_ALPHABET_SIZE = 256
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + BYTE_ALPHABET_SIZE  # 293: the specials and every byte, before any merge


def byte_level_bpe(bpe: BPE, split_digits: bool = False) -> Tokenizer:
    """A tokenizer of ``bpe`` over bytes, as GPT-2's: text split into words and mapped to
    byte symbols before the merges, decoded back from them. ``split_digits``: every digit a
    word of its own first (SmolLM's pre-tokenizer)."""
    tokenizer = Tokenizer(bpe)
    words = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        words = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), words])
    tokenizer.pre_tokenizer = words
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Learn a byte-level BPE vocabulary of at most ``vocab_size`` entries from ``texts``
    (fewer when the corpus runs out of pairs to merge). Source and target texts of a
    translation corpus go in together, giving one shared vocabulary.

    The same texts in the same order give the same tokenizer, byte for byte in ``to_str()``.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, got one str; wrap it in a list")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} cannot hold the {len(SPECIAL_TOKENS)} special tokens and the "
            f"{BYTE_ALPHABET_SIZE}-byte alphabet; use vocab_size >= {MIN_VOCAB_SIZE} (the paper used about 37000)"
        )
    tokenizer = byte_level_bpe(BPE())  # no unk_token: every byte is in the alphabet
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a ``tokenizer.json`` (as written by ``Tokenizer.save``)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; pass the tokenizer.json file inside it")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass a tokenizer.json written by Tokenizer.save")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for a file it cannot read
        raise ValueError(
            f"{path} is not a tokenizer the tokenizers library reads ({err}); it may be truncated, "
            "re-create it with train_tokenizer and Tokenizer.save"
        ) from None


def has_specials(tokenizer: Tokenizer | None) -> bool:
    """Whether ``tokenizer`` is attnkit's: it holds attnkit's special tokens."""
    return tokenizer is not None and tokenizer.token_to_id(SPECIAL_TOKENS[0]) is not None


def with_template(tokenizer: Tokenizer, start: list[int], end: list[int], bert: bool = False) -> Tokenizer:
    """``tokenizer``, or a copy that puts the ids ``start`` before and ``end`` after each text it
    encodes (those it does not already put there), after any post-processor it has (GPT-2's
    ByteLevel one trims offsets: it goes first). A pair of texts is joined as ``transformers``'
    tokenizers join one: ``start A end start B end``, BERT's (``bert``) ``start A end B end``."""
    from tokenizers import processors

    probe = tokenizer.encode("a").ids
    start = [] if probe[: len(start)] == start else start
    end = [] if end and probe[-len(end) :] == end else end
    if not start and not end:
        return tokenizer
    names = {i: tokenizer.id_to_token(i) for i in (*start, *end)}
    single = [*(names[i] for i in start), "$A", *(names[i] for i in end)]
    again = [] if bert else [f"{names[i]}:1" for i in start]
    pair = [*single, *again, "$B:1", *(f"{names[i]}:1" for i in end)]
    specials = [(token, i) for i, token in names.items()]
    template = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    kept = tokenizer.post_processor
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.post_processor = template if kept is None else processors.Sequence([kept, template])
    return copy


def read_as_pretrained(tokenizer: Tokenizer, family: str) -> Tokenizer:
    """attnkit's own ``tokenizer`` made to put around a text, as it encodes it, the specials its
    family's pretraining objective puts there: ``<s>`` before a GPT's (the causal LM reads
    ``[bos] x``), ``<s> x </s>`` for a BERT's (the masked LM's ``[CLS] x [SEP]``); so that a
    classifier fine-tuned with it reads a text as its pretraining did, in attnkit and in
    ``transformers`` alike (GPT-1's start token). Any other tokenizer (its own post-processor
    decides) or family: unchanged."""
    if not has_specials(tokenizer) or family not in ("gpt", "bert"):
        return tokenizer
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    return with_template(tokenizer, [bos], [eos] if family == "bert" else [], bert=family == "bert")


def specials_of(tokenizer: Tokenizer) -> Specials:
    """The ids of attnkit's special tokens in ``tokenizer``'s vocabulary."""
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        raise ValueError(
            f"the tokenizer lacks the special tokens {', '.join(missing)}; "
            "train it with attnkit.data.tokenizer.train_tokenizer, which adds all of them"
        )
    return Specials(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        pad=ids[PAD],
        bos=ids[BOS],
        eos=ids[EOS],
        unk=ids[UNK],
        mask=ids[MASK],
        sentinels=tuple(ids[sentinel(i)] for i in range(N_SENTINELS)),
    )


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, with no special token added around them (each objective adds
    its own); a special token written inside a text still encodes to its id."""
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, got one str; wrap it in a list")
    return [encoding.ids for encoding in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def encode_with_specials(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, special tokens included, without any padding the tokenizer adds."""
    return [[i for i, m in zip(e.ids, e.attention_mask, strict=True) if m] for e in tokenizer.encode_batch(texts)]


def fit(ids: list[int], cap: int) -> list[int]:
    """``ids`` cut to at most ``cap`` tokens, keeping the last one (the tokenizer's closing
    special, [SEP] or </s>), as ``transformers``' truncation keeps it."""
    return ids if len(ids) <= cap else [*ids[: cap - 1], ids[-1]]


def decode(tokenizer: Tokenizer, ids: Iterable[int]) -> str:
    """The text of ``ids`` (a list, or a 1-D tensor), special tokens left out."""
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


SPM_FILES = ("source.spm", "target.spm", "spiece.model")  # Marian's two models, T5's one
T5_EXTRA_IDS = 100  # T5's sentinels <extra_id_0..99>, after the SentencePiece pieces


def tokenizer_from_vocabulary(directory: Path) -> Tokenizer | None:
    """The tokenizer of a checkpoint directory without a ``tokenizer.json``, from the files
    its family ships: GPT-2's ``vocab.json`` + ``merges.txt`` (byte-level BPE), BERT's
    ``vocab.txt`` (WordPiece, lower-cased as its ``tokenizer_config.json`` says, [CLS] ... [SEP]
    added), Marian's ``source.spm`` + ``vocab.json`` and T5's ``spiece.model`` (SentencePiece,
    ``</s>`` appended). None when the directory has none of them; a file that cannot be read is
    one ``ValueError`` naming it."""
    import json

    from attnkit.data.sentencepiece import read_model, spm_tokenizer

    vocab, merges, wordpieces = directory / "vocab.json", directory / "merges.txt", directory / "vocab.txt"
    source, spiece, config = directory / "source.spm", directory / "spiece.model", directory / "tokenizer_config.json"
    try:
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{config} is not JSON ({err}); replace it") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{config} holds {type(settings).__name__}, not a JSON object; replace it")
    if source.is_file() and vocab.is_file() and not merges.is_file():
        if settings.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
            raise ValueError(
                f"{directory}: a Marian tokenizer with separate source and target vocabularies is not supported; "
                "convert it with transformers to a checkpoint with one shared vocab.json"
            )
        try:
            pieces = json.loads(vocab.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{vocab} is not JSON ({err}); replace it") from None
        if not isinstance(pieces, dict) or not all(isinstance(i, int) for i in pieces.values()):
            raise ValueError(f"{vocab} is not a JSON object of piece -> id; replace it")
        try:
            return spm_tokenizer(
                read_model(source), pieces, _token_setting(settings, "eos_token", "</s>", config), trim=True
            )
        except ValueError as err:
            raise ValueError(f"{directory}: {err}") from None
    if spiece.is_file():
        extra = settings.get("extra_ids", T5_EXTRA_IDS)
        if not isinstance(extra, int) or isinstance(extra, bool) or extra < 0:
            raise ValueError(f"{config}: extra_ids is {extra!r}; write a count >= 0 (T5 has 100)")
        tokenizer = spm_tokenizer(read_model(spiece), end=_token_setting(settings, "eos_token", "</s>", config))
        sentinels = [AddedToken(f"<extra_id_{i}>", normalized=False, special=True) for i in reversed(range(extra))]
        tokenizer.add_special_tokens(sentinels)  # <extra_id_0> last, as T5 numbers them
        return tokenizer
    try:
        if vocab.is_file() and merges.is_file():
            return byte_level_bpe(BPE.from_file(str(vocab), str(merges)))
        if wordpieces.is_file():
            from tokenizers.implementations import BertWordPieceTokenizer

            lower = bool(settings.get("do_lower_case", True))
            return BertWordPieceTokenizer(str(wordpieces), lowercase=lower)._tokenizer
    except Exception as err:  # tokenizers raises bare Exceptions on a malformed file
        raise ValueError(f"{directory}: its tokenizer files cannot be read ({err}); replace them") from None
    return None


def sentencepiece_files(directory: Path) -> dict[str, bytes]:
    """The SentencePiece files of a checkpoint directory (Marian's ``source.spm``,
    ``target.spm`` and their ``vocab.json``, T5's ``spiece.model``), as bytes: a directory
    written from the model keeps them, so that ``transformers``' SentencePiece tokenizers
    still read it (Marian's has no ``tokenizer.json`` form)."""
    names = [name for name in SPM_FILES if (directory / name).is_file()]
    if "source.spm" in names and (directory / "vocab.json").is_file():
        names.append("vocab.json")
    return {name: (directory / name).read_bytes() for name in names}


def _token_setting(settings: dict, name: str, default: str, path: Path) -> str:
    """A special token of ``tokenizer_config.json``: written as its text or as an AddedToken's dict."""
    value = settings.get(name) or default
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{path}: {name} is {settings.get(name)!r}; write the token's text, e.g. {default!r}")
    return value
