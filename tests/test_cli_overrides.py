"""The command line is checked before a verb runs: an unknown key, with or without a plus, and an unset
mandatory key each end the command in one line that names the key (hybrid.cli.overrides)."""

import subprocess
import sys

import pytest

from hybrid.cli.overrides import CommandLineError, check_command_line, nearest_keys


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
