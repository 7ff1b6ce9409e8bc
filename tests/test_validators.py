"""The option checks: each accepts exactly its range, returns what it accepted, and names the option and
what is allowed when it refuses."""

import math

import pytest

from hybrid.validators import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_token_id,
    check_token_ids,
    check_token_sequences,
)


@pytest.mark.parametrize("check, value, accepted", [
    (lambda v: check_int("n", v, at_least=1), 1, 1),
    (lambda v: check_int("n", v, at_least=0), 0, 0),
    (lambda v: check_int("n", v, at_least=1, optional=True), None, None),
    (lambda v: check_float("p", v, above=0, at_most=1), 1, 1.0),
    (lambda v: check_float("p", v, at_least=0, below=1), 0.0, 0.0),
    (lambda v: check_float("s", v, above=0), 1e300, 1e300),
    (lambda v: check_float("f", v, finite=False), -math.inf, -math.inf),
    (lambda v: check_float("f", v), -3, -3.0),
    (lambda v: check_bool("b", v), False, False),
    (lambda v: check_choice("c", v, (True, False, "never")), "never", "never"),
    (lambda v: check_token_id("t", v, vocab_size=5), 4, 4),
    (lambda v: check_token_ids("t", v), 3, (3,)),
    (lambda v: check_token_ids("t", v, vocab_size=5), [4, 0], (4, 0)),
    (lambda v: check_token_sequences("w", v), [[5], (7, 8)], [(5,), (7, 8)]),
])
def test_a_value_in_range_is_returned_in_the_type_it_stands_for(check, value, accepted):
    result = check(value)
    assert result == accepted and type(result) is type(accepted)


@pytest.mark.parametrize("check, value, message", [
    (lambda v: check_int("n", v, at_least=1), 0, "n must be a positive int, got 0"),
    (lambda v: check_int("n", v, at_least=1), True, "n must be a positive int, got True"),
    (lambda v: check_int("n", v, at_least=1), 2.0, "n must be a positive int, got 2.0"),
    (lambda v: check_int("n", v, at_least=0, optional=True), -1, "n must be an int >= 0 or None, got -1"),
    (lambda v: check_float("p", v, above=0, at_most=1), 0, r"p must be a number in \(0, 1\], got 0"),
    (lambda v: check_float("p", v, above=0, at_most=1), 1.5, r"p must be a number in \(0, 1\]"),
    (lambda v: check_float("d", v, at_least=0, below=1), 1.0, r"d must be a number in \[0, 1\), got 1.0"),
    (lambda v: check_float("d", v, at_least=0, below=1), math.nan, r"d must be a number in \[0, 1\), got nan"),
    (lambda v: check_float("s", v, above=0), math.inf, "s must be a finite number > 0, got inf"),
    (lambda v: check_float("s", v, above=0), "2", "s must be a finite number > 0, got '2'"),
    (lambda v: check_float("s", v, above=0), False, "s must be a finite number > 0, got False"),
    (lambda v: check_float("f", v, finite=False, optional=True), math.nan, "f must be a number or None, got nan"),
    (lambda v: check_bool("b", v), "no", "b must be true or false, got 'no'"),
    (lambda v: check_bool("b", v, optional=True), 1, "b must be true, false or None, got 1"),
    (lambda v: check_choice("c", v, (True, False, "never")), 1, r"c must be one of \(True, False, 'never'\), got 1"),
    (lambda v: check_token_id("t", v, vocab_size=5), 5, r"t must be an id in \[0, vocab_size=5\), got 5"),
    (lambda v: check_token_id("t", v), -1, r"t must be a token id \(an int >= 0\), got -1"),
    (lambda v: check_token_ids("t", v, optional=True), [], "t must be a token id .*, a non-empty list of them or None"),
    (lambda v: check_token_ids("t", v), "2", "t must be a token id .* or a non-empty list of them, got '2'"),
    (lambda v: check_token_ids("t", v, vocab_size=5), [2, 5], r"t must be an id in \[0, vocab_size=5\) or a non"),
    (lambda v: check_token_sequences("w", v), [], r"w must be a non-empty list of non-empty lists of token ids"),
    (lambda v: check_token_sequences("w", v), [[]], r"w must be a non-empty list of non-empty lists"),
    (lambda v: check_token_sequences("w", v), [5], r"w must be a non-empty list of non-empty lists"),
    (lambda v: check_token_sequences("w", v), ["ab"], r"w must be a non-empty list of non-empty lists"),
])
def test_a_value_out_of_range_is_refused_naming_the_option_and_what_is_allowed(check, value, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        check(value)
