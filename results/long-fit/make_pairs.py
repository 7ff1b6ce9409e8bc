"""Write the long-fit dataset: English names of distinct integers and their digits, one `words<TAB>digits` pair
a line.

Deterministic (a seeded sample of 0..999,999), so every run of results/long-fit/run.sh trains on the same
file: `python results/long-fit/make_pairs.py outputs/long-fit/pairs.tsv` writes 250,000 pairs such as
`forty thousand five hundred seventeen<TAB>4 0 5 1 7`. A seq2seq task of a real dataset's size, whose sources
(52 characters on average) are read whole and whose targets (at most 6 digits, space-separated) are
short, so that decoding the whole test split stays a small part of the run. (The other direction would outrun
the decoding bound of module.max_new_tokens: null, twice the source's length plus 10.)
"""

import argparse
import random
from pathlib import Path

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def below_thousand(n: int) -> list[str]:
    """The words of 1 <= n < 1000, without "and" (American usage)."""
    words = []
    if n >= 100:
        words += [ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(TENS[n // 10] + (f"-{ONES[n % 10]}" if n % 10 else ""))
    elif n:
        words.append(ONES[n])
    return words


def spell(n: int) -> str:
    """The English name of 0 <= n < 1,000,000: 40517 -> "forty thousand five hundred seventeen"."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"spell takes 0 <= n < 1,000,000, got {n}")
    if n == 0:
        return ONES[0]
    thousands, rest = divmod(n, 1000)
    words = [*below_thousand(thousands), "thousand"] if thousands else []
    return " ".join(words + below_thousand(rest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the TSV file to write")
    parser.add_argument("--pairs", type=int, default=250_000, help="how many distinct numbers (at most 1,000,000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    numbers = random.Random(args.seed).sample(range(1_000_000), args.pairs)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    # Digits apart, so that the text task's BLEU (over words) scores digit n-grams, not whole numbers.
    args.output.write_text("".join(f"{spell(n)}\t{' '.join(str(n))}\n" for n in numbers))


if __name__ == "__main__":
    main()
