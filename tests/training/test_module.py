"""LitSeq2Seq: loss, schedule, metrics, checkpoints that load with weights_only, and real learning."""

import math

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger

from hybrid import ModelConfig, Seq2Seq
from hybrid.tokenizer import Seq2SeqTokenizer
from hybrid.training import LitSeq2Seq, SyntheticDataModule, collate
from hybrid.training.checkpoint import export_checkpoint, read_checkpoint
from hybrid.training.data import G2PDataModule
from hybrid.training.module import capped_warmup_steps, lr_multiplier

TINY_MODEL = dict(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0)


def _datamodule(**overrides) -> SyntheticDataModule:
    options = dict(task="copy", max_length=6, num_symbols=6, train_size=64, val_size=24, test_size=24, batch_size=8)
    return SyntheticDataModule(**{**options, **overrides})


def _module(datamodule, mixer="lstm", **options) -> LitSeq2Seq:
    config = dict(TINY_MODEL, vocab_size=datamodule.vocab_size, decoder_mixers=mixer)
    return LitSeq2Seq(config, tokenizer=datamodule.tokenizer, **{"metrics": ["exact_match", "cer"], **options})


def _trainer(tmp_path, **options) -> Trainer:
    defaults = dict(accelerator="cpu", devices=1, default_root_dir=tmp_path, logger=CSVLogger(tmp_path),
                    enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    return Trainer(**{**defaults, **options})


# ----- schedule ----------------------------------------------------------------------------


def test_warmup_is_linear_then_each_schedule_takes_over():
    assert lr_multiplier(0, "cosine", 10, 110, 0.1) == pytest.approx(0.1)
    assert lr_multiplier(9, "cosine", 10, 110, 0.1) == pytest.approx(1.0)
    assert lr_multiplier(10, "cosine", 10, 110, 0.1) == pytest.approx(1.0)
    assert lr_multiplier(60, "cosine", 10, 110, 0.1) == pytest.approx(0.55)
    assert lr_multiplier(110, "cosine", 10, 110, 0.1) == pytest.approx(0.1)
    assert lr_multiplier(500, "cosine", 10, 110, 0.1) == pytest.approx(0.1)  # stays at the floor
    assert lr_multiplier(40, "inverse_sqrt", 10, math.inf, 0.1) == pytest.approx(0.5)
    assert lr_multiplier(10**6, "constant", 10, math.inf, 0.1) == 1.0
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_multiplier(50, "linear", 10, 100, 0.0)


def test_warmup_is_capped_at_a_fraction_of_the_planned_steps():
    assert capped_warmup_steps(500, 129, 0.2) == 26  # rounded up
    assert capped_warmup_steps(500, 10_000, 0.2) == 500  # a long run keeps its warm-up
    assert capped_warmup_steps(500, 129, None) == 500
    assert capped_warmup_steps(500, math.inf, 0.2) == 500  # no planned length to take a fraction of


def test_a_warmup_longer_than_the_run_is_capped_so_the_peak_is_reached(tmp_path):
    # 10 planned steps against 500 of warm-up: capped at 2, the rate is at its peak from the third step on.
    datamodule = _datamodule()
    module = _module(datamodule, learning_rate=1e-2, warmup_steps=500, lr_schedule="constant", decode_batches=0)
    trainer = _trainer(tmp_path, max_steps=10, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-2)


def test_optimizer_steps_the_schedule_and_decays_only_matrices(tmp_path):
    datamodule = _datamodule()
    module = _module(datamodule, learning_rate=1e-2, warmup_steps=4, lr_schedule="constant", weight_decay=0.1,
                     decode_batches=0)
    trainer = _trainer(tmp_path, max_steps=3, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    decayed, undecayed = trainer.optimizers[0].param_groups
    assert decayed["lr"] == pytest.approx(1e-2 * 4 / 4)  # three steps taken: the rate for the fourth
    assert trainer.lr_scheduler_configs[0].interval == "step"
    assert decayed["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decayed["params"])
    assert undecayed["weight_decay"] == 0.0 and all(p.dim() < 2 for p in undecayed["params"])
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(module.parameters()))


# ----- loss and metrics ----------------------------------------------------------------------


def test_loss_ignores_padding():
    datamodule = _datamodule()
    datamodule.setup()
    module = _module(datamodule, label_smoothing=0.1).eval()
    batch = collate(datamodule.datasets["train"][:4])
    padded = dict(batch)
    extra = torch.zeros(4, 3, dtype=torch.long)  # three more pad columns on the target side
    padded["tgt_in"] = torch.cat([batch["tgt_in"], extra], dim=1)
    padded["tgt_out"] = torch.cat([batch["tgt_out"], extra], dim=1)
    with torch.no_grad(), pytest.warns(UserWarning, match="self.log"):
        assert torch.allclose(module._common_step(batch, "train")[0], module._common_step(padded, "train")[0])


def test_a_prediction_matching_any_reference_is_no_error():
    datamodule = G2PDataModule(max_words=64, stress=False)
    datamodule.setup()
    torch.manual_seed(0)  # weights that predict a phoneme for each word: an empty one would score 0 edits / 0 = NaN
    module = LitSeq2Seq(dict(TINY_MODEL, vocab_size=datamodule.vocab_size), tokenizer=datamodule.tokenizer,
                        metrics=["exact_match", "per", "wer"]).eval()
    batch = collate(datamodule.datasets["test"][:3])
    predictions = module.tokenizer.batch_decode(module.decode(batch["src_ids"], batch["src_mask"]))
    assert all(predictions), predictions
    batch["tgt_references"] = [[target, prediction]
                               for target, prediction in zip(batch["tgt_text"], predictions, strict=True)]
    with torch.no_grad(), pytest.warns(UserWarning, match="self.log"):
        module._score_decoding(batch, "test", decode=True)
    assert module.sequence_metrics["test_exact_match"].compute().item() == 1.0
    assert module.sequence_metrics["test_per"].compute().item() == 0.0
    assert module.sequence_metrics["test_wer"].compute().item() == 0.0


@pytest.mark.parametrize("option, match", [(dict(metrics=["bleu", "rouge"]), "rouge"),
                                           (dict(lr_schedule="linear"), "lr_schedule"),
                                           (dict(decode_batches=-1), "decode_batches"),
                                           (dict(max_warmup_fraction=0.0), "max_warmup_fraction")])
def test_bad_options_are_refused(option, match):
    with pytest.raises(ValueError, match=match):
        _module(_datamodule(), **option)


def test_validation_decodes_its_first_batches_and_says_how_many_and_test_decodes_every_batch(tmp_path, monkeypatch):
    datamodule = _datamodule()
    module = _module(datamodule, decode_batches=2, warmup_steps=2)
    decoded = []
    original = module.decode
    monkeypatch.setattr(module, "decode", lambda src, mask: decoded.append(len(src)) or original(src, mask))
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=datamodule)
    assert decoded == [8, 8]  # 3 validation batches, the first 2 decoded
    logged = trainer.callback_metrics
    for stage in ("train", "val"):
        assert {f"{stage}/loss", f"{stage}/accuracy", f"{stage}/perplexity"} <= {k.removesuffix("_epoch")
                                                                                  for k in logged}
    assert {"val/exact_match", "val/cer"} <= set(logged)
    assert (logged["val/decoded_examples"], logged["val/examples"]) == (16, 24)

    decoded.clear()
    test_metrics = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    assert decoded == [8, 8, 8]  # the whole test split, whatever decode_batches says
    assert {"test/loss", "test/accuracy", "test/perplexity", "test/exact_match", "test/cer"} <= set(test_metrics)
    assert test_metrics["test/decoded_examples"] == test_metrics["test/examples"] == 24


def test_validation_decoding_never_asks_for_more_than_max_positions():
    datamodule = _datamodule()
    config = dict(TINY_MODEL, vocab_size=datamodule.vocab_size, max_positions=16)
    module = LitSeq2Seq(config, tokenizer=datamodule.tokenizer).eval()
    src = torch.full((2, 12), 4)  # twice 12 plus 10 new tokens would pass the decoder's 16 positions
    assert module.decode(src, src.ne(0)).shape[1] <= 15


# ----- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_is_plain_data_and_restores_model_and_tokenizer(tmp_path):
    datamodule = _datamodule()
    module = _module(datamodule, decode_batches=0, warmup_steps=2)
    trainer = _trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)

    checkpoint = torch.load(path, weights_only=True)  # no pickled objects anywhere
    assert checkpoint["model_config"] == module.model.config.to_dict()
    assert Seq2SeqTokenizer.from_json_str(checkpoint["tokenizer"]).to_json_str() == datamodule.tokenizer.to_json_str()

    reloaded = LitSeq2Seq.load_from_checkpoint(path, weights_only=True)
    assert reloaded.tokenizer.to_json_str() == datamodule.tokenizer.to_json_str()
    src = collate(datamodule.datasets["val"][:4])["src_ids"]
    expected = module.model.eval().generate(src, max_new_tokens=8)
    assert torch.equal(reloaded.model.eval().generate(src, max_new_tokens=8), expected)

    trained = read_checkpoint(path)
    assert trained.global_step == 2
    assert torch.equal(trained.build().generate(src, max_new_tokens=8), expected)
    exported = export_checkpoint(path, tmp_path / "exported")
    assert torch.equal(Seq2Seq.from_pretrained(exported).generate(src, max_new_tokens=8), expected)
    assert Seq2SeqTokenizer.load(exported).to_json_str() == datamodule.tokenizer.to_json_str()


# ----- it learns --------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", ["lstm", "attention"])
def test_copy_is_learned_to_exact_match_0_9(mixer, tmp_path):
    """A few hundred steps of a tiny model on 5-letter copies, about 15 s on two CPU cores.

    The length is fixed because no decoder here sees absolute positions (rotary is relative and
    the source has no end marker): with varied lengths, knowing where the source ends takes
    thousands of steps to learn, far past a unit test's budget.
    """
    torch.manual_seed(0)
    datamodule = SyntheticDataModule(task="copy", min_length=5, max_length=5, num_symbols=26, train_size=4000,
                                     val_size=200, test_size=10, batch_size=50)
    config = dict(vocab_size=datamodule.vocab_size, d_model=64, n_heads=4, d_ff=128, encoder_layers=1,
                  decoder_layers=1, decoder_mixers=mixer, dropout=0.0)
    module = LitSeq2Seq(config, tokenizer=datamodule.tokenizer, learning_rate=5e-3, warmup_steps=50,
                        label_smoothing=0.0, decode_batches=None, metrics=["exact_match"])
    trainer = _trainer(tmp_path, max_epochs=7, check_val_every_n_epoch=7, num_sanity_val_steps=0, logger=False)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.callback_metrics["val/exact_match"] >= 0.9


def test_printed_examples_show_the_reference_a_prediction_is_scored_against(monkeypatch, capsys):
    from hybrid.training.examples import print_examples

    datamodule = G2PDataModule(max_words=2000, stress=False, references="all")
    datamodule.setup()
    word = next(example for example in datamodule.datasets["test"] if len(example.references) > 1)
    datamodule.datasets["test"] = [word]
    model = Seq2Seq(ModelConfig(**TINY_MODEL, vocab_size=datamodule.vocab_size))
    monkeypatch.setattr(datamodule.tokenizer, "decode", lambda ids: word.references[1])  # a valid variant
    print_examples(model, datamodule, 1)
    assert f"{word.references[1]}  {word.references[1]}  ok" in capsys.readouterr().out


def test_printed_examples_decode_within_the_models_positions(capsys):
    from hybrid.training.examples import print_examples

    datamodule = _datamodule(min_length=6)  # 7 source tokens with eos: twice that plus 10 is past 16 positions
    model = Seq2Seq(ModelConfig(**TINY_MODEL, vocab_size=datamodule.vocab_size, max_positions=16))
    print_examples(model, datamodule, 2)
    assert "ms per generated token (median over 2)" in capsys.readouterr().out
