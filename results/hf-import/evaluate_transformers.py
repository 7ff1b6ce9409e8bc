"""Score the teacher with transformers' own generate(): the figures an imported model must reproduce.

Loads the folder train_teacher.py wrote with `AutoModelForSeq2SeqLM` and `AutoTokenizer`, decodes the
whole test split of hybrid's G2P data (`G2PDataModule()` defaults, the split `hybrid test` scores) in
batches of 32, greedy and with 4 beams (every other option from the teacher's generation_config.json),
and writes one prediction a line, in test-split order, to transformers_predictions_{greedy,beam4}.txt.
PER, WER and exact match are hybrid's own metrics, fed as `hybrid test` feeds them (each prediction
against its closest reference), into transformers_quality.json:

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python results/hf-import/evaluate_transformers.py
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from hybrid.training.data import G2PDataModule
from hybrid.training.scoring import SEQUENCE_METRICS, closest_reference

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent.parent
METRICS = ("per", "wer", "exact_match")  # what hybrid test reports for G2P (default_sequence_metrics)
SEARCHES = {"greedy": 1, "beam4": 4}  # output name -> num_beams


def shown(path: Path) -> Path:
    """`path` relative to the repository where it lies inside it, so the JSON names no one's home folder."""
    path = path.resolve()
    return path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path


@torch.inference_mode()
def decode(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, words: list[str], num_beams: int,
           batch_size: int) -> list[str]:
    """transformers' generate() over `words` in order, `batch_size` at a time, decoded to phoneme strings."""
    predictions = []
    for start in range(0, len(words), batch_size):
        inputs = tokenizer(words[start : start + batch_size], padding=True, return_tensors="pt")
        output = model.generate(**inputs, num_beams=num_beams, do_sample=False)
        predictions += tokenizer.batch_decode(output, skip_special_tokens=True)
    return predictions


def score(predictions: list[str], references: list[tuple[str, ...]]) -> dict[str, float]:
    """hybrid test's G2P scores: each prediction against its closest reference, by hybrid's metric classes."""
    closest = [closest_reference(prediction, options) for prediction, options in zip(predictions, references,
                                                                                      strict=True)]
    scores = {}
    for name in METRICS:
        metric = SEQUENCE_METRICS[name]()
        metric.update(predictions, closest)
        scores[name] = metric.compute().item()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", type=Path, default=HERE / "work" / "teacher")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if not (args.teacher / "config.json").is_file():
        parser.error(f"{args.teacher} holds no config.json: train the teacher first (train_teacher.py)")

    model = AutoModelForSeq2SeqLM.from_pretrained(args.teacher).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    data = G2PDataModule()
    test_pairs = data._load_pairs()["test"]
    words = [word for word, _ in test_pairs]
    references = [data._references("test", word, phonemes) for word, phonemes in test_pairs]

    quality = {
        "teacher": str(shown(args.teacher)),
        "test_words": len(words),
        "batch_size": args.batch_size,
        "generation_config": model.generation_config.to_diff_dict(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    for name, num_beams in SEARCHES.items():
        start = time.perf_counter()
        predictions = decode(model, tokenizer, words, num_beams, args.batch_size)
        seconds = time.perf_counter() - start
        (args.out / f"transformers_predictions_{name}.txt").write_text("".join(p + "\n" for p in predictions))
        quality[name] = {"num_beams": num_beams, **score(predictions, references), "seconds": round(seconds, 1)}
        print(name, json.dumps(quality[name]), flush=True)
    (args.out / "transformers_quality.json").write_text(json.dumps(quality, indent=2) + "\n")


if __name__ == "__main__":
    main()
