"""Every family starts where training can start: an untrained model predicts random targets
about as well as the uniform distribution (loss within 1 nat of ln V, logits of std near 1 or
less), and T5's matrices are drawn as its reference (Mesh TensorFlow) draws them."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import attnkit
from attnkit.config import PRESETS, UNUSED, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_an_untrained_model_predicts_random_targets_near_uniformly(name: str) -> None:
    cfg = preset(name)
    torch.manual_seed(0)
    model = attnkit.build_model(cfg).eval()
    g = torch.Generator().manual_seed(1)
    x, y, z = (torch.randint(0, cfg.vocab_size, (2, 16), generator=g) for _ in range(3))  # z: the targets
    with torch.no_grad():
        out = model(input_ids=x, decoder_input_ids=y) if cfg.is_encoder_decoder else model(input_ids=x)
    logits = out.logits.float().flatten(0, 1)  # (2·16, V)
    loss = torch.nn.functional.cross_entropy(logits, z.flatten())
    assert abs(float(loss) - math.log(cfg.vocab_size)) < 1.0, (float(loss), math.log(cfg.vocab_size))
    assert 0.0 < float(logits.std()) < 2.0


@pytest.mark.parametrize("tied", [True, False])
def test_t5_draws_each_matrix_as_mesh_tensorflow_does(tied: bool) -> None:
    # v1.0 (tied head, hidden state scaled by d^-0.5) and v1.1 (untied head).
    d, d_ff, heads, d_k, vocab = 128, 512, 4, 32, 4000
    cfg = preset("t5-tiny").replace(
        d_model=d, d_ff=d_ff, n_heads=heads, d_k=d_k, vocab_size=vocab, tie_embeddings=tied, head_scale=tied
    )
    torch.manual_seed(0)
    model = attnkit.build_model(cfg)
    expected = {"embeddings.token.weight": 1.0}  # the reference formula: N(0, fan_in^-0.5) per matrix
    if not tied:
        expected["head.weight"] = d**-0.5
    for stack in ("encoder", "decoder"):
        expected[f"{stack}.position_bias.embedding.weight"] = d**-0.5
        for i in range(cfg.n_layers):
            for attn in ("self_attn", "cross_attn") if stack == "decoder" else ("self_attn",):
                prefix = f"{stack}.layers.{i}.{attn}"
                expected[f"{prefix}.w_q.weight"] = (d * d_k) ** -0.5  # 1/√d_k folded into W^Q
                expected[f"{prefix}.w_k.weight"] = expected[f"{prefix}.w_v.weight"] = d**-0.5
                expected[f"{prefix}.w_o.weight"] = (heads * d_k) ** -0.5
            ffn = f"{stack}.layers.{i}.ffn"
            expected[f"{ffn}.w_1.weight"] = d**-0.5
            if cfg.gated:
                expected[f"{ffn}.w_3.weight"] = d**-0.5
            expected[f"{ffn}.w_2.weight"] = d_ff**-0.5
    params = {name: p.detach() for name, p in model.named_parameters()}
    for name, std in expected.items():
        # A sample std of n draws is off by about 1/√(2n) of itself: four of those allowed.
        within = 4 / math.sqrt(2 * params[name].numel())
        assert float(params[name].std()) == pytest.approx(std, rel=within), name


def _family_presets() -> dict[str, str]:
    """One small preset per family (the llama-shaped GPT is a GPT with rotary positions)."""
    return {"transformer": "transformer-tiny", "bert": "bert-tiny", "gpt": "gpt-tiny", "t5": "t5-tiny"}


def _changed(value: object) -> object:
    """A value different from a field's default, of the same type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, float):
        return value * 3
    if isinstance(value, int):
        return value + 2
    return 2  # None (n_decoder_layers): a number


@pytest.mark.parametrize("family", sorted(UNUSED))
def test_a_key_the_family_does_not_use_is_refused_and_truly_changes_nothing(family: str) -> None:
    cfg = preset(_family_presets()[family])
    torch.manual_seed(0)
    reference = attnkit.build_model(cfg).state_dict()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, cfg.vocab_size, (2, 9), generator=g)
    inputs = dict(input_ids=x, decoder_input_ids=x) if cfg.is_encoder_decoder else dict(input_ids=x)
    for name in UNUSED[family]:
        value = _changed(getattr(cfg, name))
        with pytest.raises(ValueError, match=rf"^a {family} model does not use model\.{name} \(got {value!r}"):
            cfg.replace(**{name: value})
        # The refusal is right: set behind the check's back, the key changes no weight and no output.
        bypassed = dataclasses.replace(cfg)
        object.__setattr__(bypassed, name, value)
        torch.manual_seed(0)
        model = attnkit.build_model(bypassed).eval()
        assert model.state_dict().keys() == reference.keys(), name
        for key, tensor in model.state_dict().items():
            torch.testing.assert_close(tensor, reference[key], msg=f"{name} changed {key}")
        torch.manual_seed(0)
        plain = attnkit.build_model(cfg).eval()
        with torch.no_grad():
            torch.testing.assert_close(model(**inputs).logits, plain(**inputs).logits, msg=name)


def test_t5_positions_are_its_relative_bias_and_rope_theta_needs_rotary() -> None:
    with pytest.raises(ValueError, match=r"^a t5 model's positions are its relative bias: .* got 'learned'"):
        preset("t5-tiny").replace(positional="learned")
    with pytest.raises(ValueError, match=r"^model\.rope_theta \(500000\.0\) is used by rotary positions only"):
        preset("gpt-tiny").replace(rope_theta=500000.0)
    assert preset("llama-tiny").replace(rope_theta=500000.0).rope_theta == 500000.0  # rotary: honoured


def test_t5_with_scaled_scores_draws_its_queries_as_its_keys() -> None:
    # The 1/√d_k is in the scores, so it is not folded into W^Q a second time.
    d, d_k = 256, 64
    cfg = preset("t5-tiny").replace(d_model=d, n_heads=4, d_k=d_k, d_ff=512, scale_scores=True)
    torch.manual_seed(0)
    w_q = attnkit.build_model(cfg).encoder.layers[0].self_attn.w_q.weight.detach()
    assert float(w_q.std()) == pytest.approx(d**-0.5, rel=4 / math.sqrt(2 * w_q.numel()))
