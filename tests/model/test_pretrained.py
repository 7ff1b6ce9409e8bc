import json
import pickle

import pytest
import torch
from conftest import padded_batch, tiny_model
from safetensors import safe_open

from hybrid import Seq2Seq


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_load_give_identical_logits(tmp_path, mixer_pattern, tie):
    model = tiny_model(mixer_pattern, tie_embeddings=tie, mixer_options={"lstm": {"hidden_size": 24}})
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["decoder_mixers"] == mixer_pattern

    loaded = Seq2Seq.from_pretrained(tmp_path)
    src, tgt = padded_batch([5, 3], seed=1), padded_batch([4, 4], seed=2)
    assert torch.equal(loaded(src, tgt), model(src, tgt))
    assert (loaded.lm_head.weight is loaded.embed.weight) == tie


def test_weights_are_safetensors_not_pickle(tmp_path):
    model = tiny_model(["lstm", "attention"], tie_embeddings=False)
    model.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    with safe_open(path, framework="pt") as weights:  # parses the JSON header; fails on anything else
        stored = {name: weights.get_tensor(name) for name in weights.keys()}
    state = model.state_dict()
    assert sorted(stored) == sorted(state)
    for name, tensor in state.items():
        assert stored[name].shape == tensor.shape and torch.equal(stored[name], tensor), name
    assert not path.read_bytes().startswith((b"PK", b"\x80"))  # neither torch.save's zip nor a bare pickle
    as_pickle = tmp_path / "weights.pt"  # torch.load hands a .safetensors name to safetensors: hide the suffix
    as_pickle.write_bytes(path.read_bytes())
    with pytest.raises(pickle.UnpicklingError):
        torch.load(as_pickle, weights_only=True)


def test_loading_from_a_folder_without_a_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Seq2Seq.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage", ["config not json", "config field missing", "weights truncated"])
def test_a_damaged_save_is_refused_naming_the_file(tmp_path, damage):
    tiny_model(["lstm"], seed=3).save_pretrained(tmp_path)
    config, weights = tmp_path / "config.json", tmp_path / "model.safetensors"
    if damage == "config not json":
        config.write_text(config.read_text()[:-5])
        culprit = config
    elif damage == "config field missing":
        data = json.loads(config.read_text())
        del data["d_ff"]
        config.write_text(json.dumps(data))
        culprit = config
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        culprit = weights
    with pytest.raises(ValueError, match=str(culprit)):
        Seq2Seq.from_pretrained(tmp_path)
