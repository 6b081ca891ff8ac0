"""``python -m benchmarks grammars``: the grammar engines attnkit could constrain decoding with,
side by side on SmolLM2's tokenizer (49,152 tokens) and the committed schema set
(benchmarks/schemas.json): which schemas each compiles, the seconds a schema's first compile
takes, and the microseconds of a next-token mask along a path of 64 tokens (each step the
allowed token a fixed random score ranks first, so every engine walks a path it accepts). Then
SmolLM2-135M-Instruct answering each schema's prompt with the schema as a grammar and without,
greedy and sampled: how many answers are valid, and the tokens/s of each (:func:`validity`); and
``attnkit serve`` under 32 concurrent requests with the schemas and without (:func:`under_load`),
and the continuous batch's step at 32 rows with the masks and without (:func:`step_cost`).

Engines: llguidance, xgrammar and outlines-core, each measured where it is installed
(``pip install llguidance xgrammar outlines-core``); one that is not is reported as such. The
result (``benchmarks/results/grammars.json``) is what attnkit's choice of llguidance rests on
(docs/serving.md)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnkit.generation.grammar import unpack
from benchmarks.common import machine, smollm2_path

SCHEMAS = Path(__file__).with_name("schemas.json")
RESULTS = Path(__file__).with_name("results") / "grammars.json"
STEPS = 64  # mask computations measured per schema
ENGINES = ("llguidance", "xgrammar", "outlines_core")

# An engine: (tokenizer json, eos id, vocab size) -> per schema a matcher factory; a matcher is
# (allowed() -> bool tensor (V,), advance(token) -> None).
Matcher = tuple[Callable[[], torch.Tensor], Callable[[int], None]]


def _llguidance(tok_json: str, eos: int, vocab: int) -> Callable[[dict], Matcher]:
    import llguidance
    import llguidance.torch as llt

    tokenizer = llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=eos)

    def compile_schema(schema: dict) -> Matcher:
        matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema))
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        bits = llt.allocate_token_bitmask(1, vocab)

        def allowed() -> torch.Tensor:
            llt.fill_next_token_bitmask(matcher, bits)
            return unpack(bits, vocab)[0]

        return allowed, lambda t: _check(matcher.consume_token(t), t)

    return compile_schema


def _xgrammar(tok_json: str, eos: int, vocab: int) -> Callable[[dict], Matcher]:
    import xgrammar as xgr
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok_json))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos]))

    def compile_schema(schema: dict) -> Matcher:
        matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)))
        bits = xgr.allocate_token_bitmask(1, vocab)

        def allowed() -> torch.Tensor:
            matcher.fill_next_token_bitmask(bits)
            return unpack(bits, vocab)[0]

        return allowed, lambda t: _check(matcher.accept_token(t), t)

    return compile_schema


def _outlines_core(tok_json: str, eos: int, vocab: int) -> Callable[[dict], Matcher]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core import json_schema as oj

    byte_of = _byte_decoder()
    pieces: dict[bytes, list[int]] = {}
    for piece, i in json.loads(tok_json)["model"]["vocab"].items():
        if i != eos and all(c in byte_of for c in piece):
            pieces.setdefault(bytes(byte_of[c] for c in piece), []).append(i)
    vocabulary = Vocabulary(eos, pieces)

    def compile_schema(schema: dict) -> Matcher:
        guide = Guide(Index(oj.build_regex_from_schema(json.dumps(schema)), vocabulary))

        def allowed() -> torch.Tensor:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[torch.tensor(guide.get_tokens(), dtype=torch.long)] = True
            return mask

        return allowed, lambda t: guide.advance(t)

    return compile_schema


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character a BPE piece spells each byte with."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(visible), 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, chars, strict=True)}


def _check(accepted: bool, token: int) -> None:
    if not accepted:
        raise ValueError(f"the engine refused token {token}, which its own mask allowed")


BUILDERS = {"llguidance": _llguidance, "xgrammar": _xgrammar, "outlines_core": _outlines_core}


def walk(matcher: Matcher, eos: int, scores: torch.Tensor) -> list[float]:
    """Seconds of each mask along a path of at most :data:`STEPS` tokens (the end token ends it)."""
    allowed, advance = matcher
    seconds = []
    for step in range(STEPS):
        start = time.perf_counter()
        mask = allowed()
        seconds.append(time.perf_counter() - start)
        if not mask.any():
            raise ValueError(f"no token allowed at step {step}")
        token = int(scores[step].masked_fill(~mask, float("-inf")).argmax())
        if token == eos:
            break
        advance(token)
    return seconds


def engine(name: str, tok_json: str, eos: int, vocab: int, schemas: list[dict]) -> dict[str, Any]:
    """One engine over every schema: set-up seconds, per schema its compile seconds and mask
    microseconds (median), or the error it gave."""
    start = time.perf_counter()
    compile_schema = BUILDERS[name](tok_json, eos, vocab)
    out: dict[str, Any] = {"setup_s": time.perf_counter() - start, "schemas": {}}
    scores = torch.randn(STEPS, vocab, generator=torch.Generator().manual_seed(0))
    for entry in schemas:
        try:
            start = time.perf_counter()
            matcher = compile_schema(entry["schema"])
            compiled = time.perf_counter() - start
            masks = walk(matcher, eos, scores)
        except Exception as e:  # an engine's refusal of a schema is a result, whatever its type
            out["schemas"][entry["name"]] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        out["schemas"][entry["name"]] = {"compile_s": compiled, "mask_us": 1e6 * statistics.median(masks),
                                         "mask_us_max": 1e6 * max(masks), "steps": len(masks)}  # fmt: skip
    return out


NEW_TOKENS = 160  # an answer's cap: an output cut by it is not valid


def ask(entry: dict[str, Any]) -> list[dict[str, str]]:
    """The chat message of one schema: its prompt and the schema, as a client would send them."""
    return [{"role": "user", "content": f"{entry['prompt']} Answer with JSON only, valid against this JSON schema: "
                                        f"{json.dumps(entry['schema'])}"}]  # fmt: skip


def validity(model: Any, schemas: list[dict], new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    """SmolLM2 answering every schema's prompt through its chat template, greedy and sampled
    (seed 0), with the schema as a grammar, with it :func:`~attnkit.generation.grammar.bounded`,
    and without (at most :data:`NEW_TOKENS`): per mode
    each answer's validity (jsonschema), whether it ended, its tokens and seconds; and, side by
    side per schema, the seconds of the schema's answer against the same number of tokens
    decoded free (its end token never taken), and of a first token with the schema new (its
    compile cache emptied) against none. Eager, batch 1."""
    import jsonschema

    from attnkit.generation import grammar as grammars
    from attnkit.generation.text import chat_prompt

    out: dict[str, Any] = {"speed": []}
    checker = jsonschema.FormatChecker()
    eos, never = model.config.eos_token_id, model.config.vocab_size - 1  # a token SmolLM2 does not write

    def timed(ids: list[int], **options: Any) -> tuple[list[int], float]:
        start = time.perf_counter()
        got = model.generate(torch.tensor([ids]), compile=False, **options)
        return got[0, len(ids) :].tolist(), time.perf_counter() - start

    for mode, options in {"greedy": {}, "sampled": {"do_sample": True, "seed": 0}}.items():
        for constrained in ("schema", "no schema", "bounded schema"):
            rows = []
            for entry in schemas:
                ids = chat_prompt(model.chat_template, model.tokenizer, model.config, ask(entry))
                grammar = {"schema": entry["schema"], "no schema": None,
                           "bounded schema": grammars.bounded(entry["schema"])}[constrained]  # fmt: skip
                new, seconds = timed(ids, max_new_tokens=new_tokens, grammar=grammar, **options)
                text = model.tokenizer.decode(new[: new.index(eos)] if eos in new else new, skip_special_tokens=True)
                try:
                    jsonschema.validate(json.loads(text), entry["schema"], format_checker=checker)
                    valid = True
                except (ValueError, jsonschema.ValidationError):
                    valid = False
                rows.append({"name": entry["name"], "valid": valid, "ended": eos in new, "tokens": len(new),
                             "seconds": seconds, "text": text[:300]})  # fmt: skip
                if constrained == "schema" and mode == "greedy":
                    _, free = timed(ids, max_new_tokens=len(new), eos_token_id=never, **options)
                    grammars._compiled.clear()
                    _, first = timed(ids, max_new_tokens=1, grammar=grammar)
                    _, first_free = timed(ids, max_new_tokens=1)
                    out["speed"].append({"name": entry["name"], "tokens": len(new), "schema_s": seconds,
                                         "free_s": free, "first_token_s": first,
                                         "first_token_free_s": first_free})  # fmt: skip
            out[f"{mode}, {constrained}"] = rows
    return out


LOAD_CLIENTS, LOAD_TOKENS = 32, 64  # concurrent chat requests, and each one's cap


async def _chats(url: str, bodies: list[dict[str, Any]], clients: int) -> tuple[int, float]:
    """``bodies`` posted to /v1/chat/completions by ``clients`` concurrent clients: the tokens
    generated and the seconds."""
    import httpx

    work, tokens = list(bodies), 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while work:
            answer = (await http.post("/v1/chat/completions", json=work.pop())).raise_for_status().json()
            tokens += answer["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return tokens, time.perf_counter() - started


def under_load(schemas: list[dict], clients: int = LOAD_CLIENTS, max_tokens: int = LOAD_TOKENS) -> dict[str, Any]:
    """``attnkit serve`` (SmolLM2, int8, its step eager) answering every schema's prompt twice
    over from 32 concurrent clients, greedy, with the schema as ``response_format`` and without,
    in turn, three rounds: the tokens and seconds of each."""
    from attnkit.serve.server import spawn

    def body(entry: dict[str, Any], constrained: bool) -> dict[str, Any]:
        fmt = {"type": "json_schema", "json_schema": {"name": entry["name"], "schema": entry["schema"]}}
        return {"messages": ask(entry), "max_tokens": max_tokens, "temperature": 0,
                **({"response_format": fmt} if constrained else {})}  # fmt: skip

    rounds: dict[str, list[tuple[int, float]]] = {"schema": [], "no schema": []}
    flags = ["--weights", "int8", "--max-batch", str(clients), "--no-compile"]
    with spawn(smollm2_path(), *flags, timeout=600) as (url, _, _):
        asyncio.run(_chats(url, [body(e, True) for e in schemas[:8]], 8))  # warm-up, each schema compiled once
        for _ in range(3):
            for name, constrained in (("schema", True), ("no schema", False)):
                bodies = [body(e, constrained) for e in schemas * 2]
                rounds[name].append(asyncio.run(_chats(url, bodies, clients)))
    return {"clients": clients, "max_tokens": max_tokens, "rounds": rounds}


STEP_ROWS, STEPS_TIMED = 32, 48


def step_cost(model: Any, schemas: list[dict], rows: int = STEP_ROWS, steps: int = STEPS_TIMED) -> dict[str, Any]:
    """The continuous batch's step at :data:`STEP_ROWS` rows (each a schema's chat prompt),
    every row with its grammar's mask and budget (:class:`~attnkit.generation.grammar.Follow`) and without,
    in turn, three rounds of :data:`STEPS_TIMED` steps: no row ends (no end token stops it), so
    both time the same work but the masks."""
    from attnkit.generation.continuous import ContinuousBatch, Request
    from attnkit.generation.grammar import Follow, compile_grammar
    from attnkit.generation.text import chat_prompt

    cfg, entries = model.config, (schemas * rows)[:rows]
    prompts = [chat_prompt(model.chat_template, model.tokenizer, cfg, ask(e)) for e in entries]
    grammars = [compile_grammar(e["schema"], model.tokenizer, cfg.vocab_size, [cfg.eos_token_id]) for e in entries]
    seconds: dict[str, list[float]] = {"schema": [], "no schema": []}
    for _ in range(3):
        for name in seconds:
            masked = name == "schema"
            batch = ContinuousBatch(model, compile=False)
            batch.add([Request(p, steps + 1, adjust=Follow(g, budget=steps + 1) if masked else None)
                       for p, g in zip(prompts, grammars, strict=True)])  # fmt: skip
            start = time.perf_counter()
            for _ in range(steps):
                batch.step()
            seconds[name].append(time.perf_counter() - start)
    return {"rows": rows, "steps": steps, "seconds": seconds}


def table(result: dict[str, Any]) -> str:
    rows = []
    for name, got in result["engines"].items():
        if "missing" in got:
            rows.append(f"| {name} | not installed | | | | |")
            continue
        ok = [s for s in got["schemas"].values() if "error" not in s]
        compiles = sorted(s["compile_s"] for s in ok)
        masks = [s["mask_us"] for s in ok]
        rows.append(f"| {name} {got['version']} | {len(ok)} of {len(got['schemas'])} | {got['setup_s']:.2f} | "
                    f"{1e3 * statistics.median(compiles):.1f} / {1e3 * compiles[-1]:.0f} | "
                    f"{statistics.median(masks):.0f} / {max(s['mask_us_max'] for s in ok):.0f} | "
                    f"{', '.join(k for k, s in got['schemas'].items() if 'error' in s) or '—'} |")  # fmt: skip
    answers = [f"| {mode} | {sum(r['valid'] for r in rows)} of {len(rows)} | {sum(r['ended'] for r in rows)} |"
               for mode, rows in result.get("validity", {}).items() if mode != "speed"]  # fmt: skip
    load = result.get("load")
    if load:
        rates = {name: [t / sec for t, sec in runs] for name, runs in load["rounds"].items()}
        answers_load = [f"{load['clients']} concurrent chat requests to attnkit serve (eager, greedy, at most "
                        f"{load['max_tokens']} tokens): {statistics.median(rates['schema']):.1f} tokens/s with the "
                        f"schemas, {statistics.median(rates['no schema']):.1f} without "
                        f"({statistics.median(rates['schema']) / statistics.median(rates['no schema']):.2f}x; "
                        "median of 3 rounds in turn)"]  # fmt: skip
    else:
        answers_load = []
    if "step" in result:
        step = result["step"]
        each = {name: 1e3 * statistics.median(runs) / step["steps"] for name, runs in step["seconds"].items()}
        answers_load.append(f"The continuous batch's step at {step['rows']} rows, no row ending: "
                            f"{each['schema']:.0f} ms with every row's mask, {each['no schema']:.0f} ms without "
                            f"({each['no schema'] / each['schema']:.2f}x the speed; median of 3 rounds in "
                            "turn)")  # fmt: skip
    speed = result.get("validity", {}).get("speed", [])
    if speed:
        tokens = sum(r["tokens"] for r in speed)
        schema_rate, free_rate = tokens / sum(r["schema_s"] for r in speed), tokens / sum(r["free_s"] for r in speed)
        late = [1e3 * (r["first_token_s"] - r["first_token_free_s"]) for r in speed]
        answers += ["", f"Greedy, the same {tokens} tokens: {schema_rate:.1f} tokens/s with the schemas, "
                    f"{free_rate:.1f} without ({schema_rate / free_rate:.2f}x); a first token with a new schema "
                    f"{statistics.median(late):+.0f} ms (median; max {max(late):+.0f}) from one without"]  # fmt: skip
    return "\n".join([
        *([f"SmolLM2-135M-Instruct (int8, eager, batch 1) answering each schema's prompt, at most "
           f"{result['new_tokens']} "
           "tokens", "", "| decoding | valid JSON | ended |", "|---|---|---|", *answers, ""]
          if answers else []),
        *([*answers_load, ""] if answers_load else []),
        f"Grammar engines on SmolLM2's tokenizer, {len(result['schemas'])} schemas ({result['machine']['cpu_class']})",
        "", "| engine | schemas compiled | set-up s | compile ms, median / max | mask µs, median / max | refused |",
        "|---|---|---|---|---|---|", *rows,
    ])  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks grammars", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--engines-only", action="store_true", help="leave out SmolLM2's answers (minutes)")
    parser.add_argument("--small", action="store_true", help="three schemas, a few tokens each (a check that it runs)")
    args = parser.parse_args(argv)
    import attnkit

    model = attnkit.from_pretrained(smollm2_path(), weights="int8")
    tok_json, eos, vocab = model.tokenizer.to_str(), model.config.eos_token_id, model.config.vocab_size
    schemas = json.loads(SCHEMAS.read_text(encoding="utf-8"))[: 3 if args.small else None]
    new_tokens = 12 if args.small else NEW_TOKENS
    result: dict[str, Any] = {"machine": machine(), "schemas": [s["name"] for s in schemas], "new_tokens": new_tokens,
                              "engines": {}}  # fmt: skip
    for name in ENGINES:
        if importlib.util.find_spec(name) is None:
            result["engines"][name] = {"missing": True}
            continue
        got = engine(name, tok_json, eos, vocab, schemas)
        result["engines"][name] = {"version": importlib.metadata.version(name.replace("_", "-")), **got}
        print(f"{name}: done", flush=True)
    if not args.engines_only:
        torch.set_num_threads(2)
        result["validity"] = validity(model, schemas, new_tokens)
        result["step"] = step_cost(model, schemas, *((4, 3) if args.small else ()))
        result["load"] = under_load(schemas, *((2, 8) if args.small else ()))
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(table(result))
    return 0
