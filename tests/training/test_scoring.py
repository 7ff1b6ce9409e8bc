"""How training scores what it decodes: the sequence metrics, the closest reference and the greedy length limit."""

import pytest

from hybrid.training.scoring import (
    SEQUENCE_METRICS,
    ExactMatch,
    SequenceErrorRate,
    closest_reference,
    greedy_length_limit,
)


def test_exact_match_and_sequence_error_rate():
    match, errors = ExactMatch(), SequenceErrorRate()
    for metric in (match, errors):
        metric.update(["HH AH0 L OW1", "K AE1 T"], ["HH AH0 L OW1", "K AE1 T S"])
        metric.update(["D AO1 G"], ["D AO1 G"])
    assert match.compute().item() == pytest.approx(2 / 3)
    assert errors.compute().item() == pytest.approx(1 / 3)


def test_phoneme_error_rate_counts_phoneme_edits():
    per = SEQUENCE_METRICS["per"]()
    per.update(["HH EH0 L OW1", "K AE1 T"], ["HH AH0 L OW1", "K AE1 T"])  # one substitution in seven phonemes
    assert per.compute().item() == pytest.approx(1 / 7)


def test_the_closest_reference_is_the_fewest_token_edits_away_and_the_first_on_a_tie():
    either = ["T AH M EY T OW", "T AH M AA T OW"]  # "tomato": two valid pronunciations
    assert closest_reference("T AH M AA T OW", either) == either[1]
    assert closest_reference("T AH M AA T", either) == either[1]  # one deletion against two edits
    assert closest_reference("T AH M IY T OW", either) == either[0]  # one substitution from each
    assert closest_reference("", ["A B", "C"]) == "C"
    assert closest_reference("A B C", ["X"]) == "X"


def test_a_greedy_decoding_takes_twice_the_source_plus_10_tokens_within_the_decoders_positions():
    assert greedy_length_limit(3, max_positions=64) == 16
    assert greedy_length_limit(40, max_positions=64) == 63  # bos takes one of the 64 positions
    assert greedy_length_limit(3, max_positions=64, max_new_tokens=5) == 5
    assert greedy_length_limit(3, max_positions=4, max_new_tokens=5) == 3
