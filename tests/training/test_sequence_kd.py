"""Sequence-level knowledge distillation's data (``hybrid distill-data``): the teacher's output for every distinct
training source, decoded through the resumable bulk job with the teacher's own generation defaults, and the
file a student trains on with ``data.train_path`` while validation and test stay the data's own."""

import json
import logging
from pathlib import Path

import pytest
from conftest import compose_config, decode_alone, tiny_model

from hybrid.bulk import ShardStore, decode_shard
from hybrid.cli import main
from hybrid.cli.distill_data import run_distill_data
from hybrid.tokenizer import G2P_GRAPHEMES
from hybrid.training.checkpoint import write_checkpoint
from hybrid.training.data import G2PDataModule

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
DATA = ["data.max_words=60", "data.pronunciations=all", "data.seed=3"]  # 54 training words, some with variants
GREEDY = {"max_new_tokens": 6}


@pytest.fixture(scope="module")
def g2p():
    """The data module of ``DATA``: its tokenizer is the teacher's, its training split what is distilled."""
    return G2PDataModule(max_words=60, pronunciations="all", seed=3)


def teacher_model(g2p, **overrides):
    return tiny_model(["lstm", "attention"], seed=2, vocab_size=g2p.tokenizer.vocab_size, **overrides)


@pytest.fixture(scope="module")
def teacher(g2p, tmp_path_factory) -> Path:
    """A tiny random G2P teacher as a training checkpoint."""
    return write_checkpoint(teacher_model(g2p), g2p.tokenizer, tmp_path_factory.mktemp("teacher") / "teacher.ckpt")


def distill(tmp_path: Path, *overrides: str) -> Path:
    return run_distill_data(compose_config(list(overrides), tmp_path, config_name="distill_data"))


def training_words(g2p) -> list[str]:
    return list(dict.fromkeys(word for word, _ in g2p.pairs["train"]))


def test_the_training_file_holds_the_teachers_output_for_each_distinct_training_source_once(g2p, teacher, tmp_path,
                                                                                             caplog):
    # A random teacher also emits letters, which the student's data would refuse as unknown phonemes.
    letters = [[g2p.tokenizer.unk_id], *([token] for token in g2p.tokenizer.encode_source(G2P_GRAPHEMES)[:-1])]
    with caplog.at_level(logging.INFO, logger="hybrid.cli.distill_data"):
        output = distill(tmp_path, f"ckpt_path={teacher}", f"output={tmp_path / 'kd.tsv'}", *DATA,
                         "generation.max_new_tokens=6", f"generation.bad_words_ids={json.dumps(letters)}")
    words = training_words(g2p)
    assert len(words) < len(g2p.pairs["train"])  # the variants' words are distilled once each
    model = teacher_model(g2p)
    expected = [f"{word}\t{decode_alone(model, g2p.tokenizer, word, **GREEDY, bad_words_ids=letters)}"
                for word in words]
    assert output.read_text(encoding="utf-8").split("\n") == [*expected, ""]
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("kd")] == ["kd.tsv"]  # no work folder

    student_data = G2PDataModule(max_words=60, seed=3, train_path=str(output))  # the student's fit reads it
    assert student_data.pairs["train"] == [tuple(line.split("\t")) for line in expected]
    assert student_data.pairs["val"] == g2p.pairs["val"] and student_data.pairs["test"] == g2p.pairs["test"]
    assert f"hybrid fit data=g2p {' '.join(DATA)} data.train_path={output} init_from=STUDENT.ckpt" in caplog.text


def test_a_killed_run_resumes_from_the_shards_it_finished(g2p, teacher, tmp_path, monkeypatch):
    def arguments(output: str) -> list[str]:
        return [f"ckpt_path={teacher}", f"output={tmp_path / output}", *DATA, "generation.max_new_tokens=6",
                "shard_size=20", "progress=false"]

    whole = distill(tmp_path / "whole", *arguments("whole.tsv"))
    save = ShardStore.save

    def killed_at_the_second_shard(store, shard, lines, rejects=None):
        if shard.index == 1:
            raise KeyboardInterrupt
        save(store, shard, lines, rejects)

    monkeypatch.setattr(ShardStore, "save", killed_at_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        distill(tmp_path / "killed", *arguments("kd.tsv"))
    assert not (tmp_path / "kd.tsv").exists() and (tmp_path / "kd.tsv.parts").is_dir()

    monkeypatch.setattr(ShardStore, "save", save)
    decoded = []
    monkeypatch.setattr("hybrid.bulk.job.decode_shard", lambda model, tokenizer, texts, *args, **kwargs: (
        decoded.append(len(texts)) or decode_shard(model, tokenizer, texts, *args, **kwargs)))
    output = distill(tmp_path / "resumed", *arguments("kd.tsv"))
    assert decoded == [20, len(training_words(g2p)) - 40]  # the first shard was not decoded again
    assert output.read_bytes() == whole.read_bytes()


def test_the_teachers_generation_defaults_apply_unless_the_command_line_sets_an_option(g2p, tmp_path, monkeypatch):
    folder = tmp_path / "teacher"  # a model folder, as hybrid export and hybrid import write
    model = teacher_model(g2p)
    model.generation_config = {"num_beams": 3, "max_new_tokens": 5}
    model.save_pretrained(folder)
    g2p.tokenizer.save(folder)
    monkeypatch.chdir(tmp_path)  # the run folder goes to outputs/ there
    main(["distill-data", f"ckpt_path={folder}", "output=own.tsv", *DATA, "progress=false"])
    main(["distill-data", f"ckpt_path={folder}", "output=greedy.tsv", *DATA, "num_beams=1", "progress=false"])
    words = training_words(g2p)
    own = [line.split("\t")[1] for line in (tmp_path / "own.tsv").read_text(encoding="utf-8").splitlines()]
    greedy = [line.split("\t")[1] for line in (tmp_path / "greedy.tsv").read_text(encoding="utf-8").splitlines()]
    assert own == [decode_alone(model, g2p.tokenizer, word, num_beams=3, max_new_tokens=5) for word in words]
    assert greedy == [decode_alone(model, g2p.tokenizer, word, num_beams=1, max_new_tokens=5) for word in words]
    assert own != greedy


def test_sources_longer_than_the_teacher_reads_are_left_out_and_counted(g2p, tmp_path, caplog):
    teacher = write_checkpoint(teacher_model(g2p, max_positions=8), g2p.tokenizer, tmp_path / "short.ckpt")
    with caplog.at_level(logging.WARNING, logger="hybrid.cli.distill_data"):
        output = distill(tmp_path, f"ckpt_path={teacher}", f"output={tmp_path / 'kd.tsv'}", *DATA,
                         "generation.max_new_tokens=4")
    words = training_words(g2p)
    readable = [word for word in words if len(g2p.tokenizer.encode_source(word)) <= 8]  # 7 letters and the eos
    assert 0 < len(readable) < len(words)
    assert [line.split("\t")[0] for line in output.read_text(encoding="utf-8").splitlines()] == readable
    assert f"{len(words) - len(readable)} of {len(words)} training sources are left out" in caplog.text
    assert "the model's max_positions is 8" in caplog.text


def test_a_source_a_tsv_line_cannot_hold_asks_for_jsonl_which_keeps_it(g2p, teacher, tmp_path):
    pairs = [{"source": "a\tb", "target": "x"}, {"source": "cd", "target": "y"}, {"source": "cd", "target": "z"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    data = ["data=text", f"data.train_path={tmp_path / 'pairs.jsonl'}", "data.val_fraction=0", "data.test_fraction=0"]
    with pytest.raises(ValueError, match=r"'a\\tb' -> .* holds a tab or a line break.*name the output \.jsonl"):
        distill(tmp_path, f"ckpt_path={teacher}", f"output={tmp_path / 'kd.tsv'}", *data, "generation.max_new_tokens=6")
    assert not (tmp_path / "kd.tsv").exists()
    output = distill(tmp_path, f"ckpt_path={teacher}", f"output={tmp_path / 'kd.jsonl'}", *data,
                     "generation.max_new_tokens=6")
    model = teacher_model(g2p)
    sources = [json.loads(line)["source"] for line in output.read_text(encoding="utf-8").splitlines()]
    assert sorted(sources) == ["a\tb", "cd"]  # the text data's seeded order, each source once
    assert [json.loads(line)["target"] for line in output.read_text(encoding="utf-8").splitlines()] == [
        decode_alone(model, g2p.tokenizer, source, **GREEDY) for source in sources]


@pytest.mark.parametrize(("arguments", "error"), [
    (["ckpt_path=missing.ckpt"], (FileNotFoundError, "missing.ckpt is not a checkpoint file")),
    (["ckpt_path={teacher}", "generation.num_return_sequences=2", "generation.num_beams=2"],
     (ValueError, "leave num_return_sequences at 1")),
])
def test_bad_input_is_refused_by_name_before_anything_is_written(teacher, tmp_path, arguments, error):
    with pytest.raises(error[0], match=error[1]):
        distill(tmp_path, *[argument.format(teacher=teacher) for argument in arguments],
                f"output={tmp_path / 'kd.tsv'}", *DATA)
    assert not (tmp_path / "kd.tsv").exists() and not (tmp_path / "kd.tsv.parts").exists()
