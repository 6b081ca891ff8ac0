"""``attnkit generate``: continue prompts with a decoder-only model (GPT)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from attnkit.cli.common import (
    add_decoding_flags,
    add_grammar_flag,
    add_model_flag,
    add_weights_flag,
    compiles_so_far,
    decoding_options,
    emit,
    grammar_option,
    in_batches,
    input_lines,
    load_for,
    one_line,
    parse_ids,
    report_compiles,
    say_choice,
    streamed,
    tokenizer_of,
)

# Where neither a flag nor the checkpoint's generation_config.json says: greedy, 50 tokens.
DEFAULTS = dict(max_new_tokens=50, num_beams=1, length_penalty=0.0, length_penalty_style="gnmt")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="continue prompts with a decoder-only model (GPT), or answer them with a text-to-text one (T5)",
        description="Continue each prompt with a decoder-only model; print one line per prompt, in input order:\n"
        "the prompt and its continuation (only the continuation with --only-new), decoded with the\n"
        "directory's tokenizer.json, special tokens skipped, newlines inside a text written as \\n.\n"
        "Prompts come from --prompt, else --input FILE, else standard input, one per line; each batch\n"
        "is printed as soon as it is decoded (--batch-size 1 answers line by line). With --ids the\n"
        "prompts and the output are token ids. An empty prompt starts from the model's bos_token_id.\n"
        "Greedy by default; --num-beams N for beam search, --do-sample to sample.\n"
        "An encoder-decoder model (T5 trained on prefixed tasks) answers each prompt as a source: only\n"
        'the answer is printed (attnkit generate --model RUN "modernize: Thou shalt not kill").',
        epilog="examples:\n"
        '  attnkit generate --model ./gpt2 --prompt "Attention is" --max-new-tokens 20\n'
        "  attnkit generate --model ./gpt2 --do-sample --top-p 0.9 --seed 0 < prompts.txt\n"
        '  attnkit generate --model ./gpt2 --ids "464 3241 318" --only-new\n'
        '  attnkit generate --model SmolLM2.gguf --json-schema person.json --only-new "A person, as JSON:"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(parser)
    add_weights_flag(parser)
    parser.add_argument("text", nargs="*", metavar="TEXT", help="prompts (the same as --prompt TEXT for each)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeat for several)")
    source.add_argument("--ids", action="append", metavar='"ID ID ..."', help="a prompt as token ids (repeatable)")
    source.add_argument("--input", metavar="FILE", help="prompts, one per line (default: standard input)")
    parser.add_argument("--only-new", action="store_true", help="print only the continuation, not the prompt")
    add_decoding_flags(parser, DEFAULTS)
    add_grammar_flag(parser)
    parser.set_defaults(run=run)


# The command's steps in the order it runs them (load, grammar, prompts, decode, print); each
# step is a call into the library, the length is their sequence and their one-line errors.
def run(args: argparse.Namespace) -> int:

    from attnkit.data.padding import pad_left
    from attnkit.generation.text import prompt_ids, until_eos

    model = load_for(args.model, "generate", args.weights)
    grammar = grammar_option(args, model)
    since = compiles_so_far()
    cfg = model.config
    options = decoding_options(args, model, DEFAULTS, **grammar)
    eos = cfg.eos_token_id if args.eos_id is None else args.eos_id
    ends = options.end_tokens(cfg.eos_token_id)  # the checkpoint's generation_config.json may list several
    pad = cfg.pad_token_id if args.pad_id is None else args.pad_id
    if args.text and (args.prompt is not None or args.ids is not None or args.input is not None):
        raise ValueError("give the prompts one way: TEXT arguments, --prompt, --ids or --input")
    prompts_given = args.prompt if args.prompt is not None else args.text or None
    if cfg.is_encoder_decoder:  # text to text (T5): each prompt is a source, the answer is printed
        if args.ids is not None:
            raise ValueError("--ids gives decoder-only prompts; an encoder-decoder model reads text prompts")
        from attnkit.cli.translate import translate_lines

        tokenizer = tokenizer_of(model, args.model, ids_hint=False)
        texts = input_lines(args, prompts_given)
        for lines in translate_lines(model, tokenizer, texts, options, args.batch_size, args.seed,
                                     streamed(args, prompts_given), eos, pad):  # fmt: skip
            emit(lines)
        say_choice(model)
        report_compiles(since)
        return 0
    tokenizer = None
    if args.ids is not None:
        inputs: Iterable = [parse_ids(text) for text in args.ids]
    else:
        tokenizer = tokenizer_of(model, args.model, ids_hint=True)
        inputs = input_lines(args, prompts_given)
    for index, batch in enumerate(in_batches(inputs, args.batch_size)):
        prompts = batch if tokenizer is None else prompt_ids(tokenizer, cfg, batch, index * args.batch_size + 1)
        for n, prompt in enumerate(prompts):  # an empty --ids prompt
            if not prompt:
                if cfg.bos_token_id is None:
                    raise ValueError(
                        f"prompt {index * args.batch_size + n + 1} is empty and the model has no bos_token_id "
                        "to start from; give it some text"
                    )
                prompt.append(cfg.bos_token_id)
        ids, mask = pad_left(prompts, pad)  # every prompt ends at the last column, width
        width = ids.shape[1]
        seed = None if args.seed is None else args.seed + index
        out = model.generate(ids, mask, options=options.but(seed=seed))
        lines = []
        for row, prompt in enumerate(prompts):
            new = until_eos(out[row, width:].tolist(), ends)
            if grammar and len(new) == out.shape[1] - width:  # no end token: cut before it was complete
                number, cap = index * args.batch_size + row + 1, out.shape[1] - width
                print(f"attnkit: warning: output {number} was cut at --max-new-tokens {cap} before its JSON was "
                      "complete; it is not valid", file=sys.stderr)  # fmt: skip
            tokens = new if args.only_new else prompt + new
            if tokenizer is None:
                lines.append(" ".join(map(str, tokens)))
            else:
                lines.append(one_line(tokenizer.decode(tokens, skip_special_tokens=True)))
        emit(lines)
    say_choice(model)
    report_compiles(since)
    return 0
