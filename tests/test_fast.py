"""The fast path (ONNX Runtime on a CPU) equals the eager path, for every mixer, on padded batches.

fp32: the step's logits within 1e-4 of the eager step's and the same tokens from every decoding
path; int8: judged on quality, the G2P phoneme error rate within half a point of fp32. An exported
graph is cached beside a saved model, so a later process loads it instead of exporting again.
"""

import functools
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    MIXER_PATTERNS,
    TRANSFORMERS_FAMILIES,
    family_architecture,
    padded_batch,
    pattern_id,
    tiny_model,
)

from hybrid import Seq2Seq
from hybrid.accel.onnx import OnnxAccelerator, cache_dir_for, graph_key, weights_digest
from hybrid.generation import beams, engine
from hybrid.generation.config import GenerationConfig
from hybrid.generation.refill import RefillDecoder, Source
from hybrid.generation.rules import DecodingRules
from hybrid.state import DecodeState

ROOT = Path(__file__).resolve().parents[1]

LENGTHS = [6, 2, 4, 5]
# Sampling with every built-in warper and the length rules: what the fast path runs inside its graph. The tests
# share it, so that they share its export.
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=8, top_p=0.9, min_p=0.05, min_new_tokens=2, eos_token_id=[2, 7])
ALPHABET = "abcdefghij"


@pytest.fixture(scope="module", params=MIXER_PATTERNS, ids=pattern_id)
def pair(request):
    """The same tiny model twice: eager, and on the fast path (each export is paid once per module)."""
    return tiny_model(request.param, seed=31), tiny_model(request.param, seed=31).optimize_for_inference()


@functools.cache
def mixed_pair():
    """:func:`pair` with a constant-state mixer and attention, made once: for checks of the rules around the
    step, which need not run per pattern."""
    mixers = ["lstm", "attention"]
    return tiny_model(mixers, seed=31), tiny_model(mixers, seed=31).optimize_for_inference()


@pytest.fixture(scope="module", params=TRANSFORMERS_FAMILIES)
def family_pair(request):
    """:func:`pair` in each imported family's architecture (positions, norms, activation, embedding scale),
    with attention, which an import has, and an LSTM, which it is converted to: the architecture shapes
    the exported step, while the rules around it are the same for every architecture and tested above."""
    architecture = family_architecture(request.param)
    return (tiny_model(["attention", "lstm"], seed=31, **architecture),
            tiny_model(["attention", "lstm"], seed=31, **architecture).optimize_for_inference())


def test_the_fast_step_gives_the_eager_logits(pair):
    eager, fast = pair
    src, tgt = padded_batch(LENGTHS, seed=32), padded_batch([9] * 4, seed=33)
    states = [model.start(src, max_steps=9) for model in pair]
    # The encoder and the cross-attention keys and values: one exported graph too.
    assert "memory" in fast.accelerator.sessions
    for expected, got in zip(*(state.cross_keys + state.cross_values for state in states), strict=True):
        assert (got - expected).abs().max().item() <= 1e-4
    for t in range(9):
        expected, got = (model.step_unchecked(tgt[:, t], state) for model, state in zip(pair, states, strict=True))
        assert (got - expected).abs().max().item() <= 1e-4
    # Rows at their own positions (continuous refill) and beams (rows that share a source).
    positions = torch.tensor([3, 0, 5, 1])
    states = [model.start(src, max_steps=9) for model in pair]
    expected, got = (model.step_unchecked(tgt[:, 0], state, positions) for model, state in zip(pair, states,
                                                                                                strict=True))
    assert (got - expected).abs().max().item() <= 1e-4
    states = [model.start(src, max_steps=9) for model in pair]
    for state in states:
        state.expand(3)
    for t in range(3):
        tokens = tgt[:, t].repeat_interleave(3)
        expected, got = (model.step_unchecked(tokens, state) for model, state in zip(pair, states, strict=True))
        assert (got - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("options", [
    dict(), dict(min_new_tokens=5, eos_token_id=[2, 7], pad_token_id=4), dict(repetition_penalty=1.3),
    dict(num_beams=3, num_return_sequences=2),
    dict(SAMPLING, num_return_sequences=2),
    dict(do_sample=True, repetition_penalty=1.3),  # history-reading: the exported step, the rules in PyTorch
    dict(decoder_input_ids=torch.tensor([[1, 5, 6], [1, 8, 0], [1, 0, 0], [1, 4, 4]])),
], ids=["greedy", "lengths-eos-pad", "penalty", "beams", "sampling-every-warper", "sampling-penalty", "forced-prefix"])
def test_fast_generate_equals_eager_generate(pair, options):
    eager, fast = pair
    src = padded_batch(LENGTHS, seed=34)

    def run(model):
        seeded = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
        return model.generate(src, max_new_tokens=16, **options, **seeded)

    assert torch.equal(run(fast), run(eager))


def test_the_fast_path_equals_eager_in_every_imported_familys_architecture(family_pair):
    test_the_fast_step_gives_the_eager_logits(family_pair)
    for options in (dict(), dict(num_beams=3, num_return_sequences=2)):
        test_fast_generate_equals_eager_generate(family_pair, options)
    test_plain_greedy_takes_one_exported_call_per_token(family_pair)
    test_fast_refill_equals_eager_refill(family_pair, dict())


def test_plain_greedy_takes_one_exported_call_per_token(pair, options=None):
    eager, fast = pair
    options = options or {}
    src = padded_batch(LENGTHS, seed=35)

    def run(model):
        seeded = {"generator": torch.Generator().manual_seed(3)} if options.get("do_sample") else {}
        return model.generate(src, max_new_tokens=12, **options, **seeded)

    out = run(fast)
    assert torch.equal(out, run(eager))
    # A second decode of the same shape reuses what the first one made: no export, the same bindings; and
    # every token it decodes is one advance, one call into ONNX Runtime, with nothing else stepping the model.
    compiled, sessions = dict(fast.accelerator.compiled), dict(fast.accelerator.sessions)
    advances, session_runs = [], []
    advance = "advance_beams" if options.get("num_beams", 1) > 1 else "advance"
    original = getattr(type(fast.accelerator), advance)
    with pytest.MonkeyPatch.context() as patch:
        for session in sessions.values():
            patch.setattr(session, "run_with_iobinding",
                          lambda *args, run=session.run_with_iobinding: session_runs.append(1) or run(*args))
        patch.setattr(type(fast.accelerator), advance, lambda *args: advances.append(1) or original(*args))
        patch.setattr(type(fast.accelerator), "step", lambda *args: pytest.fail("the step ran apart from the rules"))
        assert torch.equal(run(fast), out)
    assert len(advances) == len(session_runs)
    if advance == "advance":  # a row is as long as the steps it took; a beam search returns its best hypotheses
        assert len(advances) == out.shape[1]
    else:
        assert out.shape[1] <= len(advances) <= 12
    assert fast.accelerator.compiled == compiled and fast.accelerator.sessions == sessions


def test_beam_search_takes_one_exported_call_per_token(pair):
    test_plain_greedy_takes_one_exported_call_per_token(pair, dict(num_beams=3, num_return_sequences=2))


@pytest.mark.parametrize("options", [
    dict(num_beams=4, early_stopping=True, eos_token_id=[2, 7], forced_bos_token_id=5, num_return_sequences=2),
    dict(num_beams=2, early_stopping="never", length_penalty=1.5, min_new_tokens=3, forced_eos_token_id=6),
    dict(num_beams=3, length_penalty=-0.5, num_return_sequences=3),
], ids=["early-eos-list-forced-bos", "never-min-length-forced-eos", "negative-penalty"])
def test_beam_search_in_the_graph_equals_eager_in_every_mode(options):
    """Tokens identical and scores within 1e-4 of the eager beam search, with each early_stopping mode,
    num_return_sequences, EOS lists and the length rules, all run inside the exported graph."""
    eager, fast = mixed_pair()
    src = padded_batch(LENGTHS, seed=37)
    expected = eager.generate(src, max_new_tokens=14, return_dict_in_generate=True, **options)
    with torch.inference_mode():
        run = engine._Run(fast, GenerationConfig.from_kwargs(max_new_tokens=14, **options), src)
        assert engine._one_call_per_token(fast, run)
        got = beams.beam_search_by_advances(run, engine.CachedSession(fast, src, None, run.total_steps))
    assert torch.equal(got.sequences, expected.sequences)
    assert (got.sequences_scores - expected.sequences_scores).abs().max().item() <= 1e-4
    assert torch.equal(fast.generate(src, max_new_tokens=14, **options), expected.sequences)


def test_beam_search_with_a_forced_prefix_runs_the_exported_step_and_equals_eager():
    prefix = torch.tensor([[1, 5, 6], [1, 8, 0], [1, 0, 0], [1, 4, 4]])
    test_fast_generate_equals_eager_generate(mixed_pair(), dict(num_beams=3, decoder_input_ids=prefix))


def test_sampling_takes_one_exported_call_per_token_and_draws_the_eager_tokens(pair):
    test_plain_greedy_takes_one_exported_call_per_token(pair, dict(SAMPLING, num_return_sequences=2))


@pytest.mark.parametrize("warper", [dict(temperature=0.6, top_k=0), dict(top_k=3), dict(top_p=0.7, top_k=0),
                                    dict(min_p=0.2, top_k=0)], ids=["temperature", "top-k", "top-p", "min-p"])
def test_each_warper_runs_in_the_graph_and_draws_the_eager_tokens(warper):
    eager, fast = mixed_pair()
    test_plain_greedy_takes_one_exported_call_per_token((eager, fast), dict(do_sample=True, **warper))


@pytest.mark.parametrize("options", [dict(), SAMPLING, dict(min_new_tokens=4)],
                         ids=["greedy", "sampling", "min-length"])
def test_fast_refill_equals_eager_refill(pair, options):
    sources = [Source(i, padded_batch([n], seed=36 + i)[0].tolist()) for i, n in enumerate([3, 7, 1, 5, 2, 6, 4])]

    def run(model):
        seeded = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
        return dict(RefillDecoder(model, slots=3, max_new_tokens=10, **options, **seeded).run([sources]))

    assert run(pair[1]) == run(pair[0])


@pytest.mark.parametrize("options", [dict(), dict(SAMPLING), dict(num_beams=3, num_return_sequences=2)],
                         ids=["greedy", "sampling", "beams"])
def test_one_token_bad_words_run_in_the_graph_and_longer_ones_beside_it(options):
    """One-token bad words are a fixed ban (an imported Marian's ``bad_words_ids=[[pad]]``): one call per token,
    the eager tokens. A longer bad word reads each row's history, so the rules run beside the exported step."""
    eager, fast = mixed_pair()
    single = dict(options, bad_words_ids=[[5], [8]])
    assert DecodingRules(GenerationConfig(**single), fast.config).runs_in_graph
    test_plain_greedy_takes_one_exported_call_per_token((eager, fast), single)
    longer = dict(options, bad_words_ids=[[5], [8, 9]])
    assert not DecodingRules(GenerationConfig(**longer), fast.config).runs_in_graph
    test_fast_generate_equals_eager_generate((eager, fast), longer)


@pytest.mark.parametrize("options", [dict(), SAMPLING, dict(num_beams=3, num_return_sequences=2), "refill"],
                         ids=["greedy", "sampling", "beams", "refill"])
def test_a_cache_growing_through_its_capacity_buckets_decodes_as_eager(options, monkeypatch):
    """40 tokens take the attention cache from 16 steps to 32 and then 40 (``DecodeState.reserve``): each
    capacity is bound anew, and the fast path still equals eager, for every loop that grows a state."""
    eager, fast = mixed_pair()
    capacities = []
    reserve = DecodeState.reserve
    monkeypatch.setattr(DecodeState, "reserve", lambda state, steps: reserve(state, steps) or
                        capacities.append(state.capacity))
    src = padded_batch(LENGTHS, seed=38)

    def run(model):
        if options == "refill":
            sources = [Source(i, row.tolist()) for i, row in enumerate(src)]
            return dict(RefillDecoder(model, slots=3, max_new_tokens=40, min_new_tokens=20).run([sources]))
        seeded = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
        return model.generate(src, **{**options, "max_new_tokens": 40, "min_new_tokens": 40}, **seeded)

    got = run(fast)
    assert sorted(set(capacities)) == [16, 32, 40]
    expected = run(eager)
    assert got == expected if options == "refill" else torch.equal(got, expected)


def test_the_fast_path_refuses_weights_changed_after_it_was_made():
    model = tiny_model(["lstm"], seed=37).optimize_for_inference()
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    with pytest.raises(ValueError, match="weights changed after optimize_for_inference"):
        model.generate(padded_batch([3]), max_new_tokens=2)
    model.optimize_for_inference()  # made again, it decodes the new weights
    assert model.generate(padded_batch([3]), max_new_tokens=2).shape[0] == 1


def test_bad_fast_path_options_are_refused():
    with pytest.raises(ValueError, match="quantize must be one of"):
        tiny_model(["lstm"]).optimize_for_inference("int4")
    with pytest.raises(ValueError, match="float32"):
        tiny_model(["lstm"]).double().optimize_for_inference()
    with pytest.raises(ValueError, match="threads must be a positive int"):
        tiny_model(["lstm"]).optimize_for_inference(threads=0)


def test_the_fast_path_runs_on_the_threads_it_is_given():
    model = tiny_model(["lstm"], seed=38)
    src = padded_batch([3, 5])
    expected = model.generate(src, max_new_tokens=4)
    for threads in (1, 2):
        model.optimize_for_inference(threads=threads)
        assert torch.equal(model.generate(src, max_new_tokens=4), expected)
        sessions = list(model.accelerator.sessions.values())
        assert sessions and all(session.get_session_options().intra_op_num_threads == threads for session in sessions)


def test_int8_keeps_the_g2p_phoneme_error_rate_within_half_a_point(tmp_path):
    # The Quickstart's recipe, smaller: `hybrid test` scores the checkpoint eager, fp32-fast and int8.
    from conftest import compose_config

    from hybrid.cli.train import run_fit, run_test

    small = ["experiment=quickstart", "data.max_words=8000", "trainer.max_epochs=2", "model.d_model=64",
             "model.d_ff=256", "print_examples=0", "test_after_fit=false", "callbacks.progress_bar=null",
             "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "logger=csv"]
    trainer = run_fit(compose_config(small, tmp_path))
    checkpoint = trainer.checkpoint_callback.best_model_path
    per = {}
    for name, fast in [("eager", []), ("fp32", ["optimize=true"]), ("int8", ["optimize=true", "quantize=int8"])]:
        (scores,) = run_test(compose_config([*small, f"ckpt_path={checkpoint}", *fast], tmp_path / name))
        per[name] = scores["test/per"]
    assert {path.name.split("-")[-1].split(".")[0] for path in cache_dir_for(checkpoint).iterdir()} == {"fp32", "int8"}
    assert per["eager"] < 0.6  # it learned something, so that the comparison means something
    assert per["fp32"] == pytest.approx(per["eager"], abs=1e-3)
    assert abs(per["int8"] - per["fp32"]) <= 0.005, per


def test_the_fast_path_refuses_a_model_made_inside_inference_mode():
    with torch.inference_mode():
        model = tiny_model(["lstm"], seed=38)
    with pytest.raises(ValueError, match="inference tensors"):
        model.optimize_for_inference()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved tiny model whose greedy graph one earlier "process" exported into ``<folder>/fast``
    (the only export of the cache tests), and the eager answer it must give."""
    from hybrid.tokenizer import Seq2SeqTokenizer

    folder = tmp_path_factory.mktemp("saved")
    tokenizer = Seq2SeqTokenizer.train([ALPHABET], [ALPHABET])
    tiny_model(["lstm", "attention"], seed=39, vocab_size=tokenizer.vocab_size).save_pretrained(folder)
    tokenizer.save(folder)
    src = padded_batch(LENGTHS, seed=40)
    eager = Seq2Seq.from_pretrained(folder).generate(src, max_new_tokens=8)
    first = Seq2Seq.from_pretrained(folder).optimize_for_inference()
    assert torch.equal(first.generate(src, max_new_tokens=8), eager)
    assert not first.accelerator.loaded_from_cache
    return folder, src, eager


def cached_graphs(folder: Path) -> dict[str, Path]:
    """The graphs cached in ``folder`` by kind: the encoder's (``memory``) and greedy decoding's advance."""
    graphs = {("memory" if "-memory-" in path.name else "advance"): path for path in folder.iterdir()}
    assert len(graphs) == len(list(folder.iterdir())) == 2, sorted(folder.iterdir())
    return graphs


def cached_graph_for(graphs: dict[str, Path], key) -> bytes:
    """What an export of ``key`` would give, read from the cached graphs instead of paying for one."""
    return graphs["memory" if key == "memory" else "advance"].read_bytes()


def refuse_to_export(monkeypatch):
    def export(*args, **kwargs):
        raise AssertionError("the graph was exported again")

    monkeypatch.setattr(torch.onnx, "export", export)


def test_a_model_loaded_again_from_its_folder_loads_the_cached_graph(saved, monkeypatch):
    folder, src, eager = saved
    cached = cached_graphs(folder / "fast")
    refuse_to_export(monkeypatch)
    model = Seq2Seq.from_pretrained(folder).optimize_for_inference()
    assert torch.equal(model.generate(src, max_new_tokens=8), eager)
    assert model.accelerator.loaded_from_cache == set(model.accelerator.sessions)
    assert cached_graphs(folder / "fast") == cached


def test_a_second_hybrid_generate_on_a_checkpoint_loads_the_graph_cached_beside_it(saved, tmp_path):
    from hybrid.training.checkpoint import load_for_inference, write_checkpoint

    folder, _, _ = saved
    checkpoint = write_checkpoint(*load_for_inference(folder), tmp_path / "model.ckpt")
    # The same weights, so the graph the fixture exported is this checkpoint's: as if a first run made it.
    shutil.copytree(folder / "fast", tmp_path / "model.ckpt.fast")
    (tmp_path / "in.txt").write_text("abc\nhij\n")
    result = subprocess.run([sys.executable, "-m", "hybrid.cli", "generate", f"ckpt_path={checkpoint}",
                             "input=in.txt", "output=out.txt", "max_new_tokens=8", "optimize=true", "progress=false",
                             "threads=1"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "loaded the fast step from" in result.stderr and "exported the fast step" not in result.stderr
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 2


def test_the_weights_digest_follows_every_weight():
    model = tiny_model(["lstm"], seed=41)
    digest = weights_digest(model)
    assert weights_digest(tiny_model(["lstm"], seed=41)) == digest
    with torch.no_grad():
        model.decoder_layers[0].ffn.fc_in.bias[3] += 1e-6
    assert weights_digest(model) != digest
    assert graph_key(weights_digest(model), 1, None) != graph_key(digest, 1, None)
    assert graph_key(digest, 1, None) != graph_key(digest, 1, "int8") != graph_key(digest, 3, None)


def test_a_damaged_cached_graph_is_exported_again_never_used(saved, tmp_path, monkeypatch, caplog):
    folder, src, eager = saved
    shutil.copytree(folder, tmp_path / "model")
    graphs = cached_graphs(tmp_path / "model" / "fast")
    cached = graphs["advance"]
    graph = cached.read_bytes()
    cached.write_bytes(graph[: len(graph) // 2])  # cut short, under the name of the whole graph
    exports = []
    # The graph an export would give, without paying for one: what is tested is that it is asked for.
    monkeypatch.setattr(OnnxAccelerator, "_export", lambda self, key, rules: exports.append(key) or graph)
    with caplog.at_level(logging.WARNING, logger="hybrid.accel.onnx"):
        model = Seq2Seq.from_pretrained(tmp_path / "model").optimize_for_inference()
        assert torch.equal(model.generate(src, max_new_tokens=8), eager)
    # Only the damaged graph is exported again; the encoder's, whole, is loaded.
    assert len(exports) == 1 and exports[0] != "memory" and model.accelerator.loaded_from_cache == {"memory"}
    assert "is damaged" in caplog.text
    assert cached.read_bytes() == graph  # written whole again for the next process


def test_a_cache_folder_that_cannot_be_written_only_costs_the_export(saved, tmp_path, monkeypatch, caplog):
    folder, src, eager = saved
    graphs = cached_graphs(folder / "fast")
    monkeypatch.setattr(OnnxAccelerator, "_export", lambda self, key, rules: cached_graph_for(graphs, key))
    (tmp_path / "a-file").write_text("")
    with caplog.at_level(logging.WARNING, logger="hybrid.accel.onnx"):
        model = Seq2Seq.from_pretrained(folder).optimize_for_inference(cache_dir=tmp_path / "a-file")
        assert torch.equal(model.generate(src, max_new_tokens=8), eager)
    assert "cannot cache the fast step" in caplog.text


def test_a_cache_is_written_beside_a_saved_model_and_nowhere_else(saved, tmp_path):
    folder, _, _ = saved
    assert cache_dir_for(folder) == folder / "fast"
    assert cache_dir_for(tmp_path / "last.ckpt") == tmp_path / "last.ckpt.fast"
    assert tiny_model(["lstm"]).optimize_for_inference().accelerator.cache_dir is None  # built in Python


def test_the_readme_fast_path_runs_on_the_default_install_alone(tmp_path):
    # Run in a fresh process where every package that only an extra installs (test, bench, docs) cannot be
    # imported, the README's snippet must still run: it needs only what `pip install hybrid` brings, the
    # packages named in pyproject.toml's dependencies and theirs. (Blocking, not listing what was imported:
    # a dependency may import an installed extra opportunistically, as torch's compiler does colorama.)
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installed, pending = set(), [Requirement(line) for line in
                                 tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in installed or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        installed.add(name)
        pending += map(Requirement, importlib.metadata.requires(requirement.name) or [])
    blocked = sorted(module for module, dists in importlib.metadata.packages_distributions().items()
                     if module != "hybrid" and not {canonicalize_name(dist) for dist in dists} & installed)
    assert "pytest" in blocked  # the test extra's own packages are among them
    # None in sys.modules is Python's own "not installed": importing raises ModuleNotFoundError, and
    # importlib.util.find_spec answers None, as for a package that is absent.
    block = f"import sys\nsys.modules.update(dict.fromkeys({blocked!r}))\n"
    section = (ROOT / "README.md").read_text().split("### The fast path")[1]
    snippet = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    report = "import json, sys\nprint(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
    result = subprocess.run([sys.executable, "-c", block + snippet + report], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    imported = json.loads(result.stdout.splitlines()[-1])
    assert {"onnxruntime", "onnx", "onnxscript"} <= set(imported)  # it did run the fast path
