"""The ``hybrid`` command.

``fit``, ``validate`` and ``test`` (Lightning's verbs) and ``generate`` are configured by Hydra from
``hybrid.configs``: they take overrides (``hybrid fit model=transformer trainer.max_epochs=3``),
``-m`` for a sweep, and Hydra's own flags (``hybrid fit --cfg job`` prints the composed config).
Each run writes its composed config to ``.hydra/`` in its output folder. ``bench`` and ``bench-bulk``
are Hydra commands too; ``export``, ``convert``, ``ablate`` and ``demo`` take ordinary flags.
Lightning is imported only by the verbs that train or evaluate, so ``generate``, ``export`` and
``demo`` need neither it nor its start-up time.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hybrid.generation.config import GenerationConfig
from hybrid.training.builders import build_module, build_trainer, model_config_from, resolve_ckpt_path
from hybrid.training.checkpoint import export_checkpoint, load_for_inference, read_checkpoint, write_checkpoint
from hybrid.training.examples import print_examples

if TYPE_CHECKING:
    from lightning import Trainer

    from hybrid.training import Seq2SeqDataModule

logger = logging.getLogger(__name__)

CONFIG_PATH = "pkg://hybrid.configs"  # the installed package, so the command works from any folder
# GenerationConfig options that hold Python objects or shape the return value, not the decoding.
NOT_ON_THE_COMMAND_LINE = frozenset({"decoder_input_ids", "logits_processor", "stopping_criteria", "streamer",
                                     "return_dict_in_generate", "output_scores", "generator"})
GENERATION_OPTIONS = frozenset(f.name for f in dataclasses.fields(GenerationConfig)) - NOT_ON_THE_COMMAND_LINE


# ----- fit, validate, test -------------------------------------------------------------


def run_fit(cfg: DictConfig) -> Trainer:
    """Train as ``cfg`` (the composed ``config.yaml``) says; returns the Trainer, which holds the module.

    ``ckpt_path`` resumes a run (``"last"``: this run name's newest ``last.ckpt``); ``init_from``
    starts from a checkpoint's weights with a fresh optimiser. Either way the checkpoint's model
    config and vocabulary are used, so the weights fit. Then, if asked, tests the best checkpoint
    (``test_after_fit``) and prints example predictions (``print_examples``).
    """
    lightning = _import_lightning()
    if cfg.ckpt_path and cfg.init_from:
        raise ValueError("give ckpt_path (resume a run) or init_from (start from its weights), not both")
    lightning.seed_everything(cfg.seed, workers=True)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data, _convert_="all")
    resume_from = resolve_ckpt_path(cfg)
    start = resume_from or cfg.init_from
    if start:
        trained = read_checkpoint(start)
        logger.info("the model config and vocabulary come from %s; model.* settings are not used", start)
        datamodule.tokenizer = trained.tokenizer
        model_config = trained.config
    else:
        model_config = model_config_from(cfg.model, datamodule.vocab_size)
    module = build_module(cfg, model_config, datamodule)
    if cfg.init_from:
        module.model.load_state_dict(trained.state_dict)
    trainer = build_trainer(cfg)
    if resume_from:
        logger.info("resuming %s from step %d", resume_from, trained.global_step)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if cfg.test_after_fit:
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        trainer.test(module, datamodule=datamodule, ckpt_path=best or None)
    if cfg.print_examples and trainer.is_global_zero:
        print_examples(module.model, datamodule, cfg.print_examples)
    return trainer


def run_validate(cfg: DictConfig) -> list[dict[str, float]]:
    """Score the checkpoint ``cfg.ckpt_path`` on the validation split of ``cfg.data``."""
    return _evaluate(cfg, "validate")


def run_test(cfg: DictConfig) -> list[dict[str, float]]:
    """Score the checkpoint ``cfg.ckpt_path`` on the test split of ``cfg.data``."""
    return _evaluate(cfg, "test")


def _evaluate(cfg: DictConfig, verb: str) -> list[dict[str, float]]:
    lightning = _import_lightning()
    path = resolve_ckpt_path(cfg)
    if not path:
        raise ValueError(f"hybrid {verb} needs ckpt_path=<checkpoint> (or ckpt_path=last), with the data "
                         "(or experiment) the model was trained on")
    lightning.seed_everything(cfg.seed, workers=True)
    trained = read_checkpoint(path)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data, _convert_="all")
    datamodule.tokenizer = trained.tokenizer  # the ids the model was trained with
    module = build_module(cfg, trained.config, datamodule)
    module.model.load_state_dict(trained.state_dict)
    trainer = build_trainer(cfg)
    results = getattr(trainer, verb)(module, datamodule=datamodule)
    if cfg.print_examples and trainer.is_global_zero:
        print_examples(module.model, datamodule, cfg.print_examples)
    return results


def _import_lightning() -> ModuleType:
    import lightning

    # `import lightning` gives its logger a console handler of its own, yet its records also reach
    # the root logger that Hydra set up: without this, each line would print twice.
    if logging.getLogger().hasHandlers():
        for handler in list(logging.getLogger("lightning").handlers):
            logging.getLogger("lightning").removeHandler(handler)
    return lightning


# ----- generate --------------------------------------------------------------------------


def run_generate(cfg: DictConfig) -> bool:
    """Decode every source of ``cfg.input`` (a file, or standard input) into ``cfg.output`` (a file, or
    standard output), one line per source in input order, as a bulk job (:mod:`hybrid.inference`):
    bucketed, batched by a token budget, refilled, resumable, split by ``shard=i/n`` or over DDP ranks
    (``strategy=ddp devices=N``). Returns whether the output is complete."""
    from hybrid.inference import BulkJob, run_bulk, run_bulk_ddp

    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    model, tokenizer = load_for_inference(cfg.ckpt_path, device)
    job = BulkJob(generation=OmegaConf.to_container(cfg.generation, resolve=True), max_tokens=cfg.max_tokens,
                  max_batch_size=cfg.batch_size, window=cfg.window, refill=cfg.refill, shard_size=cfg.shard_size,
                  seed=cfg.seed)
    options = dict(input_format=cfg.input_format, shard=cfg.shard, work_dir=cfg.work_dir,
                   keep_shards=cfg.keep_shards, progress=cfg.progress,
                   fingerprint={"ckpt_path": str(Path(cfg.ckpt_path).resolve())})
    if cfg.strategy is None:
        return run_bulk(model, tokenizer, cfg.input, cfg.output, job, resume=cfg.resume, **options)
    if not cfg.resume:
        raise ValueError("resume=false would let every rank empty the work folder: delete it before the run")
    trainer = dict(strategy=cfg.strategy, devices=cfg.devices, num_nodes=cfg.num_nodes,
                   accelerator="cpu" if torch.device(device).type == "cpu" else "gpu")
    return run_bulk_ddp(model, tokenizer, cfg.input, cfg.output, job, trainer, **options)


# ----- bench, export and demo --------------------------------------------------------------


def run_bench(cfg: DictConfig) -> Path:
    """Time decoding of every contender over the grid of ``cfg`` (the composed ``bench.yaml``)."""
    from hybrid.bench.command import run_bench as run

    return run(cfg)


def run_bench_bulk(cfg: DictConfig) -> Path:
    """Time a bulk job decoded five ways, LSTM and attention decoders (the composed ``bench_bulk.yaml``)."""
    from hybrid.bench.bulk import run_bench_bulk as run

    return run(cfg)


def export(args: argparse.Namespace) -> None:
    """Write a checkpoint's model and tokenizer to a folder that loads without Lightning or Hydra."""
    directory = export_checkpoint(args.checkpoint, args.directory)
    print(f"wrote {directory}: load it with Seq2Seq.from_pretrained and Seq2SeqTokenizer.load")


def demo(args: argparse.Namespace) -> None:
    """Build one small random model per decoder kind and time greedy decoding of each, side by side."""
    from hybrid.bench.demo import demo as run

    run(batch_size=args.batch_size, source_length=args.source_length, max_new_tokens=args.max_new_tokens,
        d_model=args.d_model, n_heads=args.n_heads, vocab_size=args.vocab_size, repeats=args.repeats,
        threads=args.threads, seed=args.seed, uncached=args.uncached)


# ----- convert and ablate ----------------------------------------------------------------


def convert_checkpoint(args: argparse.Namespace) -> None:
    """Swap the decoder mixers of a trained model for ``args.pattern`` and write a checkpoint that
    ``hybrid fit init_from=...`` fine-tunes; prints what was copied and what is new."""
    from hybrid.convert import convert, summary

    source = Path(args.source)
    trained = None if source.is_dir() else read_checkpoint(source)
    model, tokenizer = load_for_inference(source) if trained is None else (trained.build(), trained.tokenizer)
    converted, fresh = convert(model, args.pattern, lstm_hidden_size=args.lstm_hidden_size, seed=args.seed)
    if trained is not None:  # so a table of runs can count the source's training steps too
        converted.config.extra["converted_at_step"] = trained.global_step
    write_checkpoint(converted, tokenizer, args.output)
    print(summary(model, converted, fresh))
    print(f"wrote {args.output}: fine-tune with hybrid fit init_from={args.output} (add "
          "callbacks.freeze_copied_weights.steps=K to train only the new mixers for the first K steps)")


def ablate(args: argparse.Namespace) -> None:
    """Gather the runs under ``args.runs`` into a table (Markdown and CSV) and a Pareto plot."""
    from hybrid.ablation import run_ablate

    run_ablate(args)


def add_convert_and_ablate(commands: argparse._SubParsersAction) -> None:
    """Register ``hybrid convert`` and ``hybrid ablate`` (ordinary flags, no Hydra) on ``commands``."""
    command = commands.add_parser("convert", help="swap decoder mixers of a trained model (e.g. attention for "
                                                  "lstm), keep every other weight, write a checkpoint to fine-tune")
    command.add_argument("source", help="a .ckpt file written by hybrid fit, or a folder written by hybrid export")
    command.add_argument("pattern", help="mixers per decoder layer: 'lstm', 'lstm,lstm,attention' or "
                                         "'0-2:lstm,3:attention'")
    command.add_argument("output", help="the .ckpt file to write")
    command.add_argument("--lstm-hidden-size", type=int, default=None, help="width of new LSTM mixers "
                                                                            "(default: the source's)")
    command.add_argument("--seed", type=int, default=0, help="seeds the new mixers' initial weights")
    command.set_defaults(run=convert_checkpoint)
    command = commands.add_parser("ablate", help="gather hybrid fit runs into a table of test metrics, size, "
                                                 "training speed and decoding speed, and a Pareto plot")
    command.add_argument("runs", nargs="+", help="run folders, or folders to search (e.g. outputs)")
    command.add_argument("--out", default="results/ablations", help="where to write the table and the plot")
    command.add_argument("--batch-size", type=int, default=8, help="decoding speed: sources per batch")
    command.add_argument("--new-tokens", type=int, default=128, help="decoding speed: tokens per source")
    command.add_argument("--source-length", type=int, default=16)
    command.add_argument("--repeats", type=int, default=5)
    command.add_argument("--threads", type=int, default=1, help="torch threads while timing decoding")
    command.set_defaults(run=ablate)


# ----- the command line ------------------------------------------------------------------

HYDRA_COMMANDS: dict[str, tuple[str, Callable[[DictConfig], Any], str]] = {
    "fit": ("config", run_fit, "train: hybrid fit [experiment=NAME] [model=transformer] [trainer.max_epochs=N]"),
    "validate": ("config", run_validate, "score a checkpoint on the validation split: hybrid validate ckpt_path=..."),
    "test": ("config", run_test, "score a checkpoint on the test split: hybrid test ckpt_path=..."),
    "generate": ("generate", run_generate,
                 "decode lines: hybrid generate ckpt_path=... input=words.txt output=preds.txt num_beams=4"),
    "bench": ("bench", run_bench, "time decoding per token: hybrid bench [bench=tiny] [device=cuda dtype=bfloat16]"),
    "bench-bulk": ("bench_bulk", run_bench_bulk,
                   "time bulk decoding, bucketed and refilled or not: hybrid bench-bulk [g2p.limit=N]"),
}


def run_hydra_command(command: str, overrides: Sequence[str]) -> None:
    """Run ``hybrid <command> <overrides>`` through ``hydra.main`` (run folder, logging, ``-m`` sweeps)."""
    config_name, run, _ = HYDRA_COMMANDS[command]
    if command == "generate":
        overrides = [qualify_generation_option(override) for override in overrides]
    command_line = [sys.argv[0], command, *overrides]
    os.environ["HYBRID_COMMAND"] = command  # hydra.job.name, so the run's log file is <command>.log

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=config_name)
    def task(cfg: DictConfig) -> Any:
        # Lightning's DDP launcher starts each worker by rerunning sys.argv, which must name the verb.
        sys.argv = command_line
        return run(cfg)

    saved = sys.argv
    sys.argv = [sys.argv[0], *overrides]  # where hydra.main reads its overrides
    try:
        task()
    finally:
        sys.argv = saved


def qualify_generation_option(override: str) -> str:
    """``num_beams=4`` -> ``generation.num_beams=4``: generation options may be given without their node."""
    match = re.fullmatch(r"([+~]{0,2})(\w+)(=.*)?", override, flags=re.S)
    if match and match.group(2) in GENERATION_OPTIONS:
        prefix, key, rest = match.groups()
        return f"{prefix}generation.{key}{rest or ''}"
    return override


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybrid", description="Transformer encoder + LSTM decoder: train, decode, export, benchmark.",
        epilog="fit, validate, test and generate take Hydra overrides (KEY=VALUE, -m for a sweep, --help for "
               "Hydra's help); the configs are in the hybrid.configs package (configs/ in the repository).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, _, description) in HYDRA_COMMANDS.items():
        commands.add_parser(name, help=description, add_help=False)  # main() hands these to Hydra first
    command = commands.add_parser("export", help="write a checkpoint as a folder that Seq2Seq.from_pretrained "
                                                 "and Seq2SeqTokenizer.load read, without Lightning or Hydra")
    command.add_argument("checkpoint", help="a .ckpt file written by hybrid fit")
    command.add_argument("directory", help="the folder to write (created if needed)")
    command.set_defaults(run=export)
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
    add_convert_and_ablate(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``hybrid`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HYDRA_COMMANDS:
        run_hydra_command(argv[0], argv[1:])
        return
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return
    args.run(args)


if __name__ == "__main__":
    main()
