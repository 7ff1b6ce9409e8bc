"""`hybrid convert` end to end: a plain-data checkpoint with bit-identical copies, frozen copied weights,
and a converted transformer that fine-tunes faster than the same model learns from scratch."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig

from hybrid.cli import main
from hybrid.cli.train import run_fit
from hybrid.training.checkpoint import export_checkpoint, read_checkpoint

# A transformer small enough to learn copying 1-8 letters in a few seconds: 16 steps per epoch.
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
TINY = ["experiment=copy_transformer", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "model.encoder_layers=1", "model.decoder_layers=2", "data.max_length=8", "data.train_size=512",
        "data.val_size=64", "data.test_size=64", "data.batch_size=32", "module.learning_rate=3e-3",
        "module.warmup_steps=10", "module.decode_batches=0", "trainer.accelerator=cpu", "trainer.max_epochs=-1",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "callbacks.progress_bar=null",
        "callbacks.early_stopping=null"]
PRETRAIN_STEPS, FINE_TUNE_STEPS = 160, 32


def fit(tmp_path: Path, *overrides: str):
    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, *overrides, f"paths.output_dir={tmp_path}"],
                      return_hydra_config=True)
    HydraConfig().set_config(cfg)
    return run_fit(cfg)


def validation_loss(trainer) -> float:
    return trainer.validate(trainer.lightning_module, datamodule=trainer.datamodule, verbose=False)[0]["val/loss"]


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> Path:
    """The last.ckpt of a two-layer transformer trained to copy."""
    folder = tmp_path_factory.mktemp("transformer")
    fit(folder, f"trainer.max_steps={PRETRAIN_STEPS}")
    return folder / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def converted(transformer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("converted") / "lstm.ckpt"
    main(["convert", f"ckpt_path={transformer}", "pattern=lstm", f"output={out}", "seed=3"])
    return out


def test_convert_writes_a_plain_data_checkpoint_with_bit_identical_copies(transformer, converted, capsys):
    checkpoint = torch.load(converted, weights_only=True)  # plain data and tensors only
    assert set(checkpoint) >= {"state_dict", "model_config", "tokenizer", "global_step"}
    source, target = read_checkpoint(transformer), read_checkpoint(converted)
    assert target.config.decoder_mixers == ["lstm", "lstm"]
    assert target.tokenizer.to_json_str() == source.tokenizer.to_json_str()
    fresh = set(target.config.extra["fresh_parameters"])
    assert fresh and all(name.startswith(("decoder_layers.0.mixer.", "decoder_layers.1.mixer.")) for name in fresh)
    assert target.config.extra["converted_at_step"] == PRETRAIN_STEPS
    copied = [key for key in target.state_dict if key not in fresh]
    assert len(copied) > len(fresh)
    for key in copied:
        assert torch.equal(target.state_dict[key], source.state_dict[key]), key
    assert [path.name for path in converted.parent.iterdir()] == [converted.name]  # no temporary file left


def test_convert_reads_an_exported_folder(transformer, tmp_path, capsys):
    folder = export_checkpoint(transformer, tmp_path / "exported")
    main(["convert", f"ckpt_path={folder}", "pattern=[0:lstm,1:attention]", f"output={tmp_path / 'out.ckpt'}",
          "mixer_options.lstm.hidden_size=24"])
    assert "copied unchanged" in capsys.readouterr().out
    target = read_checkpoint(tmp_path / "out.ckpt")
    assert target.config.decoder_mixers == ["lstm", "attention"] and target.config.options_for("lstm").hidden_size == 24
    assert "converted_at_step" not in target.config.extra  # an exported folder does not know its steps


def test_copied_weights_stay_frozen_for_the_first_steps(converted, tmp_path):
    trainer = fit(tmp_path, f"init_from={converted}", "trainer.max_steps=4", "callbacks.freeze_copied_weights.steps=4")
    before, model = read_checkpoint(converted), trainer.lightning_module.model
    fresh = set(before.config.extra["fresh_parameters"])
    for name, parameter in model.named_parameters():
        assert parameter.requires_grad, name  # unfrozen when training ends
        assert torch.equal(parameter.detach(), before.state_dict[name]) != (name in fresh), name


def test_converted_then_fine_tuned_beats_the_same_model_from_scratch(converted, tmp_path):
    steps = f"trainer.max_steps={FINE_TUNE_STEPS}"
    fine_tuned = fit(tmp_path / "fine_tuned", f"init_from={converted}", steps,
                     "callbacks.freeze_copied_weights.steps=8")
    scratch = fit(tmp_path / "scratch", "model.decoder_mixers=lstm", steps)
    assert fine_tuned.lightning_module.model.config.decoder_mixers == ["lstm", "lstm"]
    before = read_checkpoint(converted).state_dict
    copied = [name for name, _ in fine_tuned.lightning_module.model.named_parameters()
              if name not in fine_tuned.lightning_module.model.config.extra["fresh_parameters"]]
    assert any(not torch.equal(fine_tuned.lightning_module.model.get_parameter(name).detach(), before[name])
               for name in copied)  # trained after the 8 frozen steps
    assert validation_loss(fine_tuned) < 0.8 * validation_loss(scratch)
