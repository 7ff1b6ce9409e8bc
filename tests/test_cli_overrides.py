"""The command line is checked before a verb runs: an unknown key, with or without a plus, and an unset
mandatory key each end the command in one line that names the key (hybrid.cli.overrides)."""

import ast
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from hybrid.cli import VERBS
from hybrid.cli.overrides import CommandLineError, check_command_line, nearest_keys
from hybrid.records import read_parallel_file
from hybrid.training import LitSeq2Seq

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("verb", "config", "arguments", "named"), [
    ("generate", "generate", ["ckpt_path=m", "num_beam=4"], "generation.num_beams"),  # bare, as generate takes them
    ("generate", "generate", ["ckpt_path=m", "+num_beam=4"], "generation.num_beams"),
    ("generate", "generate", ["ckpt_path=m", "++num_beam=4"], "generation.num_beams"),
    ("generate", "generate", ["ckpt_path=m", "+generation.num_beam=4"], "generation.num_beams"),
    ("fit", "config", ["trainer.max_epoch=3"], "trainer.max_epochs"),
    ("fit", "config", ["max_epochs=3"], "trainer.max_epochs"),  # its node left off
    ("fit", "config", ["+model.d_modle=64"], "model.d_model"),  # model.* is ModelConfig's fields: closed
    ("fit", "config", ["+trainer.profilr=simple"], "trainer.profiler"),  # checked against Trainer's arguments
    ("fit", "config", ["+callbacks.early_stopping.min_dela=1"], "callbacks.early_stopping.min_delta"),
    ("fit", "config", ["experiment=quickstart", "+data.max_word=10"], "data.max_words"),  # the group's keys
    ("fit", "config", ["experiment=quickstart", "+data.max_source_lenght=10"], "data.max_source_length"),  # a base's
    ("fit", "config", ["~module.warmup_step"], "module.warmup_steps"),
    ("fit", "config", ["+callbacks.kill.step=6"], "callbacks"),  # a new callback must start with its _target_
])
def test_an_unknown_key_is_refused_naming_the_nearest_valid_keys(verb, config, arguments, named):
    with pytest.raises(CommandLineError, match="unknown key") as refused:
        check_command_line(verb, config, arguments)
    assert named in str(refused.value).split("did you mean")[1]
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("verb", "config", "arguments"), [
    ("fit", "config", ["+trainer.profiler=simple"]),  # the README: any Trainer argument, with a plus
    ("fit", "config", ["+callbacks.early_stopping.min_delta=100", "callbacks.early_stopping.patience=1"]),
    ("fit", "config", ["+callbacks.timer._target_=lightning.pytorch.callbacks.Timer",  # a new callback, then its
                       "+callbacks.timer.duration=00:00:01:00"]),  # arguments
    ("fit", "config", ["+callbacks.kill._target_=__main__.KillMidStep", "+callbacks.kill.step=6"]),  # not importable
    ("fit", "config", ["+callbacks.timer={_target_: lightning.pytorch.callbacks.Timer, duration: '00:00:01:00'}"]),
    ("fit", "config", ["++trainer.max_epochs=2", "++trainer.detect_anomaly=true", "~callbacks.progress_bar"]),
    ("fit", "config", ["-m", "model=transformer,hybrid", "seed=0,1,2"]),
    ("fit", "config", ["experiment=copy_hybrid", "data.train_size=64", "trainer.max_time=00:00:10:00"]),
    ("fit", "config", ["data=text", "data.train_path=pairs.tsv", "logger=[csv,tensorboard]"]),
    ("fit", "config", ["hydra.run.dir=elsewhere", "hydra.job.chdir=true", "hydra/launcher=basic"]),
    ("fit", "config", ["experiment=quickstart", "+data.max_source_length=10"]),  # passed on to the data module's base
    ("generate", "generate", ["ckpt_path=m", "generation=beam", "generation.top_k=3", "input=words.txt"]),
    ("export", "export", ["--cfg", "job"]),  # prints the config, ??? and all
    ("export", "export", ["--help"]),
])
def test_the_documented_overrides_pass(verb, config, arguments):
    check_command_line(verb, config, arguments)


def test_a_plus_on_a_key_the_config_has_says_to_drop_the_plus():
    with pytest.raises(CommandLineError, match=r"trainer.max_epochs is already in the config: set it without"):
        check_command_line("fit", "config", ["+trainer.max_epochs=3"])


@pytest.mark.parametrize(("verb", "config", "arguments", "named"), [
    ("generate", "generate", [], "ckpt_path=<a training checkpoint (.ckpt) or a folder written by `hybrid export`>"),
    ("export", "export", ["ckpt_path=x.ckpt"], "output=<the folder to write"),
    ("fit", "config", ["data=text"], "data.train_path=<a value>"),
    ("fit", "config", ["-m", "data=text,g2p"], "data.train_path"),  # a sweep, checked at its first value
])
def test_a_missing_mandatory_key_is_named_with_what_to_give(verb, config, arguments, named):
    with pytest.raises(CommandLineError, match="must be given") as refused:
        check_command_line(verb, config, arguments)
    assert named in str(refused.value)


def test_nearest_keys_match_a_key_typed_without_its_nodes():
    valid = ["trainer.max_epochs", "trainer.min_epochs", "generation.num_beams", "seed"]
    assert nearest_keys("num_beam", valid) == ["generation.num_beams"]
    assert nearest_keys("trainer.max_epoch", valid)[0] == "trainer.max_epochs"
    assert nearest_keys("learning_rate", valid) == []


@pytest.mark.parametrize(("arguments", "named"), [
    (["generate", "ckpt_path=m", "+num_beam=4"], "hybrid generate: unknown key 'num_beam'"),  # was run, ignored
    (["export"], "hybrid export: ckpt_path and output must be given"),
])
def test_the_command_ends_in_one_line_and_makes_no_run_folder(tmp_path, arguments, named):
    result = subprocess.run([sys.executable, "-m", "hybrid.cli", *arguments], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(named) and result.stderr.count("\n") == 1, result.stderr
    assert not list(tmp_path.iterdir())


def hints() -> list[tuple[str, str]]:
    """Every dotted ``node.key=`` in a message hybrid raises, logs or prints, with the file it is in."""
    found = []
    for path in sorted((ROOT / "hybrid").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            is_message = isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and getattr(
                node.func, "attr", getattr(node.func, "id", None)) in ("print", "info", "warning", "error"))
            for part in ast.walk(node) if is_message else ():
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found += [(path.name, key) for key in re.findall(r"(?<![\w.])([a-z_]+(?:\.[a-z_]+)+)=", part.value)]
    return found


def test_every_key_a_message_tells_the_user_to_set_is_a_key_of_a_verb():
    def keys(tree: dict, prefix: str = ""):
        for name, value in tree.items():
            yield prefix + name
            if isinstance(value, dict):
                yield from keys(value, f"{prefix}{name}.")

    valid = set()
    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        for name, overrides in [(verb.config, []) for verb in VERBS.values()] + [("config", ["data=text"])]:
            valid |= set(keys(OmegaConf.to_container(compose(name, overrides=overrides), resolve=False)))
    found = hints()
    assert ("base.py", "data.too_long") in found  # the collector sees messages
    assert [(file, key) for file, key in found if key not in valid] == []


def test_a_parallel_file_of_no_known_format_names_data_format_and_an_empty_one_says_so(tmp_path):
    (tmp_path / "pairs.csv").write_text("no tab here\n")
    with pytest.raises(ValueError, match=r"pairs\.csv: .* give data\.format=tsv or data\.format=jsonl$"):
        read_parallel_file(tmp_path / "pairs.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match=r"empty\.csv is empty"):
        read_parallel_file(tmp_path / "empty.csv")


def test_a_cosine_schedule_without_a_training_length_names_the_module_and_trainer_keys():
    module = LitSeq2Seq(dict(vocab_size=8, d_model=8, n_heads=2, d_ff=16, encoder_layers=1, decoder_layers=1))
    module._trainer = SimpleNamespace(estimated_stepping_batches=float("inf"))  # max_epochs=-1 and no max_steps
    with pytest.raises(ValueError, match=r"module\.lr_schedule=cosine .* trainer\.max_steps .* module\.lr_schedule="):
        module.configure_optimizers()
