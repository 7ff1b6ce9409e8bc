"""An imported model's own transformers tokenizer (hybrid.hf.tokenizer): transformers' ids and texts, the model's
special ids, and every verb on raw text with it. Tokenizers are built here, never downloaded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece
import torch
from conftest import compose_config, decode_alone, tiny_model
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, BartTokenizer, MarianTokenizer, PreTrainedTokenizerFast

from hybrid import ModelConfig, Seq2Seq
from hybrid.hf.tokenizer import PretrainedTokenizer
from hybrid.training import G2PDataModule, LitSeq2Seq
from hybrid.training.checkpoint import load_for_inference, read_checkpoint, write_checkpoint

TEXTS = ["the cat sat on a mat", "dogs ran , loudly", "birds do n't sang", "zebra", ""]
WORDS = "the cat sat on a mat while dogs ran across green fields and birds sang loudly".split()


def wordlevel_folder(folder: Path, clean_up_spaces: bool) -> Path:
    """A WordLevel tokenizer.json closing every text with </s>, saved by transformers' PreTrainedTokenizerFast."""
    words = ["<pad>", "<s>", "</s>", "<unk>", ",", "n't", "do", *WORDS]
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", clean_up_tokenization_spaces=clean_up_spaces).save_pretrained(folder)
    return folder


def bart_folder(folder: Path) -> Path:
    """BART's byte-level BPE (transformers' BartTokenizer), which wraps every text in <s> ... </s>."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for symbol in ["Ġ", ",", *"abcdefghijklmnopqrstuvwxyz"]:
        vocab[symbol] = len(vocab)
    merges = [("t", "h"), ("th", "e"), ("Ġ", "c"), ("Ġc", "a")]
    for first, second in merges:
        vocab[first + second] = len(vocab)
    vocab["<mask>"] = len(vocab)
    BartTokenizer(vocab=vocab, merges=merges).save_pretrained(folder)
    return folder


def marian_folder(folder: Path) -> Path:
    """A Marian (OPUS-MT) tokenizer: SentencePiece source.spm and target.spm over one vocab.json, </s> at id 0
    and <pad> last, as in OPUS-MT models, whose decoder starts from pad."""
    folder.mkdir(parents=True)
    sentences = [" ".join(WORDS[start:] + WORDS[:start]) for start in range(len(WORDS))]
    for side in ("source", "target"):
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_prefix=str(folder / side), vocab_size=30, bos_id=-1, eos_id=-1,
            pad_id=-1, unk_id=0, minloglevel=2)
        (folder / f"{side}.model").rename(folder / f"{side}.spm")
    vocab = {"</s>": 0, "<unk>": 1}
    for line in (folder / "source.vocab").read_text().splitlines():
        vocab.setdefault(line.split("\t")[0], len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    saved = folder / "saved"
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
                    ).save_pretrained(saved)
    return saved


def model_config_for(tokenizer, bos: str) -> ModelConfig:
    """A config whose vocabulary and ids are ``tokenizer``'s (a transformers tokenizer), decoding from ``bos``."""
    bos_id = {"pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id, "bos": tokenizer.bos_token_id}[bos]
    return ModelConfig(vocab_size=len(tokenizer), pad_id=tokenizer.pad_token_id, bos_id=bos_id,
                       eos_id=tokenizer.eos_token_id)


FOLDERS = {"wordlevel": lambda folder: wordlevel_folder(folder, clean_up_spaces=False),
           "wordlevel-clean-up-spaces": lambda folder: wordlevel_folder(folder, clean_up_spaces=True),
           "bart": bart_folder, "marian": marian_folder}
DECODER_START = {"wordlevel": "bos", "wordlevel-clean-up-spaces": "bos", "bart": "eos", "marian": "pad"}


@pytest.fixture(scope="module", params=list(FOLDERS))
def saved_tokenizer(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, FOLDERS[request.param](tmp_path_factory.mktemp(request.param) / "tokenizer")


def test_ids_and_texts_are_transformers_own(saved_tokenizer):
    kind, folder = saved_tokenizer
    reference = AutoTokenizer.from_pretrained(folder)
    tokenizer = PretrainedTokenizer.load(folder, model_config_for(reference, DECODER_START[kind]))
    for text in TEXTS:
        source_ids = reference(text)["input_ids"]
        assert tokenizer.encode_source(text) == source_ids
        assert tokenizer.encode_target(text) + [tokenizer.eos_id] == reference(text_target=text)["input_ids"]
        assert tokenizer.decode(source_ids) == reference.decode(source_ids, skip_special_tokens=True)
        assert tokenizer.decode_source(torch.tensor(source_ids)) == reference.decode(
            source_ids, skip_special_tokens=True, use_source_tokenizer=True)
        assert tokenizer.is_blank_source(source_ids) == (text == "")
    rows = torch.tensor([reference(text)["input_ids"][:3] for text in TEXTS[:3]])
    assert tokenizer.batch_decode(rows) == reference.batch_decode(rows, skip_special_tokens=True)
    assert (tokenizer.pad_id, tokenizer.eos_id) == (reference.pad_token_id, reference.eos_token_id)
    assert tokenizer.bos_id == getattr(reference, f"{DECODER_START[kind]}_token_id")  # the model's, not the tokenizer's


def test_cleaning_up_spaces_follows_the_tokenizers_config(tmp_path):
    # transformers' decode turns "do n't" into "don't" only where the tokenizer's config asks for it.
    config = ModelConfig(vocab_size=30, pad_id=0, bos_id=1, eos_id=2)
    cleaned = PretrainedTokenizer.load(wordlevel_folder(tmp_path / "clean", True), config)
    kept = PretrainedTokenizer.load(wordlevel_folder(tmp_path / "keep", False), config)
    ids = kept.encode_source("birds do n't sang")
    assert (cleaned.decode(ids), kept.decode(ids)) == ("birds don't sang", "birds do n't sang")


def test_a_tokenizer_that_is_not_the_models_is_refused(tmp_path):
    folder = wordlevel_folder(tmp_path / "tokenizer", clean_up_spaces=False)  # 23 ids; pad 0, eos 2
    with pytest.raises(ValueError, match=rf"tokenizer in {folder} has ids up to 22, beyond the model's vocab_size 20"):
        PretrainedTokenizer.load(folder, ModelConfig(vocab_size=20, pad_id=0, bos_id=1, eos_id=2))
    with pytest.raises(ValueError, match="has pad id 0 but the model's pad_id is 5: it is not this model's tokenizer"):
        PretrainedTokenizer.load(folder, ModelConfig(vocab_size=23, pad_id=5, bos_id=1, eos_id=2))
    with pytest.raises(ValueError, match="has eos id 2 but the model's eos_id is 1"):
        PretrainedTokenizer.load(folder, ModelConfig(vocab_size=23, pad_id=0, bos_id=2, eos_id=1))
    with pytest.raises(FileNotFoundError, match="neither tokenizer.json nor tokenizer_config.json"):
        PretrainedTokenizer.load(tmp_path, ModelConfig(vocab_size=23))


def test_a_tokenizer_json_needs_no_transformers_and_sentencepiece_names_the_extra(tmp_path):
    wordlevel_folder(tmp_path / "wordlevel", clean_up_spaces=False)
    marian_folder(tmp_path / "marian")
    script = """
import sys
sys.modules["transformers"] = None  # as if the hf extra were not installed
from hybrid import ModelConfig
from hybrid.hf.tokenizer import PretrainedTokenizer
print(PretrainedTokenizer.load("wordlevel", ModelConfig(vocab_size=23)).encode_source("the cat"))
try:
    PretrainedTokenizer.load("marian/saved", ModelConfig(vocab_size=32, pad_id=31, bos_id=31, eos_id=0))
except ImportError as error:
    print(error)
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [
        "[7, 8, 2]", "this tokenizer is read by transformers' own class, which needs transformers and sentencepiece "
        '(transformers is missing): pip install "hybrid[hf]"']


def test_a_checkpoint_keeps_an_imported_models_tokenizer(tmp_path):
    # `hybrid convert` of an imported model writes a checkpoint that `hybrid fit init_from=...` and Lightning read.
    folder = marian_folder(tmp_path / "tokenizer")
    config = model_config_for(AutoTokenizer.from_pretrained(folder), bos="pad")
    tokenizer = PretrainedTokenizer.load(folder, config)
    path = write_checkpoint(Seq2Seq(config), tokenizer, tmp_path / "model.ckpt")
    restored = read_checkpoint(path).tokenizer
    assert isinstance(restored, PretrainedTokenizer) and restored.files == tokenizer.files
    assert restored.encode_source("the cat sat") == tokenizer.encode_source("the cat sat")
    module = LitSeq2Seq(config.to_dict())
    module.on_load_checkpoint(torch.load(path, weights_only=True))
    assert module.tokenizer.files == tokenizer.files and module.tokenizer.bos_id == config.pad_id


def test_a_model_folder_without_a_tokenizer_is_one_error_naming_both_kinds(tmp_path):
    tiny_model(["lstm"]).save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no tokenizer: neither hybrid's tokenizer files .* nor a tokenizer/"):
        load_for_inference(tmp_path)


def test_hybrid_generate_decodes_raw_text_with_an_imported_marian_model(tmp_path):
    folder = tmp_path / "imported"
    tokenizer_folder = marian_folder(tmp_path / "marian")
    config = model_config_for(AutoTokenizer.from_pretrained(tokenizer_folder), bos="pad")  # Marian's decoder start
    model = tiny_model(["lstm"], vocab_size=config.vocab_size, pad_id=config.pad_id, bos_id=config.bos_id,
                       eos_id=config.eos_id)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_folder).save_pretrained(folder / "tokenizer")
    loaded, tokenizer = load_for_inference(folder)
    assert isinstance(tokenizer, PretrainedTokenizer)
    sources = ["the cat sat", "", "green fields and birds"]
    expected = [decode_alone(loaded, tokenizer, source, max_new_tokens=6) for source in sources]
    assert expected[0] and expected[1] == ""  # a text came out, and a blank line gets an empty one

    result = subprocess.run([sys.executable, "-m", "hybrid.cli", "generate", f"ckpt_path={folder}", "batch_size=2",
                             "max_new_tokens=6"], cwd=tmp_path, input="\n".join(sources) + "\n",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == expected


def g2p_twin(native: Seq2Seq, native_tokenizer, folder: Path) -> None:
    """Save into ``folder`` the same model as ``native`` (a G2P model), as if imported from transformers: every
    id reversed (pad, bos, eos and unk become the last four), its tokenizer a transformers tokenizer.json."""
    vocab_size = native.config.vocab_size
    vocab = {token: vocab_size - 1 - index for token, index in native_tokenizer.source.get_vocab().items()}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # A word's letters, a pronunciation's phonemes; unknown symbols print as "<unk>", as hybrid's own tokenizer does.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"[A-Z]+[0-2]?|."), behavior="isolated")])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
                            ).save_pretrained(folder / "tokenizer")
    config = ModelConfig.from_dict({**native.config.to_dict(), "pad_id": vocab["<pad>"], "bos_id": vocab["<s>"],
                                    "eos_id": vocab["</s>"]})
    twin = Seq2Seq(config)
    # Every row indexed by a token id (embedding, output head) moves with its id.
    twin.load_state_dict({name: tensor.flip(0) if tensor.shape[0] == vocab_size else tensor
                          for name, tensor in native.state_dict().items()})
    twin.save_pretrained(folder)


def test_hybrid_test_scores_an_imported_model_as_its_native_twin(tmp_path):
    # The same model saved natively and, with every id moved, as an imported model with its own tokenizer:
    # `hybrid test data=g2p` must give both the same loss, PER and WER, so the data and the decoding follow
    # the model's tokenizer and ids, not hybrid's own.
    from hybrid.cli.train import run_test
    from hybrid.training.checkpoint import export_checkpoint

    native_tokenizer = G2PDataModule().build_tokenizer()
    native = tiny_model(["lstm"], vocab_size=native_tokenizer.vocab_size, seed=1)
    checkpoint = write_checkpoint(native, native_tokenizer, tmp_path / "native.ckpt")
    export_checkpoint(checkpoint, tmp_path / "native")
    g2p_twin(native, native_tokenizer, tmp_path / "imported")
    quiet = ["data=g2p", "data.max_words=200", "trainer=cpu", "logger=csv", "print_examples=0",
             "callbacks.progress_bar=null", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]
    (native_scores,) = run_test(compose_config([*quiet, f"ckpt_path={tmp_path / 'native'}"], tmp_path / "run-native"))
    (imported_scores,) = run_test(compose_config([*quiet, f"ckpt_path={tmp_path / 'imported'}"],
                                                 tmp_path / "run-imported"))
    assert {"test/per", "test/wer", "test/loss"} <= native_scores.keys()
    assert 0 < native_scores["test/per"]  # the random model errs, so equal scores mean equal predictions
    assert imported_scores == pytest.approx(native_scores, rel=1e-6)
