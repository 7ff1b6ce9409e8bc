"""`hybrid generate` and `hybrid export` import no Lightning: both run in a process where importing it fails.

The child process puts a finder in front of ``sys.meta_path`` that refuses ``lightning``, ``pytorch_lightning``
and ``lightning_fabric`` and records every attempt, so an import that a ``try``/``except ImportError`` would
swallow is caught too. In it, ``hybrid generate`` decodes a file with a tiny training checkpoint, ``hybrid
export`` writes the checkpoint as a model folder, and that folder is loaded and decodes a source.
"""

import json
import subprocess
import sys
import textwrap

from conftest import decode_alone, tiny_model

from hybrid.tokenizer import Seq2SeqTokenizer
from hybrid.training.checkpoint import write_checkpoint

SOURCES = ["abc", "cab", "b"]

CHILD = textwrap.dedent('''
    import json, sys

    import torch

    attempts = []

    class NoLightning:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric"):
                attempts.append(name)
                raise ImportError(f"{name} is blocked: hybrid generate must not import Lightning")
            return None

    sys.meta_path.insert(0, NoLightning())

    import hybrid.cli.export  # noqa: F401  (what the verbs import at module level)
    import hybrid.cli.generate  # noqa: F401
    from hybrid.cli import main
    from hybrid.training.checkpoint import load_for_inference

    for verb in (["generate", "ckpt_path=tiny.ckpt", "input=sources.txt", "output=predictions.txt",
                  "max_new_tokens=6", "progress=false"], ["export", "ckpt_path=tiny.ckpt", "output=exported"]):
        try:
            main(verb)
        except SystemExit as stop:  # hydra.main exits only on an error
            sys.exit(f"hybrid {verb[0]} failed ({stop.code}); Lightning imports attempted: {attempts}")
    model, tokenizer = load_for_inference("exported")
    ids = model.generate(torch.tensor([tokenizer.encode_source("abc")]), max_new_tokens=6)
    print(json.dumps({"attempts": attempts, "exported": tokenizer.decode(ids[0])}))
''')


def test_generate_and_export_run_and_an_exported_folder_decodes_with_lightning_blocked(tmp_path):
    tokenizer = Seq2SeqTokenizer.train(["abc"], ["abc"])
    model = tiny_model(["lstm"], vocab_size=tokenizer.vocab_size)
    write_checkpoint(model, tokenizer, tmp_path / "tiny.ckpt")
    (tmp_path / "sources.txt").write_text("".join(f"{source}\n" for source in SOURCES))

    result = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["attempts"] == []
    expected = [decode_alone(model, tokenizer, source, max_new_tokens=6) for source in SOURCES]
    assert (tmp_path / "predictions.txt").read_text().splitlines() == expected
    assert report["exported"] == expected[0]
