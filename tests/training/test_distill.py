"""Learning from a teacher (hybrid.training.distill): mixer transfer and token-level knowledge distillation."""

import math

import pytest
import torch
from lightning import Trainer

from hybrid import Seq2Seq
from hybrid.config import ModelConfig
from hybrid.convert import convert
from hybrid.training import LitSeq2Seq, SyntheticDataModule
from hybrid.training.checkpoint import read_checkpoint, write_checkpoint
from hybrid.training.distill import DistillOptions, distillation_kl, mixer_transfer_loss, swapped_layers

TINY = dict(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=2, dropout=0.0)


@pytest.fixture
def datamodule():
    data = SyntheticDataModule(task="copy", max_length=6, num_symbols=6, train_size=64, val_size=16, test_size=16,
                               batch_size=16)
    data.setup("fit")
    return data


@pytest.fixture
def teacher_path(datamodule, tmp_path):
    torch.manual_seed(0)
    teacher = Seq2Seq(ModelConfig(vocab_size=datamodule.vocab_size, decoder_mixers=["attention"] * 2, **TINY))
    teacher.generation_config = {"num_beams": 2}
    return write_checkpoint(teacher, datamodule.tokenizer, tmp_path / "teacher.ckpt")


def _student(teacher_path, pattern="lstm") -> Seq2Seq:
    teacher = read_checkpoint(teacher_path).build()
    return convert(teacher, pattern)[0]


def _module(student: Seq2Seq, datamodule, **distill) -> LitSeq2Seq:
    module = LitSeq2Seq(student.config.to_dict(), tokenizer=datamodule.tokenizer, metrics=[], learning_rate=1e-2,
                        warmup_steps=1, distill=distill or None)
    module.model.load_state_dict(student.state_dict())
    return module


def _fit(module, datamodule, tmp_path, steps: int) -> None:
    Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path).fit(module, datamodule)


def test_the_distillation_loss_is_the_temperature_scaled_kl_from_teacher_to_student():
    student = torch.tensor([[[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]]])  # (1, 2, 3)
    teacher = torch.tensor([[[0.0, 2.0, 0.0], [9.0, 9.0, 9.0]]])
    mask = torch.tensor([[True, False]])  # the second position is padding: not counted
    temperature = 2.0
    p = [math.exp(x / temperature) for x in (0.0, 2.0, 0.0)]
    q = [math.exp(x / temperature) for x in (1.0, 0.0, -1.0)]
    p, q = [x / sum(p) for x in p], [x / sum(q) for x in q]
    by_hand = temperature**2 * sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    assert distillation_kl(student, teacher, mask, temperature).item() == pytest.approx(by_hand, rel=1e-6)
    assert distillation_kl(teacher, teacher, mask, temperature).item() == pytest.approx(0.0, abs=1e-7)


def test_token_level_distillation_mixes_the_kl_into_the_training_loss(datamodule, teacher_path):
    student = _student(teacher_path)
    module = _module(student, datamodule, teacher=str(teacher_path), alpha=0.25, temperature=2.0)
    plain = _module(student, datamodule)
    batch = next(iter(datamodule.train_dataloader()))
    for lit in (module, plain):
        lit.log = lambda *args, **kwargs: None  # outside a Trainer
    loss = module.training_step(batch, 0)
    cross_entropy = plain.training_step(batch, 0)
    teacher_logits = module.teacher(batch["src_ids"], batch["tgt_in"], batch["src_mask"])
    logits = student(batch["src_ids"], batch["tgt_in"], batch["src_mask"])
    kl = distillation_kl(logits, teacher_logits, batch["tgt_out"].ne(student.config.pad_id), 2.0)
    assert loss.item() == pytest.approx(0.75 * cross_entropy.item() + 0.25 * kl.item(), rel=1e-5)
    assert "teacher" not in dict(module.named_modules()) and not any("teacher" in key for key in module.state_dict())


def test_mixer_transfer_trains_only_the_new_mixers(datamodule, teacher_path, tmp_path):
    student = _student(teacher_path, "lstm,attention")  # layer 0 swapped, layer 1 kept
    module = _module(student, datamodule, teacher=str(teacher_path), match="mixers")
    before = {key: value.clone() for key, value in module.model.state_dict().items()}
    _fit(module, datamodule, tmp_path, steps=3)
    after = module.model.state_dict()
    changed = sorted(key for key in before if not torch.equal(before[key], after[key]))
    assert changed and all(key.startswith("decoder_layers.0.mixer.") for key in changed)
    assert not any(key.startswith("decoder_layers.1.mixer.") for key in changed)  # a kept mixer stays as it was


def test_mixer_transfer_loss_falls(datamodule, teacher_path, tmp_path):
    student = _student(teacher_path, "ssru")
    module = _module(student, datamodule, teacher=str(teacher_path), match="mixers")
    batch = next(iter(datamodule.val_dataloader()))
    layers = swapped_layers(module.teacher.config, module.model.config)

    def transfer_loss() -> float:
        with torch.no_grad():  # the model has no dropout (TINY), so train mode measures the same
            return mixer_transfer_loss(module.model, module.teacher, layers, batch).item()

    first = transfer_loss()
    _fit(module, datamodule, tmp_path, steps=30)
    assert transfer_loss() < 0.5 * first


def test_a_converted_model_keeps_its_generation_defaults_through_the_checkpoint(teacher_path, tmp_path):
    student = _student(teacher_path)
    assert student.generation_config == {"num_beams": 2}
    path = write_checkpoint(student, read_checkpoint(teacher_path).tokenizer, tmp_path / "student.ckpt")
    assert read_checkpoint(path).generation_config == {"num_beams": 2}


@pytest.mark.parametrize(("options", "message"), [
    ({"teacher": "", "match": "logits"}, "teacher must be the path"),
    ({"teacher": "t.ckpt", "match": "attention"}, "match must be one of"),
    ({"teacher": "t.ckpt", "alpha": 1.5}, "alpha must be a number in"),
    ({"teacher": "t.ckpt", "temperature": 0}, "temperature must be a finite number > 0"),
    ({"teacher": "t.ckpt", "beta": 1}, "unknown options"),
])
def test_bad_distillation_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        DistillOptions.from_dict(options)


def test_no_teacher_means_no_distillation():
    assert DistillOptions.from_dict(None) is None
    assert DistillOptions.from_dict({"teacher": None, "match": "logits", "alpha": 0.5, "temperature": 1.0}) is None


def test_mixer_transfer_needs_a_swapped_mixer_and_the_same_shape(datamodule, teacher_path):
    teacher = read_checkpoint(teacher_path).build()
    with pytest.raises(ValueError, match="are the teacher's"):
        _module(teacher, datamodule, teacher=str(teacher_path), match="mixers")
    other = Seq2Seq(ModelConfig(vocab_size=datamodule.vocab_size, decoder_mixers=["lstm"] * 3,
                                **dict(TINY, decoder_layers=3)))
    with pytest.raises(ValueError, match="differ in"):
        _module(other, datamodule, teacher=str(teacher_path), match="mixers")
    wider = Seq2Seq(ModelConfig(vocab_size=datamodule.vocab_size + 1, decoder_mixers=["lstm"] * 2, **TINY))
    with pytest.raises(ValueError, match="does not share the student's vocabulary"):
        _module(wider, datamodule, teacher=str(teacher_path))
