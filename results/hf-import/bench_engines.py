"""The same trained weights in every engine: words/s and quality of the imported teacher on the whole G2P test split.

One MarianMTModel (train_teacher.py) decodes every test word to its natural length (it stops at its EOS;
at most 63 new tokens, the model's own limit: 64 positions, the decoder start included) in six engines:
hybrid eager, hybrid's fast path (ONNX Runtime) with float32 and with int8 weights, transformers'
generate(), and CTranslate2 (converted from `hybrid export format=transformers`) at float32 and int8.
Two settings: batch 1 greedy and batch 32 with 4 beams (CTranslate2's own benchmark setting); every other
decoding option is the model's own generation config (as `hybrid import` and transformers read it).

Every engine gets the same threads (torch's intra-op threads, which ONNX Runtime's session follows in
hybrid's fast path; CTranslate2's intra_threads, one translator) and the same words, in test-split order,
`--chunks` chunks of them; each chunk is run by every engine in a rotating order, so that the machine's
drift hits all alike. A warm-up decode (excluded) first loads or exports each engine's graphs. The time
of a chunk covers the whole call: tokenizing, encoding, decoding and detokenizing.

Quality is PER, WER and exact match with hybrid test's own metric code (each prediction against its
closest reference), on every word, and the number of words whose prediction differs from transformers'
generate() in the same setting. Writes engines.json (raw numbers) and engines.md (the table):

    python results/hf-import/bench_engines.py --threads 2
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from evaluate_transformers import score  # hybrid test's scores, written once beside this script

from hybrid.bench.metadata import device_name
from hybrid.training.checkpoint import load_for_inference
from hybrid.training.data import G2PDataModule

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent.parent
WORK = HERE / "work"
MAX_NEW_TOKENS = 63  # the teacher's max_length 64 less the decoder start token: its own limit
SETTINGS = {"batch1-greedy": (1, 1), "batch32-beam4": (32, 4)}  # name -> (batch size, beams)
REFERENCE_ENGINE = "ct2-float32"  # the ratios' denominator
QUALITY_ENGINE = "transformers"  # predictions compared line by line against this engine's

Decode = Callable[[list[str], int], list[str]]  # (words, num_beams) -> one phoneme string per word


@dataclasses.dataclass
class Engine:
    name: str
    decode: Decode
    setup_seconds: float = 0.0  # loading, converting or exporting, before the warm-up
    model: object = None  # hybrid's Seq2Seq, for the profile


def hybrid_engine(name: str, folder: Path, quantize: str | None = None, fast: bool = False) -> Engine:
    """The imported folder in hybrid: eager, or on the fast path (ONNX Runtime, graphs cached in folder/fast)."""
    begin = time.perf_counter()
    model, tokenizer = load_for_inference(folder)
    if fast:
        model = copy.deepcopy(model).optimize_for_inference(quantize)
    pad_id = model.config.pad_id

    @torch.inference_mode()
    def decode(words: list[str], num_beams: int) -> list[str]:
        sources = [tokenizer.encode_source(word) for word in words]
        src = torch.full((len(sources), max(map(len, sources))), pad_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        output = model.generate(src, src != pad_id, max_new_tokens=MAX_NEW_TOKENS, num_beams=num_beams)
        return tokenizer.batch_decode(output.tolist())

    return Engine(name, decode, time.perf_counter() - begin, model)


def transformers_engine(teacher: Path) -> Engine:
    """The teacher as transformers saved it, decoding through its own generate()."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    begin = time.perf_counter()
    model = AutoModelForSeq2SeqLM.from_pretrained(teacher).eval()
    tokenizer = AutoTokenizer.from_pretrained(teacher)

    @torch.inference_mode()
    def decode(words: list[str], num_beams: int) -> list[str]:
        inputs = tokenizer(words, padding=True, return_tensors="pt")
        # max_length, the teacher's own option (generate() warns when max_new_tokens overrides it)
        output = model.generate(**inputs, num_beams=num_beams, do_sample=False, max_length=MAX_NEW_TOKENS + 1)
        return tokenizer.batch_decode(output, skip_special_tokens=True)

    return Engine("transformers", decode, time.perf_counter() - begin)


def ctranslate2_engine(converted: Path, teacher: Path, compute_type: str, threads: int) -> Engine:
    """CTranslate2 running the converted export. It takes and gives token strings: the source is the
    teacher tokenizer's tokens (the word's characters and </s>), the output its phoneme tokens."""
    import ctranslate2
    from transformers import AutoTokenizer

    begin = time.perf_counter()
    translator = ctranslate2.Translator(str(converted), device="cpu", compute_type=compute_type,
                                        inter_threads=1, intra_threads=threads)
    tokenizer = AutoTokenizer.from_pretrained(teacher)

    def decode(words: list[str], num_beams: int) -> list[str]:
        sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(words)["input_ids"]]
        # max_input_length=0: never truncate a source (CTranslate2's default cuts at 1024 tokens).
        results = translator.translate_batch(sources, beam_size=num_beams, max_decoding_length=MAX_NEW_TOKENS,
                                             max_input_length=0)
        return [tokenizer.decode(tokenizer.convert_tokens_to_ids(result.hypotheses[0]), skip_special_tokens=True)
                for result in results]

    return Engine(f"ct2-{compute_type}", decode, time.perf_counter() - begin)


def build_engines(args: argparse.Namespace) -> list[Engine]:
    engines = [
        hybrid_engine("hybrid-eager", args.imported),
        hybrid_engine("hybrid-fast-fp32", args.imported, fast=True),
        hybrid_engine("hybrid-fast-int8", args.imported, quantize="int8", fast=True),
        transformers_engine(args.teacher),
        ctranslate2_engine(args.ct2, args.teacher, "float32", args.threads),
        ctranslate2_engine(args.ct2, args.teacher, "int8", args.threads),
    ]
    students = [hybrid_engine(f"{name}-fast-fp32", Path(path), fast=True)
                for name, path in (student.split("=", 1) for student in args.student)]
    return [engine for engine in engines if engine.name in args.engines] + students


def decode_in_batches(engine: Engine, words: list[str], batch_size: int, num_beams: int) -> list[str]:
    return [prediction for start in range(0, len(words), batch_size)
            for prediction in engine.decode(words[start : start + batch_size], num_beams)]


def chunk_bounds(words: int, chunks: int, batch_size: int) -> list[tuple[int, int]]:
    """`chunks` spans of about equal size covering `words`, each a whole number of batches of every setting."""
    step = -(-words // chunks // batch_size) * batch_size
    return [(start, min(start + step, words)) for start in range(0, words, step)]


def run(engines: list[Engine], words: list[str], chunks: int, timed: dict[str, int]) -> dict:
    """Every engine, every setting, every chunk, in rotating order: the seconds of each chunk and the predictions.

    A setting times its first ``timed[setting]`` words; the words after those are decoded untimed at batch 32
    (same beams), so that its quality still covers every word.
    """
    widest = max(batch_size for batch_size, _ in SETTINGS.values())
    bounds = {setting: chunk_bounds(timed[setting], chunks, widest) for setting in SETTINGS}
    seconds = {setting: {engine.name: [] for engine in engines} for setting in SETTINGS}
    predictions = {setting: {engine.name: [] for engine in engines} for setting in SETTINGS}
    for index in range(max(map(len, bounds.values()))):
        rotation = index % len(engines)
        for setting, (batch_size, num_beams) in SETTINGS.items():
            if index >= len(bounds[setting]):
                continue
            start, end = bounds[setting][index]
            for engine in engines[rotation:] + engines[:rotation]:
                begin = time.perf_counter()
                output = decode_in_batches(engine, words[start:end], batch_size, num_beams)
                seconds[setting][engine.name].append(time.perf_counter() - begin)
                predictions[setting][engine.name] += output
        done = {setting: {name: round(sum(times), 1) for name, times in by_engine.items()}
                for setting, by_engine in seconds.items()}
        print(f"chunk {index + 1}: seconds so far {json.dumps(done)}", flush=True)
    for setting, (_, num_beams) in SETTINGS.items():
        for engine in engines:
            predictions[setting][engine.name] += decode_in_batches(engine, words[timed[setting]:], widest, num_beams)
    return {"chunks": bounds, "seconds": seconds, "predictions": predictions}


def warm_up(engines: list[Engine], words: list[str]) -> dict[str, float]:
    """One small decode per engine and setting, untimed in the table: loads or exports the fast path's graphs."""
    seconds = {}
    for engine in engines:
        begin = time.perf_counter()
        for batch_size, num_beams in SETTINGS.values():
            decode_in_batches(engine, words[:batch_size], batch_size, num_beams)
        seconds[engine.name] = round(time.perf_counter() - begin, 2)
    return seconds


def summarize(engines: list[Engine], measured: dict, words: list[str], references: list) -> dict:
    rows = {}
    for setting in SETTINGS:
        rows[setting] = {}
        reference = measured["seconds"][setting].get(REFERENCE_ENGINE)
        baseline = measured["predictions"][setting].get(QUALITY_ENGINE)
        chunk_words = [end - start for start, end in measured["chunks"][setting]]
        for engine in engines:
            times = measured["seconds"][setting][engine.name]
            predictions = measured["predictions"][setting][engine.name]
            total = sum(times)
            rows[setting][engine.name] = {
                "timed_words": sum(chunk_words),
                "seconds": round(total, 3),
                "words_per_second": round(sum(chunk_words) / total, 2),
                "median_chunk_words_per_second": round(statistics.median(
                    n / t for n, t in zip(chunk_words, times, strict=True)), 2),
                f"speed_vs_{REFERENCE_ENGINE}": None if reference is None else round(sum(reference) / total, 3),
                # The ratio within each chunk, where both engines ran moments apart, then its median: the
                # figure that the machine's drift (other users' jobs on a shared machine) moves least.
                f"median_chunk_speed_vs_{REFERENCE_ENGINE}": None if reference is None else round(statistics.median(
                    theirs / ours for theirs, ours in zip(reference, times, strict=True)), 3),
                **score(predictions, references),
                f"words_differing_from_{QUALITY_ENGINE}": None if baseline is None else sum(
                    a != b for a, b in zip(predictions, baseline, strict=True)),
            }
    return rows


def markdown(rows: dict, words: int, threads: int) -> str:
    lines = [f"The imported teacher (and any students, named by their mixer and way: --student) on the G2P test "
             f"split ({words} words), CPU, {threads} threads. "
             f"Speed is words/s over all timed chunks (higher is better) and the median over chunks of its ratio "
             f"to {REFERENCE_ENGINE} in the same chunk; PER, WER by hybrid "
             f"test's metric; 'differ' counts words whose prediction differs from transformers' generate() "
             f"in the same setting.", ""]
    for setting, by_engine in rows.items():
        timed = next(iter(by_engine.values()))["timed_words"]
        lines += [f"### {setting}", "", f"Speed over {'every word' if timed == words else f'the first {timed} words'}; "
                  "quality over every word.", "",
                  f"| engine | words/s | vs {REFERENCE_ENGINE} | PER | WER | differ |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, row in by_engine.items():
            ratio = row[f"median_chunk_speed_vs_{REFERENCE_ENGINE}"]
            differ = row[f"words_differing_from_{QUALITY_ENGINE}"]
            lines.append(f"| {name} | {row['words_per_second']:.1f} | "
                         f"{'' if ratio is None else f'{ratio:.2f}x'} | {row['per']:.4f} | {row['wer']:.4f} | "
                         f"{'' if differ is None else differ} |")
        lines.append("")
    return "\n".join(lines)


class StepTimer:
    """Where hybrid's decode time goes: ``model.start`` (the encoder and the cross-attention keys and values),
    ``model.step_unchecked`` (the decoder step: ONNX Runtime's session on the fast path, torch eager
    otherwise), and the rest (the search rules in Python: logits processors, top-k, beam bookkeeping, state
    reorders; tokenizing). Wraps the two methods on the instance for the duration of the block."""

    PARTS = ("start", "step_unchecked")

    def __init__(self, model) -> None:
        self.model, self.seconds, self.calls = model, dict.fromkeys(self.PARTS, 0.0), dict.fromkeys(self.PARTS, 0)

    def __enter__(self) -> StepTimer:
        for part in self.PARTS:
            original = getattr(self.model, part)

            def timed(*args, _original=original, _part=part, **kwargs):
                begin = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds[_part] += time.perf_counter() - begin
                    self.calls[_part] += 1

            setattr(self.model, part, timed)
        return self

    def __exit__(self, *exc) -> None:
        for part in self.PARTS:
            delattr(self.model, part)  # the instance attribute hid the method; removing it restores the method


def profile(engines: list[Engine], words: list[str]) -> dict:
    """Milliseconds per word of each hybrid engine, split by :class:`StepTimer`, on the same words, per setting."""
    split = {}
    for setting, (batch_size, num_beams) in SETTINGS.items():
        split[setting] = {}
        for engine in engines:
            if engine.model is None:
                continue
            with StepTimer(engine.model) as timer:
                begin = time.perf_counter()
                decode_in_batches(engine, words, batch_size, num_beams)
                total = time.perf_counter() - begin
            per_word = {part: round(1000 * seconds / len(words), 3) for part, seconds in timer.seconds.items()}
            split[setting][engine.name] = {
                "ms_per_word": round(1000 * total / len(words), 3), **per_word,
                "rest": round(1000 * total / len(words) - sum(per_word.values()), 3),
                "steps": timer.calls["step_unchecked"],
                "ms_per_step": round(1000 * timer.seconds["step_unchecked"] / max(timer.calls["step_unchecked"], 1), 4),
            }
            print(setting, engine.name, json.dumps(split[setting][engine.name]), flush=True)
    return split


def onnx_runtime_ops(folder: Path, words: list[str], top: int = 8) -> dict:
    """Milliseconds per decode step of each ONNX operator type in the fast path's float32 step, per setting,
    by ONNX Runtime's own profiler (a fresh model whose sessions are opened with profiling on)."""
    import onnxruntime

    from hybrid.accel.onnx import OnnxAccelerator

    open_session = OnnxAccelerator._open

    def open_profiled(step, graph: bytes):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = step.threads, 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = str(WORK / "onnxruntime-profile")
        return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])

    split = {}
    OnnxAccelerator._open = open_profiled
    try:
        for setting, (batch_size, num_beams) in SETTINGS.items():
            engine = hybrid_engine("hybrid-fast-fp32", folder, fast=True)
            decode_in_batches(engine, words, batch_size, num_beams)
            for session in engine.model.accelerator.sessions.values():
                trace = Path(session.end_profiling())
                events = json.loads(trace.read_text())
                trace.unlink()
                steps = sum(event["name"] == "model_run" for event in events)
                by_op = {"whole step": sum(event["dur"] for event in events if event["name"] == "model_run")}
                for event in events:
                    if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                        by_op[event["args"]["op_name"]] = by_op.get(event["args"]["op_name"], 0) + event["dur"]
                ranked = sorted(by_op.items(), key=lambda item: -item[1])[: top + 1]
                split[setting] = {"steps": steps, **{op: round(us / steps / 1000, 3) for op, us in ranked}}
                print(setting, "ONNX Runtime ms per step", json.dumps(split[setting]), flush=True)
    finally:
        OnnxAccelerator._open = open_session
    return split


def versions() -> dict[str, str]:
    return {package: importlib.metadata.version(package)
            for package in ("torch", "transformers", "ctranslate2", "onnxruntime", "onnx", "tokenizers")} | {
        "python": platform.python_version()}


def shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", type=Path, default=WORK / "teacher", help="train_teacher.py's folder")
    parser.add_argument("--imported", type=Path, default=WORK / "imported", help="hybrid import's folder")
    parser.add_argument("--ct2", type=Path, default=WORK / "ct2", help="ct2-transformers-converter's folder")
    parser.add_argument("--out", type=Path, default=HERE, help="where engines.json and engines.md go")
    parser.add_argument("--predictions", type=Path, default=WORK / "predictions",
                        help="each engine's predictions, one file per setting and engine (for reading the differences)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=8, help="split the words into this many interleaved chunks")
    parser.add_argument("--words", type=int, default=None, help="only the first N test words (development)")
    parser.add_argument("--batch1-timed-words", type=int, default=None,
                        help="time batch 1 greedy on the first N words only (all engines alike; the rest are "
                             "decoded untimed at batch 32, for quality); default: every word")
    parser.add_argument("--profile-words", type=int, default=512,
                        help="then split hybrid's time per word on the first N words (0: no profile)")
    parser.add_argument("--engines", nargs="+", default=["hybrid-eager", "hybrid-fast-fp32", "hybrid-fast-int8",
                                                         "transformers", "ct2-float32", "ct2-int8"])
    parser.add_argument("--student", action="append", default=[], metavar="NAME=PATH",
                        help="also time a student (a checkpoint or model folder) on the fast path, float32, as NAME")
    args = parser.parse_args()
    if any("=" not in student for student in args.student):
        parser.error("--student takes NAME=PATH")
    if min(args.threads, args.chunks, args.words or 1, args.batch1_timed_words or 1) < 1:
        parser.error("--threads, --chunks, --words and --batch1-timed-words must be at least 1")
    for folder in (args.teacher, args.imported, args.ct2):
        if not (folder / "config.json").is_file():
            parser.error(f"{folder} holds no config.json: run results/hf-import/run.sh, which makes it")

    transformers.utils.logging.disable_progress_bar()  # a bar per model load; the log is the chunks' lines
    torch.set_num_threads(args.threads)  # before the fast path's sessions, which take torch's thread count
    torch.set_num_interop_threads(1)
    data = G2PDataModule()
    test_pairs = data._load_pairs()["test"][: args.words]
    words = [word for word, _ in test_pairs]
    references = [data._references("test", word, phonemes) for word, phonemes in test_pairs]

    engines = build_engines(args)
    warm_up_seconds = warm_up(engines, words)
    timed = {setting: len(words) for setting in SETTINGS}
    if args.batch1_timed_words is not None:
        timed["batch1-greedy"] = min(args.batch1_timed_words, len(words))
    measured = run(engines, words, args.chunks, timed)
    rows = summarize(engines, measured, words, references)
    for setting, by_engine in measured["predictions"].items():
        (args.predictions / setting).mkdir(parents=True, exist_ok=True)
        for name, predictions in by_engine.items():
            (args.predictions / setting / f"{name}.txt").write_text("".join(line + "\n" for line in predictions))
    split = profile(engines, words[: args.profile_words]) if args.profile_words else {}
    ops = onnx_runtime_ops(args.imported, words[: args.profile_words]) if args.profile_words else {}
    report = {
        "command": " ".join(["python", shown(Path(sys.argv[0])), *sys.argv[1:]]),
        "test_words": len(words),
        "timed_words": timed,
        "threads": {"torch_intra_op": torch.get_num_threads(), "onnxruntime_intra_op": args.threads,
                    "ctranslate2_intra_threads": args.threads, "ctranslate2_inter_threads": 1},
        "max_new_tokens": MAX_NEW_TOKENS,
        "settings": {name: {"batch_size": b, "num_beams": n} for name, (b, n) in SETTINGS.items()},
        "setup_seconds": {engine.name: round(engine.setup_seconds, 2) for engine in engines},
        "warm_up_seconds": warm_up_seconds,
        "versions": versions(),
        "machine": {"processor": device_name(torch.device("cpu")), "cpus": os.cpu_count()},
        "results": rows,
        "profile": {"words": min(args.profile_words, len(words)), "ms_per_word": split,
                    "onnxruntime_ms_per_step_fp32": ops},
        "chunks": measured["chunks"],
        "chunk_seconds": {setting: {name: [round(t, 4) for t in times] for name, times in by_engine.items()}
                          for setting, by_engine in measured["seconds"].items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engines.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "engines.md").write_text(markdown(rows, len(words), args.threads))
    print(markdown(rows, len(words), args.threads))


if __name__ == "__main__":
    main()
