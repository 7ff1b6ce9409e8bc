"""The generation engine: strategies, options and efficiency, over every registered mixer."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import padded_batch, tiny_model

from hybrid import MIXERS, ModelConfig
from hybrid.generation import beams, engine
from hybrid.generation.config import GenerationConfig
from hybrid.generation.processors import SuppressTokensLogitsProcessor
from hybrid.generation.rules import DecodingRules
from hybrid.generation.sessions import StaticSession
from hybrid.generation.streamers import TokenStreamer

LENGTHS = [6, 2, 4, 5]


@pytest.fixture(params=sorted(MIXERS))
def mixer(request):
    return request.param


def masked_logprobs(model, src, prefix):
    """Reference next-token log-probs by teacher forcing, with padding and BOS never generated."""
    logits = model(src, prefix)[:, -1].float()
    logits[:, [model.config.pad_id, model.config.bos_id]] = float("-inf")
    return F.log_softmax(logits, dim=-1)


def test_beam_search_with_one_beam_equals_greedy(mixer):
    model = tiny_model([mixer, mixer], seed=1)
    src = padded_batch(LENGTHS, seed=1)
    greedy = model.generate(src, max_new_tokens=20)
    with torch.inference_mode():
        run = engine._Run(model, GenerationConfig.from_kwargs(max_new_tokens=20), src)
        session = engine.CachedSession(model, src, None, run.total_steps)
        beam = beams.beam_search(run, session).sequences
    assert torch.equal(beam, greedy)


@pytest.mark.parametrize("options", [
    dict(num_beams=3, num_return_sequences=2),
    dict(num_beams=4, early_stopping=True, eos_token_id=[2, 7], forced_bos_token_id=5),
    dict(num_beams=2, early_stopping="never", length_penalty=1.5, min_new_tokens=3, forced_eos_token_id=6),
    dict(num_beams=3, length_penalty=-0.5, num_return_sequences=3),
], ids=["return-2", "early-eos-list-forced-bos", "never-min-length-forced-eos", "negative-penalty"])
def test_beam_search_by_advances_equals_beam_search(mixer, options):
    """The loop whose steps an accelerator compiles whole (advance_beams) decides as the one with the rules
    around the step, here both eager: what the fast path's graph runs is checked against eager in test_fast."""
    model = tiny_model([mixer, "lstm"], seed=4)
    src = padded_batch(LENGTHS, seed=4)
    outputs = []
    with torch.inference_mode():
        for search in (beams.beam_search, beams.beam_search_by_advances):
            run = engine._Run(model, GenerationConfig.from_kwargs(max_new_tokens=14, **options), src)
            outputs.append(search(run, engine.CachedSession(model, src, None, run.total_steps)))
    expected, got = outputs
    assert torch.equal(got.sequences, expected.sequences)
    # The same arithmetic but for the position, a 0-d tensor there and an int here: float rounding apart.
    assert torch.allclose(got.sequences_scores, expected.sequences_scores, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_finds_the_exhaustive_optimum(mixer, length_penalty):
    model = tiny_model([mixer, "lstm"], seed=2, vocab_size=6)
    config = model.config
    src = padded_batch([3], vocab=6, seed=2)
    max_new = 4
    best_score, best_sequence = -math.inf, None
    free = [t for t in range(6) if t not in (config.pad_id, config.bos_id, config.eos_id)]
    for length in range(1, max_new + 1):
        endings = [[config.eos_id]] + ([[t] for t in free] if length == max_new else [])
        for body in itertools.product(free, repeat=length - 1):
            for end in endings:
                sequence = [*body, *end]
                prefix = torch.tensor([[config.bos_id, *sequence]])
                # Beam search scores log-probabilities, then suppresses padding and BOS (transformers'
                # order: suppress_tokens runs after log_softmax), so the others are not renormalised.
                logprobs = _masked(F.log_softmax(model(src, prefix)[0].float(), dim=-1), config)
                total = sum(logprobs[i, token].item() for i, token in enumerate(sequence))
                score = total / length ** length_penalty
                if score > best_score:
                    best_score, best_sequence = score, sequence
    out = model.generate(src, max_new_tokens=max_new, num_beams=27, early_stopping="never",
                         length_penalty=length_penalty, return_dict=True)
    assert out.sequences[0, :len(best_sequence)].tolist() == best_sequence
    assert out.sequences_scores[0].item() == pytest.approx(best_score, abs=1e-4)


def _masked(logits, config):
    logits[..., [config.pad_id, config.bos_id]] = float("-inf")
    return logits


@pytest.mark.parametrize("options", [dict(), dict(num_beams=3), dict(num_beams=4, num_return_sequences=2)])
def test_cached_equals_uncached(mixer, options):
    model = tiny_model([mixer, "attention", mixer], seed=3)
    src = padded_batch(LENGTHS, seed=3)
    cached = model.generate(src, max_new_tokens=15, **options)
    assert torch.equal(cached, model.generate(src, max_new_tokens=15, use_cache=False, **options))


@pytest.mark.parametrize("options", [dict(), dict(num_beams=3, length_penalty=0.5)])
def test_padded_batch_decodes_like_each_source_alone(mixer, options):
    model = tiny_model([mixer, mixer], seed=4)
    src = padded_batch(LENGTHS, seed=4)
    batched = model.generate(src, max_new_tokens=15, **options)
    for row, length in enumerate(LENGTHS):
        alone = model.generate(src[row:row + 1, :length], max_new_tokens=15, **options)[0]
        assert torch.equal(batched[row, :alone.numel()], alone)
        assert (batched[row, alone.numel():] == model.config.pad_id).all()


@pytest.mark.parametrize("warpers", [dict(temperature=0.7, top_k=0), dict(top_k=4), dict(top_p=0.6, top_k=0),
                                     dict(temperature=1.5, top_k=6, top_p=0.8), dict(min_p=0.2, top_k=0)])
def test_sampling_frequencies_match_the_filtered_softmax(warpers):
    model = tiny_model(["lstm", "attention"], seed=5)
    src = padded_batch([5], seed=5)
    draws = 4000
    generator = torch.Generator().manual_seed(0)
    first = model.generate(src, max_new_tokens=1, do_sample=True, num_return_sequences=draws,
                           generator=generator, **warpers)[:, 0]
    expected = _reference_filter(masked_logprobs(model, src, torch.tensor([[1]]))[0], **warpers)
    observed = torch.bincount(first, minlength=expected.numel()).double() / draws
    # Five standard errors of a binomial proportion, plus a hair for tokens of tiny probability.
    tolerance = 5 * (expected * (1 - expected) / draws).sqrt() + 1e-3
    assert (observed - expected).abs().le(tolerance).all(), (observed, expected)
    assert (observed[expected == 0] == 0).all()


def _reference_filter(logprobs, temperature=1.0, top_k=0, top_p=1.0, min_p=None):
    """Filtered sampling distribution, written directly (sorting in Python)."""
    scores = (logprobs / temperature).tolist()
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    keep = set(order)
    if top_k:
        threshold = scores[order[min(top_k, len(order)) - 1]]
        keep = {i for i in keep if scores[i] >= threshold}
    probabilities = torch.tensor(scores).softmax(0).tolist()
    if top_p < 1.0:
        # Drop the least likely tokens whose total mass stays within 1 - top_p.
        mass, dropped = 0.0, set()
        for i in reversed(order):
            if i not in keep:
                continue
            if mass + probabilities[i] <= 1 - top_p:
                mass += probabilities[i]
                dropped.add(i)
            else:
                break
        keep -= dropped
    if min_p is not None:
        keep = {i for i in keep if probabilities[i] >= min_p * max(probabilities)}
    kept = torch.tensor([probabilities[i] if i in keep else 0.0 for i in range(len(scores))], dtype=torch.float64)
    return kept / kept.sum()


def test_same_generator_seed_gives_same_samples():
    model = tiny_model(["lstm", "lstm"], seed=6)
    src = padded_batch(LENGTHS, seed=6)

    def sample(seed):
        return model.generate(src, max_new_tokens=12, do_sample=True, num_return_sequences=3,
                              generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))


@pytest.mark.parametrize("options", [dict(), dict(do_sample=True, generator=torch.Generator().manual_seed(1))])
def test_streamer_receives_exactly_the_returned_tokens(options):
    model = tiny_model(["attention", "lstm"], seed=7)
    src = padded_batch(LENGTHS, seed=7)
    streamer = TokenStreamer()
    out = model.generate(src, max_new_tokens=10, streamer=streamer, **options)
    assert streamer.finished
    for row, streamed in zip(out.tolist(), streamer.token_ids, strict=True):
        streamed = streamed + [0] * (len(row) - len(streamed))
        assert streamed[:len(row)] == row
        assert all(t == model.config.pad_id for t in streamed[len(row):])


def test_return_dict_scores_and_log_probabilities(mixer):
    model = tiny_model([mixer, mixer], seed=8)
    src = padded_batch(LENGTHS, seed=8)
    out = model.generate(src, max_new_tokens=8, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(out.sequences, model.generate(src, max_new_tokens=8))
    assert len(out.scores) >= out.sequences.shape[1] and out.scores[0].shape == (4, 13)
    for row in range(4):
        tokens = out.sequences[row][out.sequences[row] != 0]
        prefix = torch.cat([torch.tensor([1]), tokens])[None]
        logprobs = F.log_softmax(_masked(model(src[row:row + 1], prefix)[0].float(), model.config), dim=-1)
        expected = sum(logprobs[i, t].item() for i, t in enumerate(tokens.tolist()))
        assert out.sequences_scores[row].item() == pytest.approx(expected, abs=1e-4)


def test_beam_return_dict_has_beam_indices():
    model = tiny_model(["lstm", "attention"], seed=9)
    src = padded_batch(LENGTHS, seed=9)
    out = model.generate(src, max_new_tokens=8, num_beams=3, num_return_sequences=2, return_dict=True)
    assert out.sequences.shape[0] == 8 and out.beam_indices.shape == out.sequences.shape
    assert (out.sequences_scores[0::2] >= out.sequences_scores[1::2]).all()  # best first
    real = out.sequences != 0
    sources = torch.arange(4).repeat_interleave(2)[:, None].expand_as(out.beam_indices)
    assert (out.beam_indices[real] // 3 == sources[real]).all()


def test_forced_decoder_prefix_per_row(mixer):
    model = tiny_model([mixer, mixer], seed=10)
    src = padded_batch(LENGTHS, seed=10)
    prefix = torch.tensor([[1, 5, 6, 7], [1, 8, 0, 0], [1, 0, 0, 0], [1, 4, 4, 0]])
    out = model.generate(src, max_new_tokens=6, decoder_input_ids=prefix)
    assert torch.equal(out, model.generate(src, max_new_tokens=6, decoder_input_ids=prefix, use_cache=False))
    for row in range(4):
        forced = [t for t in prefix[row, 1:].tolist() if t != 0]
        alone = model.generate(src[row:row + 1, :LENGTHS[row]], max_new_tokens=6,
                               decoder_input_ids=prefix[row:row + 1, :1 + len(forced)])[0]
        assert out[row, :len(forced)].tolist() == forced
        assert torch.equal(out[row, :alone.numel()], alone)
        assert 0 < (out[row] != 0).sum() <= len(forced) + 6
    # Without a leading BOS, transformers prepends one; so do we.
    assert torch.equal(model.generate(src, max_new_tokens=6, decoder_input_ids=prefix[:, 1:]), out)


def test_min_new_tokens_and_several_eos_ids():
    model = tiny_model(["lstm", "attention"], seed=11)
    src = padded_batch([3, 5, 7, 2] * 3, seed=11)
    out = model.generate(src, max_new_tokens=12, min_new_tokens=5, eos_token_id=[2, 7])
    for row in out.tolist():
        assert not {2, 7} & set(row[:4])
        ends = [i for i, t in enumerate(row) if t in (2, 7)]
        if ends:
            assert all(t == 0 for t in row[ends[0] + 1:])
    exact = model.generate(src, max_new_tokens=9, min_new_tokens=9)
    assert exact.shape == (12, 9) and (exact != 0).all()


def test_penalties_and_bans_take_effect():
    model = tiny_model(["lstm", "lstm"], seed=12)
    src = padded_batch(LENGTHS, seed=12)
    out = model.generate(src, max_new_tokens=20, min_new_tokens=20, no_repeat_ngram_size=2,
                         bad_words_ids=[[5], [6, 7]])
    for row in out.tolist():
        bigrams = list(zip(row, row[1:], strict=False))
        assert len(bigrams) == len(set(bigrams))
        assert 5 not in row and (6, 7) not in bigrams


def test_custom_processor_and_stopping_criterion_see_the_decoder_ids():
    model = tiny_model(["attention", "lstm"], seed=13)
    src = padded_batch(LENGTHS, seed=13)
    seen = []

    def only_tokens_3_and_4(input_ids, scores):
        seen.append(input_ids.shape)
        banned = torch.ones_like(scores, dtype=torch.bool)
        banned[:, [3, 4]] = False
        return scores.masked_fill(banned, float("-inf"))

    def stop_at_three_tokens(input_ids, scores):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] > 3)

    out = model.generate(src, max_new_tokens=10, logits_processor=[only_tokens_3_and_4],
                         stopping_criteria=[stop_at_three_tokens])
    assert out.shape == (4, 3) and set(out.flatten().tolist()) <= {3, 4}
    assert seen[0] == (4, 1) and seen[1] == (4, 2)  # BOS column first, like transformers


def test_encoder_runs_once_per_source_and_finished_rows_leave(monkeypatch):
    model = tiny_model(["lstm", "attention"], seed=0)
    src = padded_batch([3, 5, 7, 2] * 2, seed=14)
    encoder_batches, step_batches = [], []
    model.encoder_layers[0].register_forward_hook(lambda m, args, out: encoder_batches.append(out.shape[0]))
    original_step = model.step_unchecked
    monkeypatch.setattr(model, "step_unchecked",
                        lambda tokens, state: step_batches.append(tokens.shape[0]) or original_step(tokens, state))
    model.generate(src, max_new_tokens=20, num_beams=4, early_stopping=True)
    assert encoder_batches == [8]  # not 8 * 4 beams
    assert step_batches[0] == 32 and step_batches[-1] < 32  # done sources leave the working batch
    assert step_batches == sorted(step_batches, reverse=True)


@pytest.mark.parametrize("options, name", [
    (dict(top_p=0.0, do_sample=True), "top_p"),
    (dict(top_p=1.5, do_sample=True), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(temperature=0.0, do_sample=True), "temperature"),
    (dict(num_beams=0), "num_beams"),
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences"),
    (dict(min_new_tokens=9, max_new_tokens=4), "min_new_tokens"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size"),
    (dict(early_stopping="sometimes"), "early_stopping"),
    (dict(eos_token_id=[]), "eos_token_id"),
    (dict(eos_token_id=99), "eos_token_id"),
    (dict(num_return_sequences=2), "num_return_sequences"),
    (dict(num_beams=2, streamer=TokenStreamer()), "streamer"),
    (dict(generator=3), "generator"),
    (dict(decoder_input_ids=torch.tensor([[1, 0, 5]] * 2)), "decoder_input_ids"),
    (dict(max_lenght=4), "max_lenght"),
    (dict(do_sample="yes"), "do_sample"),
    (dict(use_cache="no"), "use_cache"),
    (dict(return_dict="no"), "return_dict_in_generate"),
    (dict(eos_token_id=True), "eos_token_id"),
    (dict(eos_token_id=2.0), "eos_token_id"),
    (dict(eos_token_id=[2, "3"]), "eos_token_id"),
    (dict(pad_token_id=-1), "pad_token_id"),
    (dict(pad_token_id=20), "pad_token_id"),  # the tiny model's vocabulary size
    (dict(pad_token_id=True), "pad_token_id"),
    (dict(bad_words_ids=[5]), "bad_words_ids"),
    (dict(bad_words_ids=[[]]), "bad_words_ids"),
    (dict(bad_words_ids=[["a"]]), "bad_words_ids"),
    (dict(logits_processor=lambda ids, scores: scores), "logits_processor"),
    (dict(stopping_criteria=[3]), "stopping_criteria"),
])
def test_bad_options_raise_before_any_compute(options, name):
    model = tiny_model(["lstm"])

    def no_compute(*args, **kwargs):
        raise AssertionError("computed before validating")

    model.encode = no_compute
    with pytest.raises(ValueError, match=name):
        model.generate(padded_batch([3, 2]), **options)


def test_a_huge_length_penalty_scores_instead_of_overflowing():
    model = tiny_model(["lstm"], seed=16)
    out = model.generate(padded_batch([3, 2]), max_new_tokens=4, num_beams=2, length_penalty=1e9,
                         early_stopping="never")
    assert out.shape[0] == 2


def test_transformers_processors_work_unchanged():
    transformers = pytest.importorskip("transformers")
    model = tiny_model(["lstm", "attention"], seed=15)
    src = padded_batch(LENGTHS, seed=15)
    theirs = model.generate(src, max_new_tokens=12, logits_processor=[
        transformers.NoRepeatNGramLogitsProcessor(2), transformers.RepetitionPenaltyLogitsProcessor(1.3)],
        stopping_criteria=[transformers.MaxLengthCriteria(max_length=8)])
    ours = model.generate(src, max_new_tokens=7, no_repeat_ngram_size=2, repetition_penalty=1.3)
    assert torch.equal(theirs, ours)


STRATEGIES = {"greedy": dict(), "sample": dict(do_sample=True), "beam": dict(num_beams=2, num_return_sequences=2)}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_generated_padding_is_a_token_kept_to_the_end_of_its_row(strategy):
    # Your own SuppressTokensLogitsProcessor takes the place of the ban on padding and BOS (transformers' rule).
    # This one leaves padding and EOS, which min_new_tokens bans to the limit: every row is padding, and it is
    # returned whole, as wide as max_new_tokens, not trimmed away as if it were the fill after an end.
    model = tiny_model(["lstm", "attention"], seed=16)
    pad, eos = model.config.pad_id, model.config.eos_id
    all_but_padding_and_eos = [token for token in range(model.config.vocab_size) if token not in (pad, eos)]
    out = model.generate(padded_batch(LENGTHS, seed=16), max_new_tokens=5, min_new_tokens=5, return_dict=True,
                         logits_processor=[SuppressTokensLogitsProcessor(all_but_padding_and_eos)],
                         **STRATEGIES[strategy])
    hypotheses = out.sequences[out.sequences_scores.isfinite()]
    assert hypotheses.shape == (len(LENGTHS), 5) and (hypotheses == pad).all()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_cuda_graph_loop_lets_your_own_suppress_tokens_lift_the_ban_on_padding_and_bos(mixer, strategy):
    # What the CUDA-graph loop runs, uncaptured: the same rules, so padding and BOS come up as in generate.
    # Sampling lets no row end early, so both draw from the generator in the same order.
    model = tiny_model([mixer, mixer], seed=17)
    src = padded_batch(LENGTHS, seed=17)
    options = dict(max_new_tokens=6, min_new_tokens=6 if strategy == "sample" else 2, **STRATEGIES[strategy],
                   logits_processor=[SuppressTokensLogitsProcessor(list(range(3, model.config.vocab_size)))])
    seeded = lambda: {"generator": torch.Generator().manual_seed(0)} if strategy == "sample" else {}  # noqa: E731
    static = engine.decode(model, src, None, GenerationConfig.from_kwargs(**options, **seeded()), StaticSession)
    assert torch.equal(static, model.generate(src, **options, **seeded()))
    assert set(static[:, :2].flatten().tolist()) <= {model.config.pad_id, model.config.bos_id}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("options", [dict(), dict(do_sample=True, top_p=0.9), dict(num_beams=3)])
def test_host_syncs_do_not_grow_with_the_number_of_steps(options):
    import warnings

    model = tiny_model(["lstm", "attention"], seed=16).cuda()
    src = padded_batch(LENGTHS, seed=16).cuda()
    model.generate(src, max_new_tokens=4, **options)  # warm-up: lazily built per-device tensors

    def count_syncs(steps):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.generate(src, max_new_tokens=steps, min_new_tokens=steps, eos_check_interval=steps,
                               **options)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    assert count_syncs(8) == count_syncs(64)


@pytest.mark.parametrize(("rows", "vocab"), [(1, 4), (5, 40), (3, 5000)])
def test_a_draw_from_noise_is_torch_multinomials_draw(rows, vocab):
    # The fast path samples inside its graph from noise drawn before the step (DecodingRules.sampling_noise):
    # it must give multinomial's tokens and leave the generator where multinomial leaves it, or seeded
    # sampling on the fast path would not reproduce the eager path's.
    scores = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    scores[:, ::3] = float("-inf")  # banned tokens: probability 0, never drawn
    rules = DecodingRules(GenerationConfig(do_sample=True, generator=torch.Generator()),
                          ModelConfig(vocab_size=vocab, d_model=8, n_heads=1, d_ff=8))
    for seed in range(20):
        rules.config.generator.manual_seed(seed)
        drawn = rules.choose(scores)
        after_multinomial = rules.config.generator.get_state()
        rules.config.generator.manual_seed(seed)
        from_noise = rules.choose(scores, rules.sampling_noise(torch.empty(rows, vocab)))
        assert torch.equal(from_noise, drawn)
        assert torch.equal(rules.config.generator.get_state(), after_multinomial)
        assert not bool((from_noise % 3 == 0).any())
