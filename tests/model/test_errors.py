"""Bad input fails early with a message that names the problem, never deep inside torch."""

import pytest
import torch
from conftest import VOCAB, padded_batch, tiny_model

SRC = padded_batch([4, 2])
TGT = padded_batch([3, 3])


@pytest.fixture(scope="module")
def model():
    return tiny_model(["lstm", "attention"])


ENTRY_POINTS = {
    "forward": lambda model, src, mask=None: model(src, TGT, mask),
    "start": lambda model, src, mask=None: model.start(src, mask, max_steps=4),
    "generate": lambda model, src, mask=None: model.generate(src, mask, max_new_tokens=4),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("src, error, message", [
    (SRC.float(), TypeError, "integer token ids"),
    (SRC.bool(), TypeError, "integer token ids"),
    (SRC[0], ValueError, r"shape \[batch, length\]"),
    (SRC[None], ValueError, r"shape \[batch, length\]"),
    (SRC - 5, ValueError, r"id -\d+; ids must lie in \[0, vocab_size=13\)"),
    (SRC + VOCAB, ValueError, r"ids must lie in \[0, vocab_size=13\)"),
    (torch.tensor([[3, 4], [0, 0]]), ValueError, r"source rows \[1\] are all padding"),
    ([[3, 4]], TypeError, "torch.Tensor"),
])
def test_bad_source_ids(model, entry, src, error, message):
    with pytest.raises(error, match=message):
        ENTRY_POINTS[entry](model, src)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("mask, message", [
    (torch.ones(2, 3, dtype=torch.bool), r"src_mask has shape \(2, 3\) but src_ids has shape \(2, 4\)"),
    (torch.full((2, 4), 2), "0 \\(padding\\) or 1 \\(token\\)"),
    (torch.ones(2, 4) * 0.5, "0 \\(padding\\) or 1 \\(token\\)"),
    (torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), r"source rows \[1\] are all padding"),
])
def test_bad_source_mask(model, entry, mask, message):
    with pytest.raises(ValueError, match=message):
        ENTRY_POINTS[entry](model, SRC, mask)


def test_integer_mask_is_accepted_like_a_bool_mask(model):
    mask = (SRC != 0).long()
    assert torch.equal(model(SRC, TGT, mask), model(SRC, TGT, mask.bool()))


@pytest.mark.parametrize("bad", [0, -3, 1025])
@pytest.mark.parametrize("entry, name", [("start", "max_steps"), ("generate", "max_new_tokens")])
def test_lengths_out_of_range(model, entry, name, bad):
    call = model.start if entry == "start" else model.generate
    message = rf"{name} must be (in \[1, max_positions=1024\]|a positive int, got -?\d)"
    with pytest.raises(ValueError, match=message):
        call(SRC, **{name: bad})


def test_target_ids_are_checked(model):
    with pytest.raises(ValueError, match=r"tgt_ids contains id \d+; ids must lie in"):
        model(SRC, TGT + VOCAB - 3)


@pytest.mark.parametrize("rows", [1, 3])
def test_forward_wants_one_target_row_per_source(model, rows):
    with pytest.raises(ValueError, match=rf"tgt_ids has {rows} rows but src_ids has 2"):
        model(SRC, TGT[:1].repeat(rows, 1))


@pytest.mark.parametrize("index, message", [
    (torch.tensor([0, 2]), r"outside \[0, 2\)"),
    (torch.tensor([-1]), r"outside \[0, 2\)"),
    (torch.tensor([True, False]), "integer row numbers"),
    (torch.tensor([0.0]), "integer row numbers"),
])
def test_reorder_names_a_bad_index(model, index, message):
    state = model.start(SRC, max_steps=2)
    with pytest.raises(ValueError, match=message):
        state.reorder(index)


def test_step_checks_ids_and_batch_size(model):
    state = model.start(SRC, max_steps=2)
    with pytest.raises(ValueError, match=r"token_ids has 3 rows but the state holds 2 sequences"):
        model.step(torch.tensor([1, 1, 1]), state)
    with pytest.raises(ValueError, match=r"token_ids contains id 99"):
        model.step(torch.tensor([1, 99]), state)
    with pytest.raises(ValueError, match=r"shape \[batch\]"):
        model.step(torch.tensor([[1, 1]]), state)


def test_step_past_the_allocated_length_is_refused(model):
    state = model.start(SRC, max_steps=2)
    model.step(torch.tensor([1, 1]), state)
    model.step(torch.tensor([5, 5]), state)
    with pytest.raises(ValueError, match="decoding state is full.*max_steps=2"):
        model.step(torch.tensor([5, 5]), state)


def test_source_longer_than_max_positions(model):
    long = torch.full((1, 1025), 5)
    with pytest.raises(ValueError, match=r"source length must be in \[1, max_positions=1024\]"):
        model.start(long, max_steps=2)
