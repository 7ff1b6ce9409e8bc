"""Checks for user-supplied options, each raising ValueError naming the option and what is allowed.

Every message reads ``<name> must be <what is allowed>, got <value>`` and starts with the name, so a
caller that knows where an option sits can prefix it (``mixer_options.lstm.hidden_size``). Each check
returns the value it accepted, in the type it stands for (an int, a float, a tuple of token ids), so a
caller can keep what it checked; with ``optional=True`` None is allowed too, and returned as it is.

A bool is never a number here, although Python counts it as an int: ``top_k=True`` is a mistake, not 1.
Numbers are Python's own (an int, or a float, of which NumPy's float64 is one), so whatever passes stays
JSON-safe. NaN fails every range, and a range left open on one side still refuses infinity unless it
says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _refuse(name: str, allowed: list[str], value: object, optional: bool) -> ValueError:
    """The one wording of every refusal, its ``allowed`` alternatives (and None) listed as "a, b or c"."""
    alternatives = [*allowed, "None"] if optional else allowed
    listed = alternatives[-1] if len(alternatives) == 1 else f"{', '.join(alternatives[:-1])} or {alternatives[-1]}"
    return ValueError(f"{name} must be {listed}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, *, at_least: int, optional: bool = False) -> int | None:
    """``value`` as an int if it is an int >= ``at_least`` (or None, if ``optional``), else a ValueError
    saying "a positive int" for ``at_least=1`` and "an int >= n" otherwise."""
    if optional and value is None:
        return None
    if not _is_int(value) or value < at_least:
        allowed = "a positive int" if at_least == 1 else f"an int >= {at_least}"
        raise _refuse(name, [allowed], value, optional)
    return int(value)


def check_float(name: str, value: object, *, above: float | None = None, at_least: float | None = None,
                below: float | None = None, at_most: float | None = None, finite: bool = True,
                optional: bool = False) -> float | None:
    """``value`` as a float if it is a number (an int will do) within the bounds given, else a
    ValueError stating them: ``above``/``at_least`` bound it from below (exclusive/inclusive),
    ``below``/``at_most`` from above. ``finite=False`` lets an unbounded side reach infinity (a score
    that may be -inf); NaN is always refused."""
    if optional and value is None:
        return None
    low, high = _bound(above, at_least), _bound(below, at_most)
    number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    fits = (not math.isnan(number)
            and (low is None or number > low[0] or (low[1] and number == low[0]))
            and (high is None or number < high[0] or (high[1] and number == high[0]))
            and (not finite or math.isfinite(number)))
    if not fits:
        raise _refuse(name, [_describe_range(low, high, finite)], value, optional)
    return number


def _bound(exclusive: float | None, inclusive: float | None) -> tuple[float, bool] | None:
    """(bound, whether the bound itself is allowed), or None where the side is open."""
    if exclusive is not None and inclusive is not None:
        raise TypeError("give a bound either exclusive or inclusive, not both")
    if exclusive is not None:
        return float(exclusive), False
    return None if inclusive is None else (float(inclusive), True)


def _describe_range(low: tuple[float, bool] | None, high: tuple[float, bool] | None, finite: bool) -> str:
    if low is not None and high is not None:  # an interval: "a number in (0, 1]"
        return f"a number in {'[' if low[1] else '('}{low[0]:g}, {high[0]:g}{']' if high[1] else ')'}"
    number = "a finite number" if finite else "a number"
    if low is not None:
        return f"{number} {'>=' if low[1] else '>'} {low[0]:g}"
    if high is not None:
        return f"{number} {'<=' if high[1] else '<'} {high[0]:g}"
    return number


def check_bool(name: str, value: object, *, optional: bool = False) -> bool | None:
    """``value`` if it is True or False (or None, if ``optional``): a string such as "no" is refused,
    since it would read as true."""
    if optional and value is None:
        return None
    if not isinstance(value, bool):
        raise _refuse(name, ["true", "false"], value, optional)
    return value


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it equals one of ``choices`` and has its type (so ``1`` is not ``True``), else a
    ValueError listing them."""
    if not any(isinstance(value, type(choice)) and value == choice for choice in choices):
        raise _refuse(name, [f"one of {tuple(choices)}"], value, False)
    return value


def _is_token_id(value: object, vocab_size: int | None) -> bool:
    return _is_int(value) and value >= 0 and (vocab_size is None or value < vocab_size)


def _token_id_range(vocab_size: int | None) -> str:
    return "a token id (an int >= 0)" if vocab_size is None else f"an id in [0, vocab_size={vocab_size})"


def check_token_id(name: str, value: object, *, vocab_size: int | None = None, optional: bool = False) -> int | None:
    """``value`` as an int if it is a token id: an int >= 0, and below ``vocab_size`` when given."""
    if optional and value is None:
        return None
    if not _is_token_id(value, vocab_size):
        raise _refuse(name, [_token_id_range(vocab_size)], value, optional)
    return int(value)


def check_token_ids(name: str, value: object, *, vocab_size: int | None = None,
                    optional: bool = False) -> tuple[int, ...] | None:
    """A token id or a non-empty list of them (as :func:`check_token_id`), as a tuple of ints: the form
    of ``eos_token_id``, where any one of several ids may end a sequence."""
    if optional and value is None:
        return None
    ids = (value,) if _is_int(value) else value
    if not (_is_sequence(ids) and len(ids) > 0 and all(_is_token_id(i, vocab_size) for i in ids)):
        raise _refuse(name, [_token_id_range(vocab_size), "a non-empty list of them"], value, optional)
    return tuple(int(i) for i in ids)


def check_token_sequences(name: str, value: object, *, optional: bool = False) -> list[tuple[int, ...]] | None:
    """A non-empty list of non-empty lists of token ids (``bad_words_ids``), as a list of tuples of ints."""
    if optional and value is None:
        return None
    if not (_is_sequence(value) and len(value) > 0 and all(
            _is_sequence(word) and len(word) > 0 and all(_is_token_id(i, None) for i in word) for word in value)):
        raise _refuse(name, ["a non-empty list of non-empty lists of token ids (ints >= 0), e.g. [[5], [7, 8]]"],
                      value, optional)
    return [tuple(int(i) for i in word) for word in value]


def _is_sequence(value: object) -> bool:
    """A list or tuple of items; a string is a sequence of characters, not of ids."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))
