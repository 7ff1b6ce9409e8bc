"""How training scores its greedy decodings: the sequence metrics, the closest reference and the length limit.

Validation and test (:class:`hybrid.training.module.LitSeq2Seq`) and the printed examples
(:mod:`hybrid.training.examples`) share these, so a printed "ok" is what exact match counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.text import CharErrorRate, CHRFScore, SacreBLEUScore, WordErrorRate


class ExactMatch(Metric):
    """The share of predicted strings equal to their reference."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("matches", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, predictions: Sequence[str], references: Sequence[str]) -> None:
        self.matches += sum(p == r for p, r in zip(predictions, references, strict=True))
        self.total += len(references)

    def compute(self) -> Tensor:
        return self.matches / self.total


class SequenceErrorRate(ExactMatch):
    """The share of predictions with any error: G2P's word error rate, where each example is a word."""

    def compute(self) -> Tensor:
        return 1.0 - super().compute()


# Each task reports its field's usual scores. Over space-separated phonemes, torchmetrics' word
# error rate is the phoneme error rate. BLEU and chrF are on torchmetrics' 0-1 scale.
SEQUENCE_METRICS: dict[str, type[Metric]] = {
    "exact_match": ExactMatch,
    "per": WordErrorRate,
    "wer": SequenceErrorRate,
    "cer": CharErrorRate,
    "bleu": SacreBLEUScore,
    "chrf": CHRFScore,
}
CORPUS_METRICS = {"bleu", "chrf"}  # they take a list of references per prediction


def closest_reference(prediction: str, references: Sequence[str]) -> str:
    """The reference fewest token edits (Levenshtein over space-separated tokens) away from the
    prediction, the earliest on a tie: what the other metrics score a prediction with several valid
    references against, so that matching any of them is no error."""
    if len(references) == 1:
        return references[0]
    predicted = prediction.split()

    def edits(reference: str) -> int:
        row = list(range(len(predicted) + 1))  # distances from the empty reference prefix
        for i, token in enumerate(reference.split(), start=1):
            diagonal, row[0] = row[0], i
            for j, other in enumerate(predicted, start=1):
                diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (token != other))
        return row[-1]

    return min(references, key=edits)


def greedy_length_limit(source_length: int, max_positions: int, max_new_tokens: int | None = None) -> int:
    """The new tokens a greedy decoding of a ``source_length``-token source may take: ``max_new_tokens``, or
    (None) twice the source plus 10, enough for every task here; never more than the decoder's
    ``max_positions`` hold beside its bos, so a long source does not ask for positions the model lacks."""
    return min(max_new_tokens or 2 * source_length + 10, max_positions - 1)
