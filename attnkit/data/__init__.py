"""Text in, token ids out: corpora, tokenizers, the dataset store (a corpus tokenized once), batching."""

from attnkit.data.batching import BatchIterator, ShardedBatches, TokenBatches, split_train_valid
from attnkit.data.files import read_lines, read_pairs
from attnkit.data.specials import SPECIAL_TOKENS, Specials
from attnkit.data.tokenizer import decode, encode_batch, load_tokenizer, specials_of, train_tokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "BatchIterator",
    "ShardedBatches",
    "Specials",
    "TokenBatches",
    "decode",
    "encode_batch",
    "load_tokenizer",
    "read_lines",
    "read_pairs",
    "specials_of",
    "split_train_valid",
    "train_tokenizer",
]
