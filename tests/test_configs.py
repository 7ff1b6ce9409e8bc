"""Every Hydra config composes and instantiates, every model config builds the model it describes, and every
experiment runs with fast_dev_run on the CPU."""

import dataclasses
import importlib.resources
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from hybrid import MIXERS, ModelConfig, Seq2Seq
from hybrid.cli import VERBS
from hybrid.cli.generate import GENERATION_OPTIONS, generation_options
from hybrid.cli.train import run_fit
from hybrid.generation.config import GenerationConfig
from hybrid.training import G2PDataModule, SyntheticDataModule
from hybrid.training.builders import build_trainer, model_config_from
from hybrid.training.callbacks import stop_reason

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = importlib.resources.files("hybrid.configs")
TRAINING_GROUPS = ("model", "data", "trainer", "callbacks", "logger", "paths", "debug", "experiment")


def options(group: str) -> list[str]:
    return sorted(entry.name.removesuffix(".yaml") for entry in CONFIGS.joinpath(group).iterdir()
                  if entry.name.endswith(".yaml"))


def shrink_data(cfg: DictConfig) -> None:
    """A few dozen examples, so a smoke run takes seconds; everything else stays as configured."""
    with open_dict(cfg):
        cfg.data.batch_size = 8
        if cfg.data._target_.endswith("G2PDataModule"):
            cfg.data.max_words = 300
        else:
            cfg.data.train_size, cfg.data.val_size, cfg.data.test_size = 32, 16, 16


def test_plain_hybrid_fit_trains_the_all_lstm_hybrid_on_g2p(tmp_path):
    cfg = compose_config([], tmp_path)
    assert cfg.model.decoder_mixers == "lstm"
    assert cfg.data._target_ == "hybrid.training.G2PDataModule"
    assert cfg.name == "g2p_hybrid"


@pytest.mark.parametrize("option", options("model"))
def test_every_model_builds_what_its_config_says(option, tmp_path):
    node = compose_config([f"model={option}"], tmp_path).model
    config = model_config_from(node, vocab_size=40)
    assert config.pad_id == 0 and config.bos_id == 1 and config.eos_id == 2
    model = Seq2Seq(config).eval()
    mixers = node.decoder_mixers
    mixers = [mixers] * node.decoder_layers if isinstance(mixers, str) else list(mixers)
    assert [type(layer.mixer) for layer in model.decoder_layers] == [MIXERS[name] for name in mixers]
    assert len(model.encoder_layers) == node.encoder_layers and model.embed.weight.shape == (40, node.d_model)
    for layer in model.decoder_layers:
        assert layer.ffn.fc_in.out_features == node.d_ff and layer.cross.n_heads == node.n_heads
        if isinstance(layer.mixer, MIXERS["lstm"]):
            assert layer.mixer.lstm.hidden_size == (node.mixer_options.lstm.hidden_size or node.d_model)
    assert (model.lm_head.weight is model.embed.weight) == node.tie_embeddings
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    assert model(src, tgt).shape == (2, 5, 40)


def test_model_node_holds_the_model_config_fields(tmp_path):
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size", "pad_id", "bos_id", "eos_id", "extra"}
    assert set(compose_config([], tmp_path).model) == fields


@pytest.mark.parametrize("option", options("data"))
def test_every_data_module_instantiates(option, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"source {i}\ttarget {i}\n" for i in range(40)))
    extra = [f"data.train_path={pairs}"] if option == "text" else []
    datamodule = instantiate(compose_config([f"data={option}", *extra], tmp_path).data)
    assert datamodule.vocab_size > 4


@pytest.mark.parametrize("option", options("trainer"))
def test_every_trainer_instantiates(option, tmp_path):
    overrides = [f"trainer={option}"]
    if option == "gpu" and not torch.cuda.is_available():
        overrides.append("trainer.accelerator=cpu")  # the other arguments are still checked
    trainer = build_trainer(compose_config(overrides, tmp_path))
    assert trainer.max_epochs > 0


@pytest.mark.parametrize("option", options("logger"))
def test_every_logger_and_callback_instantiates(option, tmp_path):
    if option == "tensorboard":
        pytest.importorskip("tensorboard")
    trainer = build_trainer(compose_config([f"logger={option}", "trainer.accelerator=cpu"], tmp_path))
    assert trainer.loggers
    names = {type(callback).__name__ for callback in trainer.callbacks}
    assert {"ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "RichProgressBar", "ValidationCadence",
            "CheckpointOnSigterm", "ConsoleReport"} <= names


@pytest.mark.parametrize("option", options("generation"))
def test_every_generation_option_set_is_valid(option, tmp_path):
    cfg = compose_config([f"generation={option}", "ckpt_path=unused"], tmp_path, config_name="generate")
    GenerationConfig.from_kwargs(**generation_options(cfg.generation))


def test_generation_node_lists_every_command_line_option(tmp_path):
    cfg = compose_config(["ckpt_path=unused"], tmp_path, config_name="generate")
    assert set(cfg.generation) == GENERATION_OPTIONS
    assert GENERATION_OPTIONS < {f.name for f in dataclasses.fields(GenerationConfig)}


ROOT_CONFIGS = sorted(entry.name.removesuffix(".yaml") for entry in CONFIGS.iterdir() if entry.name.endswith(".yaml"))


def test_every_verb_has_a_root_config_and_every_root_config_a_verb():
    assert {verb.config for verb in VERBS.values()} == set(ROOT_CONFIGS)


@pytest.mark.parametrize("name", ROOT_CONFIGS)
def test_every_root_config_composes(name):
    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        cfg = compose(name, return_hydra_config=True)
    HydraConfig().set_config(cfg)  # lets the run folder's ${hydra:...} resolve, as under `hybrid fit`
    required = {key for key in cfg if key != "hydra" and OmegaConf.is_missing(cfg, key)}
    assert required == {"config": set(), "generate": {"ckpt_path"}, "distill_data": {"ckpt_path", "output"},
                        "export": {"ckpt_path", "output"},
                        "convert": {"ckpt_path", "pattern", "output"}, "ablate": {"runs"},
                        "import": {"hf", "output"}}.get(name, set())
    # The verbs without a run folder (configs/hydra/in_place.yaml)
    in_place = name not in ("config", "generate", "distill_data")
    assert (cfg.hydra.run.dir == "." and cfg.hydra.output_subdir is None) == in_place
    assert ("file" in cfg.hydra.job_logging.handlers) != in_place


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_runs_with_fast_dev_run(experiment, tmp_path):
    cfg = compose_config([f"experiment={experiment}", "debug=fast", "callbacks.progress_bar=null"], tmp_path)
    assert cfg.name == experiment
    shrink_data(cfg)
    trainer = run_fit(cfg)
    assert trainer.state.finished and trainer.global_step == 1 and stop_reason(trainer) == "trainer.fast_dev_run"
    assert isinstance(trainer.datamodule, (G2PDataModule, SyntheticDataModule))


def test_pyproject_installs_every_package_and_every_config_group():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"hybrid.configs": "configs"}
    code = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "hybrid").rglob("*.py")}
    configs = {".".join(("hybrid", *path.parent.relative_to(ROOT).parts))
               for path in (ROOT / "configs").rglob("*.yaml")}
    assert code | configs <= set(setuptools["packages"])
