"""Stopping criteria: decide, per sequence, whether generation is done.

A criterion is a callable `(input_ids, scores) -> BoolTensor [B]` with Hugging Face transformers'
signature, True where a sequence is done; `input_ids` (LongTensor [B, t]) are the decoder ids so far,
BOS column first. As with the logits processors, nothing here reads a tensor back to the host, so
checking whether to stop never waits on the device; the search strategy decides when to look.
Like the processors, each criterion declares `supports_continuous_batching`: True when it reads only
the newest column of `input_ids`, which is all that continuous refill can give it.

No criterion here counts lengths: `max_new_tokens` counts each row's own tokens, after its forced prefix
or since its refill, which the columns of `input_ids` cannot tell, so the decoding rules apply it
(`DecodingRules.ends`), beside the `EosTokenCriteria` they end every row with. (transformers 5 has no
`MaxNewTokensCriteria` either.)
"""

from collections.abc import Callable

import torch
from torch import Tensor

from hybrid.generation.processors import continuous_batching_support
from hybrid.validators import check_token_ids

StoppingCriterion = Callable[[Tensor, Tensor], Tensor | bool]


class EosTokenCriteria:
    """Stop the sequences whose last token is an end-of-sequence id.

    `eos_token_id` is an id or a non-empty list of ids, any of which ends a sequence. Every decoding path
    ends its rows with one (:meth:`hybrid.generation.rules.DecodingRules.ends`), as transformers' `generate`
    adds one to its criteria.
    """

    supports_continuous_batching = True  # reads the newest column only

    def __init__(self, eos_token_id: int | list[int]) -> None:
        self.eos_token_id = check_token_ids("eos_token_id", eos_token_id)
        # Built once per device: copying a list to an accelerator would synchronise with it every step.
        self._eos_ids: dict[torch.device, Tensor] = {}

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return self.ends(input_ids[:, -1])

    def ends(self, tokens: Tensor) -> Tensor:
        """Which of ``tokens`` (any shape) are an end-of-sequence id, as bools of the same shape."""
        # isin, written in the ops that every exporter has (the fast path traces it into its graphs)
        return (tokens[..., None] == self.ids_on(tokens.device)).any(dim=-1)

    def ids_on(self, device: torch.device) -> Tensor:
        """The end-of-sequence ids as a tensor on ``device``, made once per device."""
        if device not in self._eos_ids:
            self._eos_ids[device] = torch.tensor(self.eos_token_id, dtype=torch.long, device=device)
        return self._eos_ids[device]


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
