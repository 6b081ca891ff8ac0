"""Every label of the chapter ``06-attention.tex``, with what it names.

Docstrings cite these as ``[eq:att-sdpa]``; ``tests/test_chapter_labels.py`` fails on a cited
label that is not here, and checks this table against the chapter's source when it is at
hand. ``docs/chapter.md`` maps each label to its code and its test.
"""

# Labels that name a section or the chapter: context, not something to implement.
SECTIONS: dict[str, str] = {
    "chap:attention": "Attention and Transformers",
    "sec:att-sdpa": "Scaled Dot-Product Attention",
    "sec:att-multihead": "Multi-Head Attention",
    "sec:att-positional": "Positional Encoding",
    "sec:att-block": "The Transformer Block",
    "sec:att-arch": "The Complete Encoder-Decoder Architecture",
    "sec:att-complexity": "Computational Complexity",
    "sec:att-families": "Model Families: BERT, GPT, T5",
}

# Labels of things with a home in the code: equations, definitions, properties, the
# algorithm, figures and tables.
ITEMS: dict[str, str] = {
    "def:att-sdpa": "definition of scaled dot-product attention",
    "eq:att-sdpa": "Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V",
    "eq:att-alpha": "attention weights α_ij, rows sum to 1",
    "fig:att-sdpa-flow": "computational flow of scaled dot-product attention",
    "prop:att-variance": "variance of a dot product is d_k",
    "eq:att-variance": "E[s] = 0, Var(s) = d_k",
    "eq:att-head": "head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)",
    "eq:att-multihead": "MultiHead = Concat(head_1..head_h) W^O",
    "eq:att-pe-sin": "PE(pos, 2i) = sin(pos / 10000^(2i/d_model))",
    "eq:att-pe-cos": "PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))",
    "prop:att-pe-linear": "relative positions are a rotation of the encoding",
    "eq:att-addnorm": "x -> LayerNorm(x + Sublayer(x))",
    "eq:att-layernorm": "LayerNorm(x) = γ ⊙ (x - μ)/σ + β",
    "eq:att-ffn": "FFN(x) = max(0, x W_1 + b_1) W_2 + b_2",
    "eq:att-mask": "the causal mask M",
    "eq:att-masked": "MaskedAttention = softmax(Q Kᵀ/√d_k + M) V",
    "alg:att-decode": "greedy autoregressive decoding",
    "fig:att-transformer": "the complete encoder-decoder architecture",
    "tab:att-complexity": "per-layer complexity, sequential ops, max path length",
    "tab:att-families": "the three families BERT, GPT, T5",
}

LABELS: dict[str, str] = {**SECTIONS, **ITEMS}
