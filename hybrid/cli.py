"""The ``hybrid`` command line."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from hybrid.config import ModelConfig
from hybrid.model import Seq2Seq


def demo(args: argparse.Namespace) -> None:
    """Build one small random model per decoder kind and time greedy decoding of each, side by side."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    src = torch.randint(3, args.vocab_size, (args.batch_size, args.source_length))
    print(f"batch {args.batch_size}, source length {args.source_length}, up to {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, median of {args.repeats} runs after a warm-up")
    rows = [("lstm decoder", "lstm", True), ("attention decoder, KV cache", "attention", True)]
    if args.uncached:
        rows.append(("attention decoder, no cache", "attention", False))
    for label, mixers, use_cache in rows:
        config = ModelConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_heads=args.n_heads,
                             d_ff=4 * args.d_model, decoder_mixers=mixers, dropout=0.0)
        model = Seq2Seq(config).eval()
        model.generate(src, max_new_tokens=args.max_new_tokens, use_cache=use_cache)  # warm-up
        timings = []
        for _ in range(args.repeats):
            begin = time.perf_counter()
            out = model.generate(src, max_new_tokens=args.max_new_tokens, use_cache=use_cache)
            timings.append((time.perf_counter() - begin) / out.shape[1])
        print(f"  {label:<30} {1000 * statistics.median(timings):7.3f} ms/token "
              f"({out.shape[1]} steps, {model.num_parameters():,} parameters)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybrid", description="Transformer encoder + LSTM decoder: train, decode, benchmark.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    command = commands.add_parser("demo", help="time greedy decoding of small random LSTM and attention decoders")
    command.add_argument("--batch-size", type=int, default=1)
    command.add_argument("--source-length", type=int, default=32)
    command.add_argument("--max-new-tokens", type=int, default=256)
    command.add_argument("--d-model", type=int, default=256)
    command.add_argument("--n-heads", type=int, default=4)
    command.add_argument("--vocab-size", type=int, default=128)
    command.add_argument("--repeats", type=int, default=3)
    command.add_argument("--threads", type=int, default=torch.get_num_threads())
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--uncached", action="store_true",
                         help="also time the crude loop that reruns the decoder over the whole prefix (slow)")
    command.set_defaults(run=demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``hybrid`` console script."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return
    args.run(args)


if __name__ == "__main__":
    main()
