"""Each stopping criterion against a plain-Python reference."""

import pytest
import torch

from hybrid.generation.stopping import EosTokenCriteria, StoppingCriteriaList


def random_ids(seed: int, batch: int, length: int, vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=generator)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eos_token_id", [2, [0, 3], [4, 99]])
def test_eos_token(seed: int, eos_token_id: int | list[int]) -> None:
    eos_ids = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    criterion = EosTokenCriteria(eos_token_id)
    for length in range(1, 5):
        input_ids = random_ids(seed + length, 8, length, 5)
        expected = [ids[-1] in eos_ids for ids in input_ids.tolist()]
        assert criterion(input_ids, torch.zeros(8, 5)).tolist() == expected
        # The decoding rules end rows with it on tokens of any shape (beam search's candidates).
        assert criterion.ends(input_ids.view(2, 4, length)[..., -1]).flatten().tolist() == expected


def test_list_ors_every_kind_of_answer() -> None:
    input_ids = torch.tensor([[0, 1], [0, 2], [0, 3]])
    scores = torch.zeros(3, 5)
    eos = EosTokenCriteria(2)
    assert StoppingCriteriaList()(input_ids, scores).tolist() == [False, False, False]
    assert StoppingCriteriaList([eos])(input_ids, scores).tolist() == [False, True, False]
    for whole_batch in (lambda i, s: False, lambda i, s: torch.tensor(False)):
        assert StoppingCriteriaList([eos, whole_batch])(input_ids, scores).tolist() == [False, True, False]
    for whole_batch in (lambda i, s: True, lambda i, s: torch.tensor(True)):
        is_done = StoppingCriteriaList([eos, whole_batch])(input_ids, scores)
        assert is_done.dtype == torch.bool and is_done.tolist() == [True, True, True]
    last_row = StoppingCriteriaList([eos, lambda i, s: torch.tensor([False, False, True])])(input_ids, scores)
    assert last_row.dtype == torch.bool and last_row.tolist() == [False, True, True]


def never_done(input_ids, scores):
    return torch.zeros(input_ids.shape[0], dtype=torch.bool)


@pytest.mark.parametrize("answer, error, message", [
    (lambda rows: None, TypeError, r"NoneType"),
    (lambda rows: 1, TypeError, r"int"),
    (lambda rows: [True] * rows, TypeError, r"list"),
    (lambda rows: torch.zeros(rows, 1, dtype=torch.bool), ValueError, r"torch.bool tensor of shape \(3, 1\)"),
    (lambda rows: torch.zeros(rows - 1, dtype=torch.bool), ValueError, r"torch.bool tensor of shape \(2,\)"),
    (lambda rows: torch.zeros(1, dtype=torch.bool), ValueError, r"torch.bool tensor of shape \(1,\)"),
    # transformers' criteria answer with bool tensors; a number is not read as a truth value.
    (lambda rows: torch.zeros(rows, dtype=torch.uint8), ValueError, r"torch.uint8 tensor of shape \(3,\)"),
    (lambda rows: torch.zeros(rows, dtype=torch.long), ValueError, r"torch.int64 tensor"),
    (lambda rows: torch.zeros(rows), ValueError, r"torch.float32 tensor"),
])
def test_an_answer_that_is_not_flags_is_refused_naming_the_criterion(answer, error, message) -> None:
    def broken(input_ids, scores):
        return answer(input_ids.shape[0])

    criteria = StoppingCriteriaList([EosTokenCriteria(2), never_done, broken])
    allowed = r"a bool tensor of shape \(3,\), one flag per row, or one flag for every row"
    with pytest.raises(error, match=rf"stopping_criteria \(broken\) returned (a )?{message}.*; .*{allowed}"):
        criteria(torch.ones(3, 2, dtype=torch.long), torch.zeros(3, 5))


def test_criteria_never_read_values_back_to_the_host() -> None:
    # Meta tensors have shapes but no data, so any .item(), .tolist() or `if tensor:` would raise.
    input_ids = torch.zeros(3, 6, dtype=torch.long, device="meta")
    scores = torch.zeros(3, 10, device="meta")
    criteria = StoppingCriteriaList([EosTokenCriteria([2, 3]), lambda i, s: True])
    is_done = criteria(input_ids, scores)
    assert is_done.shape == (3,) and is_done.device.type == "meta"


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: EosTokenCriteria([]), "eos_token_id"),
        (lambda: EosTokenCriteria(-1), "eos_token_id"),
        (lambda: EosTokenCriteria("2"), "eos_token_id"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(make, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        make()


def test_matches_and_mixes_with_transformers() -> None:
    stopping_criteria = pytest.importorskip("transformers.generation.stopping_criteria")
    input_ids = random_ids(0, 8, 4, 5)
    scores = torch.zeros(8, 5)
    expected = stopping_criteria.EosTokenCriteria([1, 3])(input_ids, scores)
    assert torch.equal(EosTokenCriteria([1, 3])(input_ids, scores), expected)
    mixed = StoppingCriteriaList([EosTokenCriteria(1), stopping_criteria.MaxLengthCriteria(max_length=4)])
    assert mixed(input_ids, scores).tolist() == [True] * 8
