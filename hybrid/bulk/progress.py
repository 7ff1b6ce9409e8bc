"""A bulk job's progress on standard error: a Rich bar with sequences/s, tokens/s and ETA, and a summary line."""

from __future__ import annotations

import time


class BulkProgress:
    """A Rich progress bar on standard error with sequences/s, tokens/s and ETA, and a summary line.

    ``total`` is the number of sequences to decode (None when unknown: standard input); ``enabled=False``
    hides the bar but still counts, for the summary."""

    def __init__(self, total: int | None, enabled: bool = True, description: str = "decoding") -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.sequences = self.tokens = 0
        self.begin = time.perf_counter()
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rates]}"), TimeElapsedColumn(), TextColumn("ETA"),
                            TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled)
        self.task = self.bar.add_task(description, total=total, rates="")

    def __enter__(self) -> BulkProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def rates(self) -> tuple[float, float, float]:
        """Seconds since the start, then sequences and tokens decoded per second."""
        seconds = max(time.perf_counter() - self.begin, 1e-9)
        return seconds, self.sequences / seconds, self.tokens / seconds

    def advance(self, sequences: int, tokens: int) -> None:
        """Count ``sequences`` more decoded sequences holding ``tokens`` tokens."""
        self.sequences += sequences
        self.tokens += tokens
        _, per_second, tokens_per_second = self.rates()
        self.bar.update(self.task, advance=sequences,
                        rates=f"{per_second:,.1f} seq/s {tokens_per_second:,.0f} tok/s")

    def summary(self) -> str:
        """One line for the log: how much was decoded, in how long, at what rates."""
        seconds, per_second, tokens_per_second = self.rates()
        return (f"decoded {self.sequences:,} sequences ({self.tokens:,} tokens) in {seconds:.1f} s: "
                f"{per_second:,.1f} sequences/s, {tokens_per_second:,.0f} tokens/s")
