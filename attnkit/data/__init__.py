"""Text in, token ids out: corpora, tokenizers, batching."""
