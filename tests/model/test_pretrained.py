import json

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid import Seq2Seq


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_load_give_identical_logits(tmp_path, mixer_pattern, tie):
    model = tiny_model(mixer_pattern, tie_embeddings=tie, lstm_hidden_size=24)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["decoder_mixers"] == mixer_pattern

    loaded = Seq2Seq.from_pretrained(tmp_path)
    src, tgt = padded_batch([5, 3], seed=1), padded_batch([4, 4], seed=2)
    assert torch.equal(loaded(src, tgt), model(src, tgt))
    assert (loaded.lm_head.weight is loaded.embed.weight) == tie


def test_weights_are_safetensors_not_pickle(tmp_path):
    tiny_model(["lstm"]).save_pretrained(tmp_path)
    header = (tmp_path / "model.safetensors").read_bytes()[:8]
    assert int.from_bytes(header, "little") > 0  # safetensors starts with its JSON header length
    assert not (tmp_path / "model.safetensors").read_bytes().startswith(b"PK")  # not a torch.save zip


def test_loading_from_a_folder_without_a_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Seq2Seq.from_pretrained(tmp_path)
