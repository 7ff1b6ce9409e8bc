"""Example predictions after training or evaluation: test sources, the model's greedy output, the reference,
and the decoding time per token (what ``print_examples=N`` shows at the end of ``hybrid fit``/``test``)."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch

from hybrid.model import Seq2Seq
from hybrid.training.scoring import greedy_length_limit

if TYPE_CHECKING:
    from hybrid.training.data import Seq2SeqDataModule


def print_examples(model: Seq2Seq, datamodule: Seq2SeqDataModule, count: int) -> None:
    """Print ``count`` test sources with the model's greedy prediction as the data module shows an example
    (:meth:`~hybrid.training.data.Seq2SeqDataModule.example_row`: with the reference it is scored against),
    and the median decoding time per generated token, one source at a time (batch 1, the latency case)."""
    datamodule.setup("test")
    tokenizer, examples = datamodule.tokenizer, datamodule.datasets["test"][:count]
    model.eval()
    device = next(model.parameters()).device

    def decode(source_ids: list[int]) -> torch.Tensor:
        max_new_tokens = greedy_length_limit(len(source_ids), model.config.max_positions)
        return model.generate(torch.tensor([source_ids], device=device), max_new_tokens=max_new_tokens)

    decode(examples[0].source_ids)  # warm-up: the first call pays for allocations
    rows, seconds_per_token = [], []
    for example in examples:
        begin = time.perf_counter()
        ids = decode(example.source_ids)
        seconds_per_token.append((time.perf_counter() - begin) / ids.shape[1])
        rows.append(datamodule.example_row(example, tokenizer.decode(ids[0])))
    widths = [max(len(row[column]) for row in rows) for column in range(2)]
    print(f"{'source':<{widths[0]}}  {'prediction':<{widths[1]}}  reference")
    for source, prediction, reference, mark in rows:
        print(f"{source:<{widths[0]}}  {prediction:<{widths[1]}}  {reference}  {mark}")
    print(f"greedy decoding, one source at a time on {device.type}: "
          f"{1000 * statistics.median(seconds_per_token):.2f} ms per generated token (median over {len(rows)})")
