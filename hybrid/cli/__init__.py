"""The ``hybrid`` command: ``hybrid VERB [KEY=VALUE ...]``, one verb per job, one grammar for all of them.

Every verb is a Hydra app with a root config in ``hybrid.configs`` (``configs/`` in the repository)
and takes Hydra overrides: ``KEY=VALUE`` sets a key (``trainer.max_epochs=3``, ``output=my-g2p``),
``GROUP=OPTION`` picks a file of a config group (``model=transformer``), ``-m`` sweeps over
comma-separated values, ``--cfg job`` prints the composed config and runs nothing, and ``--help``
lists the verb's keys. Hydra reads a comma as a sweep and brackets as a list, so a value holding
a comma is quoted for Hydra, inside the shell's quotes (``"pattern='0-1:lstm,2:attention'"``), or
given as a list (``'pattern=[0-1:lstm,2:attention]'``; the shell's quotes keep it from globbing).

``fit``, ``validate``, ``test`` and ``generate`` make a run folder (``outputs/<name>/<time>/``) with
the composed config and the log, the record of a run. The other verbs write only what they are
asked to write, in the folder they are started from (``configs/hydra/in_place.yaml``).

This module is the table of verbs and the dispatcher; each verb's entry point is a small module
beside it, imported only when that verb runs, so ``hybrid generate`` and ``hybrid export`` never
import Lightning (``tests/test_generate_without_lightning.py`` runs both with it blocked).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONFIG_PATH = "pkg://hybrid.configs"  # the installed package, so the command works from any folder
# What a verb raises for a bad option, input or file, with a message that names it: shown as that one
# line, not a trace. Anything else is a bug, and keeps Hydra's trace.
USER_ERRORS = (ValueError, TypeError, OSError)


@dataclass(frozen=True)
class Verb:
    """One verb: its root config in ``hybrid.configs``, its entry point, and its line in ``hybrid --help``."""

    config: str
    entry_point: str  # "module:function" in hybrid.cli; the function takes the composed config
    help: str


VERBS: dict[str, Verb] = {
    "fit": Verb("config", "train:run_fit", "train a model (experiment=NAME model=... trainer.max_epochs=N ...)"),
    "validate": Verb("config", "train:run_validate", "score a checkpoint on the validation split (ckpt_path=...)"),
    "test": Verb("config", "train:run_test", "score a checkpoint on the test split (ckpt_path=...)"),
    "generate": Verb("generate", "generate:run_generate",
                     "decode one source per line, in bulk (ckpt_path=... input=... output=... num_beams=N ...)"),
    "distill-data": Verb("distill_data", "distill_data:run_distill_data",
                         "the teacher's outputs for every training source, the data of sequence-level distillation "
                         "(ckpt_path=... data=... output=...)"),
    "export": Verb("export", "export:run_export",
                   "write a checkpoint as a folder that loads without Lightning or Hydra (ckpt_path=... output=...)"),
    "import": Verb("import", "importing:run_import",
                   "a transformers BART, Marian, mBART or M2M100/NLLB folder as a hybrid model (hf=... output=...)"),
    "convert": Verb("convert", "convert:run_convert",
                    "swap a trained model's decoder mixers, keep every other weight (ckpt_path=... pattern=... "
                    "output=...)"),
    "ablate": Verb("ablate", "ablate:run_ablate", "gather hybrid fit runs into a table and a Pareto plot (runs=...)"),
    "bench": Verb("bench", "bench:run_bench", "time decoding per token, every decoder side by side (bench=tiny ...)"),
    "bench-bulk": Verb("bench_bulk", "bench:run_bench_bulk",
                       "time bulk decoding, bucketed and refilled or not (g2p.limit=N ...)"),
    "demo": Verb("demo", "demo:run_demo", "time greedy decoding of small random LSTM and attention decoders"),
}


def usage() -> str:
    """What ``hybrid --help`` prints: the grammar in one line, then every verb with its line."""
    width = max(map(len, VERBS))
    verbs = "\n".join(f"  {name:<{width}}  {verb.help}" for name, verb in VERBS.items())
    return ("usage: hybrid VERB [KEY=VALUE ...] [-m] [--cfg job] [--help]\n\n"
            "A transformer encoder with an LSTM decoder: train, decode, export, convert, benchmark.\n\n"
            f"verbs:\n{verbs}\n\n"
            "Every verb takes Hydra overrides; `hybrid VERB --help` lists its keys and their defaults,\n"
            "`hybrid VERB --cfg job` prints the composed config. The configs are the package hybrid.configs.\n")


class QuietConsole(logging.Filter):
    """The console handler's filter (configs/hydra/default.yaml): hybrid's own records, and everyone's
    warnings and errors, except third-party deprecation notices. The rest (Lightning's tips and INFO
    lines, a dependency's deprecations) still reaches the run's log file; ``verbose=true`` lets all
    of it through to the console too."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbose or record.name == "hybrid" or record.name.startswith("hybrid."):
            return True
        if record.name == "py.warnings":  # warnings.warn, routed through logging by main()
            return "deprecat" not in record.getMessage().lower()
        return record.levelno >= logging.WARNING


def run_verb(name: str, overrides: Sequence[str]) -> None:
    """Run ``hybrid <name> <overrides>`` through ``hydra.main`` (run folder, logging, ``-m`` sweeps)."""
    import hydra

    verb = VERBS[name]
    if name in ("generate", "distill-data"):  # the verbs with a generation node
        from hybrid.cli.generate import qualify_generation_option

        overrides = [qualify_generation_option(override) for override in overrides]
    # An unknown key (a typo) or an unset mandatory one is refused in one line, before any run folder exists.
    from hybrid.cli.overrides import exit_on_bad_command_line

    exit_on_bad_command_line(name, verb.config, overrides)
    if name == "fit":  # a resumed fit continues in the run folder of its checkpoint
        from hybrid.cli.resume import resume_overrides

        overrides = [*overrides, *resume_overrides(verb.config, overrides)]
    command_line = [sys.argv[0], name, *overrides]
    os.environ["HYBRID_COMMAND"] = name  # hydra.job.name: names the log file and the --help header
    module_name, function_name = verb.entry_point.split(":")

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=verb.config)
    def task(cfg: Any) -> Any:
        # Lightning's DDP launcher starts each worker by rerunning sys.argv, which must name the verb.
        sys.argv = command_line
        # Imported here, once Hydra has set up logging, so whatever the import logs goes where the run's log goes.
        entry_point = getattr(importlib.import_module(f"hybrid.cli.{module_name}"), function_name)
        try:
            return entry_point(cfg)
        except USER_ERRORS as error:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            # Bad input or a bad file: the message names it, and a trace would only bury it. It also
            # reaches the run's log file, through the logger.
            logging.getLogger("hybrid.cli").error("hybrid %s: %s: %s (HYDRA_FULL_ERROR=1 shows the trace)",
                                                  name, type(error).__name__, error)
            raise SystemExit(1) from None

    saved = sys.argv
    sys.argv = [sys.argv[0], *overrides]  # where hydra.main reads its overrides
    try:
        task()
    finally:
        sys.argv = saved


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``hybrid`` console script (and of ``python -m hybrid.cli``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return
    if argv[0] not in VERBS:
        sys.stderr.write(f"hybrid: unknown verb {argv[0]!r}\n\n{usage()}")
        raise SystemExit(2)
    logging.captureWarnings(True)  # warnings become log records: the file keeps them, QuietConsole sorts them
    run_verb(argv[0], argv[1:])
