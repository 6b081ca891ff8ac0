"""``attnkit chat``: talk to a decoder-only model through its chat template, the reply streamed."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli.common import (
    FLAGS,
    add_compile_flag,
    add_grammar_flag,
    add_model_flag,
    add_weights_flag,
    compile_option,
    compiles_so_far,
    grammar_option,
    input_lines,
    load_for,
    report_compiles,
    say_choice,
    tokenizer_of,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="talk to a decoder-only model through its chat template, the reply streamed",
        description="Chat with a decoder-only model whose directory has a chat template (tokenizer_config.json's\n"
        "chat_template, or the GGUF file's, kept by attnkit convert). Each message (--message, else one\n"
        "per line of standard input) joins the conversation; the template renders it with the\n"
        "assistant's turn opened, and the reply is printed token by token as it is decoded, up to the\n"
        "end token or --max-new-tokens. Greedy by default; --do-sample to sample.",
        epilog="examples:\n"
        '  attnkit chat --model runs/smollm2 --message "What is the capital of France?"\n'
        "  attnkit chat --model runs/smollm2 --weights int8          # one message per line, Ctrl-D ends\n"
        "  attnkit chat --model runs/smollm2 --weights gguf --compile  # compiles at the first reply, not when it pays",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(parser)
    add_weights_flag(parser)
    parser.add_argument("--message", action="append", metavar="TEXT", help="a user message (repeat for several)")
    parser.add_argument("--system", metavar="TEXT", help="a system message to start the conversation with")
    parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="reply length cap (256)")
    parser.add_argument("--do-sample", action="store_true", help="sample the reply instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    add_grammar_flag(parser)
    add_compile_flag(parser, "a long conversation (a cache size holds several replies)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnkit.generation.options import DecodingOptions
    from attnkit.generation.text import TextStream, chat_prompt, until_eos

    model = load_for(args.model, "generate", args.weights)
    grammar = grammar_option(args, model)
    template = getattr(model, "chat_template", None)
    if not template:
        raise ValueError(
            f"{args.model} has no chat template (tokenizer_config.json's chat_template); use attnkit generate"
        )
    sampling = dict(temperature=args.temperature, top_p=args.top_p) if args.do_sample else {}
    options = DecodingOptions.named(
        FLAGS, model.generation_defaults, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
        compile=compile_option(args), **sampling, **grammar,
    )  # fmt: skip
    tokenizer = tokenizer_of(model, args.model, ids_hint=False)
    cfg = model.config
    ends = options.end_tokens(cfg.eos_token_id)  # the checkpoint's generation_config.json may list several
    messages = [{"role": "system", "content": args.system}] if args.system else []
    room, compiled = cfg.max_len, compiles_so_far()
    for number, text in enumerate(input_lines(args, args.message)):
        messages.append({"role": "user", "content": text})
        prompt = chat_prompt(template, tokenizer, cfg, messages)
        new_tokens = min(args.max_new_tokens, room - len(prompt))
        if new_tokens < 1:
            raise ValueError(f"the conversation ({len(prompt)} tokens) fills the model's context of {room}")
        reply = TextStream(tokenizer)

        def stream(tokens: torch.Tensor, reply: TextStream = reply) -> None:
            token = int(tokens[0])
            if token not in ends:
                sys.stdout.write(reply.push(token))
                sys.stdout.flush()

        seed = None if args.seed is None else args.seed + number
        turn = options.but(max_new_tokens=new_tokens, seed=seed)
        out = model.generate(torch.tensor([prompt]), streamer=stream, options=turn)
        print(reply.finish(), flush=True)
        new = out[0, len(prompt) :].tolist()
        if grammar and until_eos(new, ends) == new:  # no end token: cut before it was complete
            print(f"attnkit: warning: the reply was cut at {new_tokens} tokens before its JSON was complete; it is "
                  "not valid", file=sys.stderr)  # fmt: skip
        say_choice(model)
        compiled = report_compiles(compiled)
        messages.append({"role": "assistant", "content": reply.text})
    return 0
