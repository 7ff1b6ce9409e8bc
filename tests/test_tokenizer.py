import json
import logging

import pytest
import torch
from tokenizers import Tokenizer

from hybrid.tokenizer import Seq2SeqTokenizer

WORDS = ["hello", "world", "tomato", "it's"]
PHONEMES = ["HH AH0 L OW1", "W ER1 L D", "T AH0 M EY1 T OW2", "IH1 T S"]
SENTENCES = ["the cat sat on the mat", "a dog sat on a log", "the dog and the cat"]
TRANSLATIONS = ["le chat est sur le tapis", "un chien sur une bûche", "le chien et le chat"]


def test_specials_have_fixed_ids():
    tokenizer = Seq2SeqTokenizer.train(WORDS, WORDS)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    for side in (tokenizer.source, tokenizer.target):
        assert [side.id_to_token(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]


def test_char_round_trip_keeps_spaces_and_accents():
    tokenizer = Seq2SeqTokenizer.train(SENTENCES, TRANSLATIONS, "char", "char")
    for source, target in zip(SENTENCES, TRANSLATIONS, strict=True):
        assert tokenizer.encode_source(source)[-1] == tokenizer.eos_id  # every source closes with eos
        assert len(tokenizer.encode_source(source)) == len(source) + 1
        assert tokenizer.decode(tokenizer.encode_target(target)) == target
    assert tokenizer.vocab_size == 4 + len(set("".join(SENTENCES + TRANSLATIONS)))


def test_space_level_target_with_char_source_shares_one_id_space():
    tokenizer = Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space")
    for word, phonemes in zip(WORDS, PHONEMES, strict=True):
        assert len(tokenizer.encode_source(word)) == len(word) + 1  # its letters and eos
        assert len(tokenizer.encode_target(phonemes)) == len(phonemes.split())
        assert tokenizer.decode(tokenizer.encode_target(phonemes)) == phonemes
    source_ids = {i for word in WORDS for i in tokenizer.encode_source(word)[:-1]}
    target_ids = {i for phonemes in PHONEMES for i in tokenizer.encode_target(phonemes)}
    assert not source_ids & target_ids  # letters and phonemes are different symbols...
    assert max(source_ids | target_ids) < tokenizer.vocab_size  # ...in one id space


def test_symbol_on_both_sides_gets_one_id():
    tokenizer = Seq2SeqTokenizer.train(["abc"], ["cde"], "char", "char")
    assert tokenizer.encode_source("c") == [*tokenizer.encode_target("c"), tokenizer.eos_id]
    assert tokenizer.vocab_size == 4 + 5


@pytest.mark.parametrize("target_level", ["bpe", "space"])
def test_bpe_round_trip(target_level):
    targets = TRANSLATIONS if target_level == "bpe" else PHONEMES[:3]
    tokenizer = Seq2SeqTokenizer.train(SENTENCES, targets, "bpe", target_level, vocab_size=60)
    for source in SENTENCES:
        ids = tokenizer.encode_source(source)
        assert len(ids) < len(source)  # merges happened
        assert tokenizer.unk_id not in ids
    for target in targets:
        assert tokenizer.decode(tokenizer.encode_target(target)) == target


def test_joint_bpe_is_trained_on_both_sides():
    tokenizer = Seq2SeqTokenizer.train(["aaaa aaaa"] * 10, ["zzzz zzzz"] * 10, "bpe", "bpe", vocab_size=40)
    assert len(tokenizer.encode_source("aaaa")) == 1 + 1  # one merged token and eos
    assert len(tokenizer.encode_target("zzzz")) == 1
    assert tokenizer.encode_source("zzzz") == [*tokenizer.encode_target("zzzz"), tokenizer.eos_id]


def test_decode_drops_pad_and_bos_and_stops_at_eos():
    tokenizer = Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space")
    ids = tokenizer.encode_target("HH AH0 L OW1")
    row = [tokenizer.bos_id, *ids, tokenizer.eos_id, *ids, tokenizer.pad_id]
    assert tokenizer.decode(row) == "HH AH0 L OW1"
    batch = torch.tensor([row, [tokenizer.bos_id, ids[0], tokenizer.eos_id] + [0] * (len(row) - 3)])
    assert tokenizer.batch_decode(batch) == ["HH AH0 L OW1", "HH"]


def test_special_token_text_is_not_parsed_as_a_special():
    tokenizer = Seq2SeqTokenizer.train(["</s><s>"], ["</s><s>"])
    ids = tokenizer.encode_target("</s>")
    assert len(ids) == 4 and tokenizer.eos_id not in ids
    assert tokenizer.decode(ids) == "</s>"


def test_unknown_symbols_become_unk_and_are_reported(caplog):
    tokenizer = Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space")
    with caplog.at_level(logging.WARNING):
        source_ids = tokenizer.encode_source("hellq!q")
        target_ids = tokenizer.encode_target("HH XX L")
    assert source_ids[4] == source_ids[5] == source_ids[6] == tokenizer.unk_id
    assert target_ids[1] == tokenizer.unk_id
    assert tokenizer.unknown_symbols == {"q": 2, "!": 1, "XX": 1}
    assert sum("not in the vocabulary" in record.message for record in caplog.records) == 3  # once per symbol
    assert tokenizer.decode(target_ids) == "HH <unk> L"


def test_unknown_level_is_rejected():
    with pytest.raises(ValueError, match="level"):
        Seq2SeqTokenizer.train(WORDS, WORDS, "word", "char")


def _assert_same(restored: Seq2SeqTokenizer, original: Seq2SeqTokenizer) -> None:
    assert (restored.source_level, restored.target_level) == (original.source_level, original.target_level)
    assert restored.source.get_vocab() == original.source.get_vocab()
    for sentence, translation in zip(SENTENCES, TRANSLATIONS, strict=True):
        assert restored.encode_source(sentence) == original.encode_source(sentence)
        assert restored.encode_target(translation) == original.encode_target(translation)
        assert restored.decode(restored.encode_target(translation)) == translation


@pytest.mark.parametrize("levels", [("char", "char"), ("char", "space"), ("bpe", "bpe"), ("bpe", "char")])
def test_save_load_and_json_string_round_trip(tmp_path, levels):
    original = Seq2SeqTokenizer.train(SENTENCES, TRANSLATIONS, *levels, vocab_size=50)
    original.save(tmp_path / "tok")
    _assert_same(Seq2SeqTokenizer.load(tmp_path / "tok"), original)
    # Each side is an ordinary tokenizer.json that `tokenizers` reads on its own.
    source = Tokenizer.from_file(str(tmp_path / "tok" / "source_tokenizer.json"))
    assert source.encode(SENTENCES[0]).ids == original.encode_source(SENTENCES[0])

    text = original.to_json_str()
    assert isinstance(json.loads(text), dict)
    _assert_same(Seq2SeqTokenizer.from_json_str(text), original)


def test_source_eos_is_saved_with_the_tokenizer_and_can_be_left_off():
    closed = Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space")
    assert closed.source_suffix == [closed.eos_id]
    assert closed.encode_source("") == [closed.eos_id]
    restored = Seq2SeqTokenizer.from_json_str(closed.to_json_str())
    assert restored.encode_source("hello") == closed.encode_source("hello")  # the rule travels with it
    assert restored.encode_target("HH AH0") == closed.encode_target("HH AH0")  # targets never get one

    open_ended = Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space", source_eos=False)
    assert open_ended.source_suffix == [] and open_ended.encode_source("") == []
    assert open_ended.encode_source("hello") == closed.encode_source("hello")[:-1]
    for tokenizer in (closed, open_ended):  # a blank line is blank with or without its eos
        assert tokenizer.is_blank_source(tokenizer.encode_source(""))
        assert not tokenizer.is_blank_source(tokenizer.encode_source("h"))


def test_a_tokenizer_saved_before_source_eos_keeps_encoding_without_it():
    data = json.loads(Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space").to_json_str())
    data["source"]["post_processor"] = None  # what a tokenizer.json written before source eos holds
    old = Seq2SeqTokenizer.from_json_str(json.dumps(data))
    assert old.source_suffix == []
    assert old.encode_source("hello") == [old.source.token_to_id(letter) for letter in "hello"]


def test_the_eos_of_an_unknown_laden_source_is_not_counted_as_unknown():
    tokenizer = Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space")
    assert tokenizer.encode_source("q") == [tokenizer.unk_id, tokenizer.eos_id]
    assert tokenizer.unknown_symbols == {"q": 1}


def g2p_tokenizer(**options) -> Seq2SeqTokenizer:
    """The G2P data module's tokenizer, with the stress-free phoneme inventory for brevity."""
    from hybrid.training.data import G2PDataModule

    return G2PDataModule(stress=False, **options)._make_tokenizer()


def test_a_g2p_source_is_case_folded_as_its_training_words_were(tmp_path, caplog):
    tokenizer = g2p_tokenizer()
    with caplog.at_level(logging.WARNING):
        assert tokenizer.encode("Hello") == tokenizer.encode("HELLO") == tokenizer.encode("hello")
    assert tokenizer.decode_source(tokenizer.encode("Hello")) == "hello"
    assert not caplog.records and not tokenizer.unknown_symbols  # no "H" as <unk>, no "S" as the phoneme S
    tokenizer.save(tmp_path)  # the rule travels in source_tokenizer.json, for every reader of it
    assert Tokenizer.from_file(str(tmp_path / "source_tokenizer.json")).encode("Mom").ids == tokenizer.encode("mom")
    assert Seq2SeqTokenizer.from_json_str(tokenizer.to_json_str()).encode("Mom") == tokenizer.encode("mom")


def test_a_g2p_tokenizer_saved_before_it_carried_lower_case_folds_case_when_loaded(tmp_path):
    data = json.loads(g2p_tokenizer().to_json_str())
    data["source"]["normalizer"] = None  # what a tokenizer.json written before lowercase_source holds
    old = Seq2SeqTokenizer.from_json_str(json.dumps(data))
    assert old.encode("Hello") == old.encode("hello") == [*map(old.source.token_to_id, "hello"), old.eos_id]
    old.save(tmp_path)
    (tmp_path / "source_tokenizer.json").write_text(json.dumps(data["source"]))
    assert Seq2SeqTokenizer.load(tmp_path).encode("Hello") == old.encode("hello")


def test_other_tokenizers_keep_their_case():
    tokenizer = Seq2SeqTokenizer.train(["Hello", "hello"], PHONEMES, "char", "space")
    assert tokenizer.encode("Hello") != tokenizer.encode("hello")
    # Lower-case words with upper-case targets, but not G2P's alphabet: nothing says the case was folded.
    restored = Seq2SeqTokenizer.from_json_str(Seq2SeqTokenizer.train(WORDS, PHONEMES, "char", "space").to_json_str())
    assert restored.encode("Hello")[0] == restored.unk_id


@pytest.mark.parametrize("levels", [("char", "space"), ("bpe", "bpe")])
def test_encode_and_decode_for_source_and_target(levels):
    tokenizer = Seq2SeqTokenizer.train(SENTENCES, TRANSLATIONS, *levels, vocab_size=60)
    ids = tokenizer.encode(SENTENCES[0])
    assert ids == tokenizer.encode_source(SENTENCES[0]) and ids[-1] == tokenizer.eos_id
    assert tokenizer.decode_source(ids) == tokenizer.decode_source(torch.tensor(ids)) == SENTENCES[0]
    generated = [tokenizer.bos_id, *tokenizer.encode_target(TRANSLATIONS[1]), tokenizer.eos_id, tokenizer.pad_id]
    assert tokenizer.decode(generated) == tokenizer.decode(torch.tensor(generated)) == TRANSLATIONS[1]
    assert tokenizer.batch_decode(torch.tensor([generated, generated])) == [TRANSLATIONS[1]] * 2
