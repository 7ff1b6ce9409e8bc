"""The students table (issue 29): the imported teacher's decoder self-attention swapped for each constant-state
mixer, then trained three ways at equal total steps on a user's small data, and scored on the whole G2P test split.

The user's data is what a user fine-tuning a pretrained model usually has: far less than the model was trained
on. Here it is ``--user-words`` words drawn (seed 0, the same for every run) from the teacher's own training
split, with their references, in ``work/students/user_data.tsv``; every run trains on it (``data.train_path``),
and validation and test stay the dictionary's own words. (With the teacher's whole training split instead, a
student simply continues the training of this teacher, which stopped before the end of its first epoch: the
two plain runs kept in ``work/students-fulldata/`` beat it, PER 0.167 against 0.194.)

For each mixer and way (and seed), in ``work/students/<mixer>-<way>-seed<seed>/``:

1. ``hybrid convert ckpt_path=work/imported pattern=<mixer> seed=<seed>``: every weight but the new mixers is the
   teacher's, bit for bit (for t2r and performer their Q/K/V/O too);
2. the way, ``--steps`` optimiser steps in all, batches of 64 words, as the teacher's training:
   - ``converted``: none, the converted model as it is (what a swap keeps before any training: for
     performer, whose random features estimate the softmax it replaces, the issue asks for it);
   - ``plain``: fine-tuning, cross-entropy to the references for every step;
   - ``transfer``: mixer transfer for ``--transfer-steps`` (each new mixer learns to give the teacher's
     self-attention output on the teacher's own input to it, MSE, every other weight frozen:
     ``module.distill.match=mixers``), then fine-tuning for the rest;
   - ``distil``: the same mixer transfer, then token-level knowledge distillation for the rest
     (``module.distill.match=logits``: (1 - alpha) x cross-entropy + alpha x T^2 x KL to the teacher);
   - ``seqkd``: the same mixer transfer, then fine-tuning on the teacher's own outputs for the user's words
     (sequence-level knowledge distillation: ``hybrid distill-data`` with the teacher's defaults, 4 beams,
     writes ``work/students/teacher_outputs.tsv`` once);
3. the final weights greedy-decode every test word (batch 64, at most 63 new tokens, the teacher's generation
   options: ``bad_words_ids`` = pad, ``forced_eos_token_id``), scored with hybrid test's PER and WER.

Each run writes ``result.json``, and a run with one is not run again (the table resumes). ``--jobs`` runs go
side by side, each on one thread. Then ``students.json`` and ``students.md``: PER, WER, the fraction of the
teacher's quality kept (the teacher's greedy PER over the student's), parameters, decoding-state bytes per
sequence at the teacher's 64 positions:

    python results/hf-import/students.py --seeds 0 --jobs 2
    python results/hf-import/students.py --best-way-seeds 1 2 --jobs 2   # more seeds for each mixer's best way
    python results/hf-import/students.py --best-checkpoints   # bench_engines.py's --student options for them
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
STUDENTS = WORK / "students"
# "attention" is the control: the teacher itself (nothing swapped) fine-tuned as the students are ("plain"), so
# the table separates what a swap costs from what these steps alone give this teacher.
MIXERS = ("attention", "lstm", "ssru", "aan", "t2r", "performer")
WAYS = ("converted", "plain", "transfer", "distil", "seqkd")
MAX_NEW_TOKENS = 63  # the teacher's max_length 64 less the decoder start
USER_DATA = STUDENTS / "user_data.tsv"
TEACHER_OUTPUTS = STUDENTS / "teacher_outputs.tsv"


def prepare_data(args: argparse.Namespace) -> None:
    """The user's words (a seeded sample of the teacher's training split) and the teacher's outputs for them."""
    import random

    from hybrid.training.data import G2PDataModule

    STUDENTS.mkdir(parents=True, exist_ok=True)
    if not USER_DATA.is_file():
        train = G2PDataModule()._load_pairs()["train"]
        chosen = random.Random(0).sample(train, args.user_words)
        USER_DATA.write_text("".join(f"{word}\t{phonemes}\n" for word, phonemes in chosen))
    if "seqkd" in args.ways and not TEACHER_OUTPUTS.is_file():
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        subprocess.run(["hybrid", "distill-data", f"ckpt_path={args.imported}", "data=g2p",
                        f"data.train_path={USER_DATA}", f"output={TEACHER_OUTPUTS}", f"max_new_tokens={MAX_NEW_TOKENS}",
                        "progress=false", f"hydra.run.dir={STUDENTS}/distill-data"], check=True, env=env)


def run_one(mixer: str, way: str, seed: int, args: argparse.Namespace) -> dict:
    """Convert, train and score one student; returns its result (read back if it was already done)."""
    folder = STUDENTS / f"{mixer}-{way}-seed{seed}"
    result_path = folder / "result.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    log = open(folder / "log.txt", "a")

    def hybrid(*arguments: str) -> None:
        command = ["hybrid", *arguments]
        print(" ".join(command), file=log, flush=True)
        subprocess.run(command, check=True, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)

    teacher = str(args.imported)
    begin = time.perf_counter()
    hybrid("convert", f"ckpt_path={teacher}", f"pattern={mixer}", f"seed={seed}", f"output={folder}/converted.ckpt")
    start = folder / "converted.ckpt"
    if way == "converted":
        return _score(folder, start, result_path, env, log, dict(mixer=mixer, way=way, seed=seed, steps=0,
                                                                 transfer_steps=0, train_seconds=0.0))
    # Validation once, at a stage's end (val loss over the whole split, PER of its first batch), and no early stop:
    # every way trains exactly its steps, and the table scores the weights it ends with.
    # data.seed=0: the teacher's splits, whatever the run's seed (which seeds G2P's splits by default, and with
    # another split the user's words would hold test words: data.train_path refuses them).
    common = ["data=g2p", f"data.train_path={USER_DATA}", f"seed={seed}", "data.seed=0",
              "callbacks.early_stopping=null", "module.decode_batches=1", "trainer.limit_val_batches=20",
              f"module.warmup_steps={args.warmup_steps}", f"module.max_new_tokens={MAX_NEW_TOKENS}"]
    tune_steps = args.steps
    if way != "plain":
        hybrid("fit", *common, f"init_from={start}", f"trainer.max_steps={args.transfer_steps}",
               f"callbacks.validation_cadence.every_n_steps={args.transfer_steps}",
               f"module.distill.teacher={teacher}", "module.distill.match=mixers",
               f"module.learning_rate={args.transfer_learning_rate}", f"hydra.run.dir={folder}/transfer")
        start = folder / "transfer" / "checkpoints" / "last.ckpt"
        tune_steps -= args.transfer_steps
    distil = [f"module.distill.teacher={teacher}", "module.distill.match=logits", f"module.distill.alpha={args.alpha}",
              f"module.distill.temperature={args.temperature}"] if way == "distil" else []
    if way == "seqkd":
        common[1] = f"data.train_path={TEACHER_OUTPUTS}"
    hybrid("fit", *common, f"init_from={start}", f"trainer.max_steps={tune_steps}",
           f"module.learning_rate={args.learning_rate}",
           f"callbacks.validation_cadence.every_n_steps={tune_steps}", *distil, f"hydra.run.dir={folder}/tune")
    trained_seconds = time.perf_counter() - begin
    return _score(folder, folder / "tune" / "checkpoints" / "last.ckpt", result_path, env, log,
                  dict(mixer=mixer, way=way, seed=seed, steps=args.steps,
                       transfer_steps=args.transfer_steps if way != "plain" else 0,
                       train_seconds=round(trained_seconds, 1)))


def _score(folder: Path, checkpoint: Path, result_path: Path, env: dict, log, run: dict) -> dict:
    """Score ``checkpoint`` in a process of its own and write the run's result.json."""
    subprocess.run([sys.executable, __file__, "--score", str(checkpoint), "--score-out", str(result_path)],
                   check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    result = {**json.loads(result_path.read_text()), **run}
    result_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{run['mixer']:10s} {run['way']:9s} seed {run['seed']}: PER {result['per']:.4f} WER {result['wer']:.4f} "
          f"({run['train_seconds'] / 60:.1f} min)", flush=True)
    return result


def score_checkpoint(path: Path, predictions_path: Path) -> dict:
    """Greedy-decode every G2P test word with the checkpoint (the teacher's generation options, one beam) and
    score it with hybrid test's metrics (the predictions go to ``predictions_path``); the model's size and its
    decoding state per sequence too."""
    import torch
    from evaluate_transformers import score

    from hybrid.training.checkpoint import load_for_inference
    from hybrid.training.data import G2PDataModule

    model, tokenizer = load_for_inference(path)
    data = G2PDataModule()
    pairs = data._load_pairs()["test"]
    references = [data._references("test", word, phonemes) for word, phonemes in pairs]
    predictions = []
    pad_id = model.config.pad_id
    with torch.inference_mode():
        for start in range(0, len(pairs), 64):
            sources = [tokenizer.encode_source(word) for word, _ in pairs[start:start + 64]]
            src = torch.full((len(sources), max(map(len, sources))), pad_id, dtype=torch.long)
            for row, ids in enumerate(sources):
                src[row, : len(ids)] = torch.tensor(ids)
            output = model.generate(src, src != pad_id, max_new_tokens=MAX_NEW_TOKENS, num_beams=1)
            predictions += tokenizer.batch_decode(output.tolist())
        state = model.start(src[:1], src[:1] != pad_id, max_steps=MAX_NEW_TOKENS + 1)
    predictions_path.write_text("".join(line + "\n" for line in predictions))
    return {**score(predictions, references), "words": len(pairs),
            "parameters": sum(p.numel() for p in model.parameters()),
            "decoder_mixers": model.config.decoder_mixers,
            "state_bytes_per_sequence": state.mixer_nbytes}


def teacher_row(args: argparse.Namespace) -> dict:
    """The imported teacher scored by the same code (cached in work/students/teacher.json)."""
    path = STUDENTS / "teacher.json"
    if not path.is_file():
        STUDENTS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        subprocess.run([sys.executable, __file__, "--score", str(args.imported), "--score-out", str(path)],
                       check=True, env=env)
    return json.loads(path.read_text())


TRAINED_WAYS = WAYS[1:]


def best_ways() -> dict[str, str]:
    """Each mixer's trained way with the lowest seed-0 PER (the control excluded)."""
    seed0 = [json.loads(path.read_text()) for path in STUDENTS.glob("*-seed0/result.json")]
    best: dict[str, dict] = {}
    for result in seed0:
        if result["mixer"] != "attention" and result["way"] in TRAINED_WAYS:
            if result["mixer"] not in best or result["per"] < best[result["mixer"]]["per"]:
                best[result["mixer"]] = result
    return {mixer: result["way"] for mixer, result in best.items()}


def summarize(teacher: dict) -> dict:
    """Every finished run, grouped by mixer and way: each seed's scores and their mean."""
    rows: dict[str, dict[str, dict]] = {}
    for path in sorted(STUDENTS.glob("*/result.json")):
        result = json.loads(path.read_text())
        group = rows.setdefault(result["mixer"], {}).setdefault(result["way"], {"seeds": {}})
        group["seeds"][result["seed"]] = {key: result[key] for key in ("per", "wer", "exact_match", "train_seconds")}
        group.update({key: result[key] for key in ("parameters", "state_bytes_per_sequence", "steps",
                                                    "transfer_steps")})
    for by_way in rows.values():
        for group in by_way.values():
            seeds = list(group["seeds"].values())
            for metric in ("per", "wer"):
                values = [seed[metric] for seed in seeds]
                group[metric] = round(statistics.mean(values), 5)
                group[f"{metric}_stdev"] = round(statistics.stdev(values), 5) if len(values) > 1 else None
            group["kept"] = round(teacher["per"] / group["per"], 4)  # the teacher's PER over the student's
    control = rows.get("attention", {}).get("plain")
    for by_way in rows.values():
        for group in by_way.values():
            group["kept_vs_control"] = None if control is None else round(control["per"] / group["per"], 4)
    return rows


def markdown(rows: dict, teacher: dict, args: argparse.Namespace) -> str:
    lines = [f"Teacher (imported Marian, 3 attention decoder layers): greedy PER {teacher['per']:.4f}, WER "
             f"{teacher['wer']:.4f}, {teacher['parameters']:,} parameters, decoding state "
             f"{teacher['state_bytes_per_sequence']:,} bytes per sequence at 64 positions (a KV cache: it grows with "
             f"the length). Every student: {args.steps} steps of 64 words (the teacher trained 1610) on the user's "
             f"{args.user_words} words, greedy on all "
             f"{teacher['words']} test words. 'kept' is the teacher's PER over the student's (1.0: as good); "
             "'kept vs control' is the same against the control: the teacher, nothing swapped, fine-tuned as the "
             "students are (attention, plain). PER and WER are the mean over the seeds listed, ± their standard "
             "deviation.", "",
             "| mixer | way | seeds | PER | WER | kept | kept vs control | parameters | state bytes |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mixer in MIXERS:
        for way in WAYS:
            group = rows.get(mixer, {}).get(way)
            if group is None:
                continue
            spread = "" if group["per_stdev"] is None else f" ± {group['per_stdev']:.4f}"
            control = "" if group["kept_vs_control"] is None else f"{group['kept_vs_control']:.3f}"
            wer_spread = "" if group["wer_stdev"] is None else f" ± {group['wer_stdev']:.4f}"
            lines.append(f"| {mixer} | {way} | {len(group['seeds'])} | {group['per']:.4f}{spread} | "
                         f"{group['wer']:.4f}{wer_spread} | {group['kept']:.3f} | {control} | "
                         f"{group['parameters']:,} | {group['state_bytes_per_sequence']:,} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imported", type=Path, default=WORK / "imported", help="hybrid import's folder")
    parser.add_argument("--mixers", nargs="+", default=list(MIXERS[1:]), choices=MIXERS)
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--user-words", type=int, default=4000, help="the user's data: words of the training split")
    parser.add_argument("--steps", type=int, default=320, help="optimiser steps per student, every stage together")
    parser.add_argument("--transfer-steps", type=int, default=80, help="of which mixer transfer, where the way has it")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="fine-tuning's and distillation's peak")
    parser.add_argument("--transfer-learning-rate", type=float, default=1e-3, help="mixer transfer's peak")
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument("--alpha", type=float, default=0.5, help="distillation's weight of the KL term")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--best-way-seeds", nargs="+", type=int, default=[],
                        help="instead of --ways x --seeds: these seeds of each mixer's best way at seed 0")
    parser.add_argument("--best-checkpoints", action="store_true",
                        help="print bench_engines.py's --student option for each mixer's best way at seed 0, and stop")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--score", type=Path, help=argparse.SUPPRESS)  # internal: score one checkpoint
    parser.add_argument("--score-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.score is not None:
        predictions = args.score_out.with_name(args.score_out.stem + "_predictions.txt")
        args.score_out.write_text(json.dumps(score_checkpoint(args.score, predictions), indent=2) + "\n")
        return
    if not 0 < args.transfer_steps < args.steps:
        parser.error("--transfer-steps must be between 0 and --steps")
    if args.best_checkpoints:
        print(" ".join(f"--student {mixer}-{way}={STUDENTS}/{mixer}-{way}-seed0/tune/checkpoints/last.ckpt"
                       for mixer, way in best_ways().items()))
        return
    prepare_data(args)
    teacher = teacher_row(args)
    if args.best_way_seeds:
        runs = [(mixer, way, seed) for seed in args.best_way_seeds for mixer, way in best_ways().items()]
    else:
        runs = [(mixer, way, seed) for seed in args.seeds for way in args.ways for mixer in args.mixers
                if mixer != "attention" or way == "plain"]  # the control has nothing swapped to transfer to
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(run_one, *run, args) for run in runs]:
            future.result()
    rows = summarize(teacher)
    report = {"command": " ".join(["python", "results/hf-import/students.py", *sys.argv[1:]]), "teacher": teacher,
              "settings": {key: getattr(args, key) for key in ("user_words", "steps", "transfer_steps", "learning_rate",
                                                                "transfer_learning_rate", "warmup_steps", "alpha",
                                                                "temperature")},
              "students": rows}
    (HERE / "students.json").write_text(json.dumps(report, indent=2) + "\n")
    (HERE / "students.md").write_text(markdown(rows, teacher, args))
    print(markdown(rows, teacher, args))


if __name__ == "__main__":
    main()
