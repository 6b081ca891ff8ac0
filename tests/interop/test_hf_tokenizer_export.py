"""export_hf writes a complete tokenizer: ``transformers``' AutoTokenizer and pipelines load the
export and read text as attnkit reads it (the same special tokens, ids, chat prompts, greedy
tokens and masked-token predictions); attnkit reads the export, and older directories, back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

import attnkit
from attnkit.data.tokenizer import train_tokenizer
from attnkit.generation.fill_mask import fill_mask
from attnkit.generation.text import chat_prompt, prompt_ids

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

CORPUS = ["the cat sat on the mat and the dog ran in the park", "hello world, café 3.14 — naïve birds sang"] * 50
TEXTS = ["the cat sat", "", "  hello\tworld café", "the dog <mask> in </s> the park", "x"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat?"}]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may reach the network: every load is from a local directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def gpt() -> torch.nn.Module:
    """A tiny GPT of attnkit's own (<pad> 0, <s> 1, </s> 2) with a trained BPE tokenizer and a chat template."""
    cfg = attnkit.preset("gpt-tiny", vocab_size=400, max_len=64, bos_token_id=1, eos_token_id=2, init_std=0.5)
    torch.manual_seed(0)
    model = attnkit.build_model(cfg).eval()
    model.tokenizer = train_tokenizer(CORPUS, 400)
    model.chat_template = TEMPLATE
    return model


def test_gpt_export_tokenizes_chats_and_generates_as_attnkit(tmp_path: Path, gpt: torch.nn.Module) -> None:
    attnkit.export_hf(gpt, tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    spell = gpt.tokenizer.id_to_token
    assert (hf.bos_token, hf.eos_token, hf.pad_token, hf.unk_token) == (spell(1), spell(2), spell(0), "<unk>")
    assert hf.model_max_length == gpt.config.max_len == 64
    settings = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    specials = json.loads((tmp_path / "hf" / "special_tokens_map.json").read_text())
    assert specials == {name: settings[name] for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    for text in TEXTS:
        ids = hf(text).input_ids
        assert ids == prompt_ids(gpt.tokenizer, gpt.config, [text])[0], text  # <s> first, as attnkit prompts
        assert hf.decode(ids, skip_special_tokens=True) == gpt.tokenizer.decode(ids, skip_special_tokens=True)
        if "<" not in text:
            assert hf.decode(ids, skip_special_tokens=True) == text
    expected = chat_prompt(TEMPLATE, gpt.tokenizer, gpt.config, MESSAGES)
    assert hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False) == expected
    generator = transformers.pipeline("text-generation", model=str(tmp_path / "hf"))
    for text in TEXTS[:3]:
        prompt = prompt_ids(gpt.tokenizer, gpt.config, [text])[0]
        got = generator(text, do_sample=False, max_new_tokens=8, return_tensors=True)[0]["generated_token_ids"]
        assert got == gpt.generate(torch.tensor([prompt]), max_new_tokens=8)[0].tolist(), text
    # attnkit reads its export back: the same prompts (<s> not doubled) and chat template.
    back = attnkit.from_pretrained(tmp_path / "hf")
    assert back.chat_template == TEMPLATE
    assert prompt_ids(back.tokenizer, back.config, TEXTS) == prompt_ids(gpt.tokenizer, gpt.config, TEXTS)


def test_older_and_tokenizerless_directories(tmp_path: Path, gpt: torch.nn.Module) -> None:
    """A tokenizer_config.json holding only the chat template (as attnkit wrote it before) still
    gives the template; a model without a tokenizer writes no tokenizer files."""
    gpt.save_pretrained(tmp_path / "own")
    (tmp_path / "own" / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    (tmp_path / "own" / "special_tokens_map.json").unlink()
    old = attnkit.from_pretrained(tmp_path / "own")
    assert old.chat_template == TEMPLATE
    assert old.tokenizer.to_str() == gpt.tokenizer.to_str()
    bare = attnkit.build_model(gpt.config)
    attnkit.export_hf(bare, tmp_path / "bare")
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors",
    ]  # fmt: skip


def wordpiece() -> Tokenizer:
    """A lower-casing WordPiece tokenizer with BERT's [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4)."""
    from tokenizers.implementations import BertWordPieceTokenizer

    letters = "abcdefghijklmnopqrstuvwxyz"
    words = sorted(set(" ".join(CORPUS).replace(",", "").split()) - {"café", "naïve", "—", "3.14"})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters, *(f"##{c}" for c in letters), ".", ","]
    return BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, lowercase=True)._tokenizer


@pytest.mark.parametrize("vocabulary", ["wordpiece", "attnkit"])
def test_bert_export_fills_the_mask_as_attnkit(tmp_path: Path, vocabulary: str) -> None:
    """BERT's [CLS]/[SEP]/[MASK] vocabulary, and attnkit's own (<s> text </s>, <mask>, which its
    masked-LM objective adds and the export's tokenizer.json adds likewise)."""
    tokenizer = wordpiece() if vocabulary == "wordpiece" else train_tokenizer(CORPUS, 320)
    own = {} if vocabulary == "wordpiece" else {"bos_token_id": 1, "eos_token_id": 2}
    cfg = attnkit.preset(
        "bert-tiny", vocab_size=tokenizer.get_vocab_size(), max_len=64, init_std=0.5, pooler=False, **own
    )
    torch.manual_seed(0)
    model = attnkit.build_model(cfg).eval()
    model.tokenizer = tokenizer
    attnkit.export_hf(model, tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    names = ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if vocabulary == "wordpiece" else ("<s>", "</s>", "<mask>", "<pad>")
    assert (hf.cls_token, hf.sep_token, hf.mask_token, hf.pad_token) == names
    text = "The cat [MASK] on the mat."
    ours = fill_mask(model, tokenizer, text, top_k=3)[0][1]
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), top_k=3)
    theirs = [(guess["token_str"].strip(), guess["score"]) for guess in pipe(text.replace("[MASK]", hf.mask_token))]
    assert [token for token, _ in theirs] == [token for token, _ in ours]
    assert [p for _, p in theirs] == pytest.approx([p for _, p in ours], abs=1e-5)
    back = attnkit.from_pretrained(tmp_path / "hf")  # its tokenizer adds the specials: fill_mask adds none again
    assert fill_mask(back, back.tokenizer, text, top_k=3)[0][1] == ours


def test_smollm2_gguf_export_tokenizes_and_chats_as_attnkit(tmp_path: Path, smollm2_gguf: Path) -> None:
    from gguf import GGUFReader

    model = attnkit.from_pretrained(smollm2_gguf)
    attnkit.export_hf(model, tmp_path / "smollm2")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "smollm2")
    fields = GGUFReader(str(smollm2_gguf)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    bos, eos = (tokens[fields[f"tokenizer.ggml.{name}_token_id"].contents()] for name in ("bos", "eos"))
    assert (hf.bos_token, hf.eos_token) == (bos, eos) == ("<|im_start|>", "<|im_end|>")
    assert hf.model_max_length == model.config.max_len == 8192
    texts = ["The capital of France is", "Hello world! 12345 <|im_start|>user\nhi<|im_end|>", "  tabs\tand café 3.14"]
    for text in texts:
        assert hf(text).input_ids == prompt_ids(model.tokenizer, model.config, [text])[0], text
    conversation = [{"role": "system", "content": "Be brief."}, *MESSAGES[1:]]
    for messages in (MESSAGES[1:], conversation):
        expected = chat_prompt(model.chat_template, model.tokenizer, model.config, messages)
        rendered = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert rendered == expected
