"""Stopping criteria: decide, per sequence, whether generation is done.

A criterion is a callable `(input_ids, scores) -> BoolTensor [B]` with Hugging Face transformers'
signature, True where a sequence is done; `input_ids` (LongTensor [B, t]) are the decoder ids so far,
BOS column first. As with the logits processors, nothing here reads a tensor back to the host, so
checking whether to stop never waits on the device; the search strategy decides when to look.
Like the processors, each criterion declares `supports_continuous_batching`: True when it reads only
the newest column of `input_ids`, which is all that continuous refill can give it.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from .processors import _check_int, _check_token_ids, continuous_batching_support

StoppingCriterion = Callable[[Tensor, Tensor], Tensor | bool]


class MaxNewTokensCriteria:
    """Stop every sequence once `max_new_tokens` tokens have been generated.

    The count of new tokens is `input_ids.shape[1] - start_length`; an encoder-decoder passes
    start_length=1 to skip the BOS column. Both arguments must be ints >= 0.
    """

    supports_continuous_batching = False  # counts columns, and refill's rows sit at different positions

    def __init__(self, start_length: int, max_new_tokens: int) -> None:
        self.start_length = _check_int("start_length", start_length, 0)
        self.max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 0)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        is_done = input_ids.shape[1] - self.start_length >= self.max_new_tokens
        return torch.full((input_ids.shape[0],), is_done, dtype=torch.bool, device=input_ids.device)


class EosTokenCriteria:
    """Stop the sequences whose last token is an end-of-sequence id.

    `eos_token_id` is an id or a non-empty list of ids, any of which ends a sequence.
    """

    supports_continuous_batching = True  # reads the newest column only

    def __init__(self, eos_token_id: int | list[int]) -> None:
        self.eos_token_id = _check_token_ids("eos_token_id", eos_token_id)
        # Built once per device: copying a list to an accelerator would synchronise with it every step.
        self._eos_ids: dict[torch.device, Tensor] = {}

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        device = input_ids.device
        if device not in self._eos_ids:
            self._eos_ids[device] = torch.tensor(self.eos_token_id, dtype=torch.long, device=device)
        return torch.isin(input_ids[:, -1], self._eos_ids[device])


class StoppingCriteriaList(list[StoppingCriterion]):
    """A list of stopping criteria that is itself a criterion: a sequence is done when any says so.

    Each criterion must answer with a bool tensor of shape [B], one flag per row (what transformers'
    criteria return), or with one flag for every row: a Python bool or a 0-dim bool tensor. Anything
    else (None, an int or float tensor, another shape) is refused with an error that names the
    criterion, what it returned and what is allowed, rather than read as truthiness or broadcast.
    The answer is always a [B] bool tensor on `input_ids.device`, all False when the list is empty.
    """

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        rows = input_ids.shape[0]
        is_done = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        for criterion in self:
            answer = _checked_flags(criterion, criterion(input_ids, scores), rows)
            is_done = is_done | (answer.to(is_done.device) if isinstance(answer, Tensor) else answer)
        return is_done

    @property
    def supports_continuous_batching(self) -> bool | None:
        return continuous_batching_support(self)


def _checked_flags(criterion: StoppingCriterion, answer: object, rows: int) -> Tensor | bool:
    """A criterion's answer if it is one a criterion may give, else an error naming the criterion.

    Only shape and dtype are read, which are host metadata: checking never waits on the device.
    """
    allowed = (f"a stopping criterion returns a bool tensor of shape ({rows},), one flag per row, or one flag "
               "for every row: a Python bool or a 0-dim bool tensor")
    name = f"stopping_criteria ({getattr(criterion, '__name__', type(criterion).__name__)})"
    if isinstance(answer, bool):
        return answer
    if not isinstance(answer, Tensor):
        raise TypeError(f"{name} returned {type(answer).__name__}; {allowed}")
    if answer.dtype != torch.bool or answer.shape not in ((rows,), ()):
        raise ValueError(f"{name} returned a {answer.dtype} tensor of shape {tuple(answer.shape)}; {allowed}")
    return answer
