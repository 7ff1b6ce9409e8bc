"""Shared fixtures: tiny models whose random weights give varied, non-degenerate outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybrid import MIXERS, ModelConfig, Seq2Seq

VOCAB = 13  # small, so EOS (id 2) comes up often and finished rows leave the batch

# Every registered mixer alone, plus mixed stacks of all of them in both orders: parity must hold for
# any layer plan, and each mixer meets every other as a neighbour below and above.
MIXER_PATTERNS = [[name] * 2 for name in MIXERS] + [list(MIXERS), list(MIXERS)[::-1]]


def pattern_id(pattern: list[str]) -> str:
    return "-".join(pattern)


def tiny_config(decoder_mixers, **overrides) -> ModelConfig:
    fields = dict(vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=64, encoder_layers=2,
                  decoder_layers=len(decoder_mixers), decoder_mixers=decoder_mixers, dropout=0.0,
                  max_positions=1024)
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_model(decoder_mixers, seed: int = 0, **overrides) -> Seq2Seq:
    """A tiny model in eval mode, re-initialised with large weights.

    The default initialisation (std 0.02) makes a random model emit one token forever,
    which would let a broken decoder pass; wide weights make outputs depend on the input.
    """
    torch.manual_seed(seed)
    model = Seq2Seq(tiny_config(decoder_mixers, **overrides))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.5 if parameter.dim() > 1 else 0.1)
        # A longer EOS embedding (tied to the head) makes sequences end at varied lengths,
        # so finished rows really leave the working batch in the tests.
        model.embed.weight[model.config.eos_id] *= 2.0
    return model.eval()


def decode_alone(model: Seq2Seq, tokenizer, text: str, **options) -> str:
    """The model's output for ``text`` decoded on its own (batch 1, no padding): what batched decoding must match."""
    ids = tokenizer.encode_source(text)
    return "" if tokenizer.is_blank_source(ids) else tokenizer.decode(model.generate(torch.tensor([ids]), **options)[0])


def padded_batch(lengths: list[int], vocab: int = VOCAB, pad_id: int = 0, seed: int = 0) -> torch.Tensor:
    """Right-padded random ids (never special ids 0-2) with the given row lengths."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.full((len(lengths), max(lengths)), pad_id, dtype=torch.long)
    for row, length in enumerate(lengths):
        batch[row, :length] = torch.randint(3, vocab, (length,), generator=generator)
    return batch


@pytest.fixture(params=MIXER_PATTERNS, ids=pattern_id)
def mixer_pattern(request) -> list[str]:
    return request.param


def execute_notebook(path: Path) -> dict:
    """Run a notebook's code cells in order, in one namespace, from the notebook's folder; returns it.

    The tests call this after pointing the notebook at a tiny results file through its
    environment variable, so every cell runs as a reader's kernel would run it.
    """
    namespace: dict = {}
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), path.name, "exec"), namespace)
    return namespace


def compose_config(overrides: list[str], tmp_path: Path, config_name: str = "config"):
    """The config `hybrid fit` (or the verb of ``config_name``) would run, with its output folder in tmp_path."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        cfg = compose(config_name, overrides=[*overrides, f"paths.output_dir={tmp_path}"], return_hydra_config=True)
    HydraConfig().set_config(cfg)  # lets ${hydra:...} (the run name) resolve as under `hybrid fit`
    return cfg


# ----- transformers families (hybrid.hf): tiny random models built locally, never downloaded --------------

TRANSFORMERS_FAMILIES = ["bart", "mbart", "marian", "m2m_100"]  # every family hybrid.hf.FAMILIES imports
_FAMILY_CONFIGS = {  # what distinguishes each family's real checkpoints beyond its fixed architecture
    "bart": ("BartConfig", dict(activation_function="gelu", scale_embedding=False)),
    "mbart": ("MBartConfig", dict(activation_function="gelu", scale_embedding=True)),
    "marian": ("MarianConfig", dict(activation_function="swish", scale_embedding=True, pad_token_id=39,
                                    decoder_start_token_id=39, eos_token_id=0, forced_eos_token_id=0)),
    "m2m_100": ("M2M100Config", dict(activation_function="relu", scale_embedding=True)),
}
HF_VOCAB = 40


def tiny_transformers_config(model_type: str):
    """The transformers config of ``model_type``'s tiny model (``TRANSFORMERS_FAMILIES``)."""
    import transformers

    class_name, fields = _FAMILY_CONFIGS[model_type]
    return getattr(transformers, class_name)(
        vocab_size=HF_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, **fields)


def family_architecture(model_type: str) -> dict:
    """The ModelConfig architecture fields of ``model_type``'s tiny model, as the importer reads them, for
    ``tiny_model(..., **fields)``: what drives hybrid's own parity, fast-path and refill tests through every
    family's choices (positions, norms, activation, embedding scale, output bias)."""
    from hybrid.hf.families import FAMILIES, model_config_fields

    fields = model_config_fields(FAMILIES[model_type], tiny_transformers_config(model_type))
    return {name: fields[name] for name in (*FAMILIES[model_type].architecture, "activation", "embedding_scale")}


def tiny_transformers_model(model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A tiny random transformers model of ``model_type`` (``TRANSFORMERS_FAMILIES``), in eval mode.

    Its weights, norms and biases (``final_logits_bias`` too, zero in a fresh model) are redrawn wide, so
    that a weight mapped to the wrong place, or left out, changes the logits."""
    import transformers

    from hybrid.hf import FAMILIES

    config = tiny_transformers_config(model_type)
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[model_type].model_class)(config).to(dtype)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if "embed_positions" in name and FAMILIES[model_type].architecture["positions"] == "sinusoidal":
                continue  # the fixed sinusoids stay as transformers computes them
            if "norm" in name:
                tensor.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            elif tensor.is_floating_point():
                tensor.normal_(0.0, 0.3 if tensor.dim() > 1 else 0.1)
        model.get_input_embeddings().weight[config.pad_token_id] = 0.0  # as padding_idx keeps it in training
    return model.eval()


def tiny_transformers_tokenizer(model: object):
    """A word-level transformers tokenizer over ``model``'s vocabulary ("t3", "t4", ... and its special
    tokens at its special ids), enough for CTranslate2's converter, which reads the vocabulary from it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    config = model.config
    special = {config.pad_token_id: "<pad>", config.eos_token_id: "</s>"}
    if config.bos_token_id is not None and config.bos_token_id not in special:
        special[config.bos_token_id] = "<s>"
    unk_id = next(i for i in range(config.vocab_size) if i not in special)
    special[unk_id] = "<unk>"
    vocab = {special.get(i, f"t{i}"): i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   **({"bos_token": "<s>"} if "<s>" in vocab else {}))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a shared CPU idle threads spinning cost a lot: a module
    that trains or decodes many of them asks for one thread with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
