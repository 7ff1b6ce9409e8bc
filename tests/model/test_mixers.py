"""Each mixer against its paper's definition, written out step by step, and its own options."""

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid import MIXERS, ModelConfig
from hybrid.mixers.performer import orthogonal_random_features
from hybrid.mixers.ssru import linear_recurrence


def _config(**options):
    return ModelConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=32, decoder_layers=1, dropout=0.0,
                       mixer_options=options)


def _mixer(name, **options):
    torch.manual_seed(0)
    config = _config(**({name: options} if options else {}))
    return MIXERS[name](config, config.options_for(name)).eval()


def test_ssru_is_marians_recurrence():
    mixer = _mixer("ssru", chunk_size=4)
    x = torch.randn(2, 11, 16)
    cell, expected = torch.zeros(2, 16), []
    for t in range(11):  # Kim et al. 2019: f = sigmoid(W_f x + b_f); c = f c + (1 - f) W x; y = relu(c)
        forget = torch.sigmoid(mixer.gate(x[:, t]))
        cell = forget * cell + (1 - forget) * mixer.value(x[:, t])
        expected.append(torch.relu(cell))
    assert torch.allclose(mixer(x), torch.stack(expected, dim=1), atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 3, 64])
def test_the_chunked_scan_does_not_depend_on_the_chunk_size(chunk_size):
    log_decay, inputs = -torch.rand(2, 40, 5) * 3, torch.randn(2, 40, 5)
    reference = torch.zeros_like(inputs)
    carry = torch.zeros(2, 5)
    for t in range(40):
        carry = log_decay[:, t].exp() * carry + inputs[:, t]
        reference[:, t] = carry
    assert torch.allclose(linear_recurrence(log_decay, inputs, chunk_size), reference, atol=1e-5)


def test_the_scan_has_finite_gradients_even_with_tiny_forget_gates():
    log_decay = torch.full((1, 70, 3), -80.0, requires_grad=True)  # f = e^-80: would overflow as a ratio
    inputs = torch.randn(1, 70, 3, requires_grad=True)
    linear_recurrence(log_decay, inputs, chunk_size=32).sum().backward()
    assert torch.isfinite(log_decay.grad).all() and torch.isfinite(inputs.grad).all()


def test_aan_is_the_cumulative_average_and_its_gating_layer_over_positioned_inputs():
    mixer = _mixer("aan", ffn_size=8)
    x = torch.randn(2, 7, 16)
    frequencies = 10000.0 ** (-torch.arange(0, 16, 2) / 16)
    encodings = torch.stack([torch.stack([(t * frequencies).sin(), (t * frequencies).cos()], dim=-1).flatten()
                             for t in range(7)])  # Vaswani et al.: sin and cos interleaved, (T, D)
    positioned = x + encodings
    expected = []
    for t in range(7):  # Zhang et al. 2018: a = FFN(mean(x_1..x_t)); i, f = sigmoid(W [x; a]); y = i x + f a
        average = mixer.ffn_out(torch.relu(mixer.ffn_in(positioned[:, :t + 1].mean(dim=1))))
        gates = torch.sigmoid(mixer.gates(torch.cat([positioned[:, t], average], dim=-1)))
        expected.append(gates[:, :16] * positioned[:, t] + gates[:, 16:] * average)
    assert torch.allclose(mixer(x), torch.stack(expected, dim=1), atol=1e-5)
    assert not torch.allclose(mixer(x.flip(1))[:, -1], mixer(x)[:, -1], atol=1e-3)  # the order counts


def test_lstm_forget_bias_sets_the_forget_gates_summed_bias_and_none_keeps_pytorchs_init():
    biased, default = _mixer("lstm", forget_bias=1.0), _mixer("lstm")
    summed = biased.lstm.bias_ih_l0 + biased.lstm.bias_hh_l0  # what the gate adds: (4H,), i, f, g, o
    assert torch.equal(summed[16:32], torch.ones(16))
    for name in ("bias_ih_l0", "bias_hh_l0"):  # the other gates keep PyTorch's init, seed for seed
        assert torch.equal(getattr(biased.lstm, name)[:16], getattr(default.lstm, name)[:16])
        assert torch.equal(getattr(biased.lstm, name)[32:], getattr(default.lstm, name)[32:])
    assert not torch.allclose((default.lstm.bias_ih_l0 + default.lstm.bias_hh_l0)[16:32], torch.ones(16))
    x = torch.randn(2, 5, 16)
    with torch.no_grad():  # the fused step sees the same bias
        state = biased.allocate_state(2, 5, x.device, x.dtype)
        # clone: with no projection the step returns its state's hidden, which the next step overwrites
        stepped = torch.stack([biased.step(x[:, t], state, t).clone() for t in range(5)], dim=1)
        assert torch.allclose(stepped, biased(x), atol=1e-5)


def test_gru_steps_are_pytorchs_gru():
    mixer = _mixer("gru", hidden_size=12)
    x = torch.randn(3, 9, 16)
    state = mixer.allocate_state(3, 9, x.device, x.dtype)
    stepped = torch.stack([mixer.step(x[:, t], state, t) for t in range(9)], dim=1)
    assert torch.allclose(stepped, mixer(x), atol=1e-5)
    assert mixer.gru.hidden_size == 12 and mixer.out.in_features == 12


@pytest.mark.parametrize("name, options, message", [
    ("ssru", {"chunk_size": 0}, "mixer_options.ssru.chunk_size must be a positive int"),
    ("aan", {"ffn_size": 2.5}, "mixer_options.aan.ffn_size must be a positive int or None"),
    ("gru", {"hidden_size": -1}, "mixer_options.gru.hidden_size"),
    ("gru", {"chunk_size": 4},
     r"mixer_options.gru: unknown options \['chunk_size'\]; allowed: \['hidden_size', 'output_projection'\]"),
    ("lstm", {"output_projection": "yes"}, "mixer_options.lstm.output_projection must be true or false"),
    ("t2r", {"feature_size": 0}, "mixer_options.t2r.feature_size must be a positive int"),
    ("linear", {"chunk_size": "8"}, "mixer_options.linear.chunk_size must be a positive int"),
    ("performer", {"feature_size": 0}, "mixer_options.performer.feature_size must be a positive int or None"),
    ("performer", {"redraw_interval": 0}, "mixer_options.performer.redraw_interval must be a positive int or None"),
    ("performer", {"redraw_interval": 2.5}, "mixer_options.performer.redraw_interval must be a positive int or None"),
    ("lstm", {"forget_bias": "1"}, "mixer_options.lstm.forget_bias must be a number or None"),
    ("lstm", {"forget_bias": float("nan")}, "mixer_options.lstm.forget_bias must be a number or None"),
])
def test_a_mixers_own_options_are_checked_by_it_and_named(name, options, message):
    with pytest.raises(ValueError, match=message):
        _config(**{name: options})


def _softmax_free_reference(q, k, v):
    """y_t = sum_{s<=t} (q_t . k_s) v_s / sum_{s<=t} q_t . k_s, position by position (no chunks, no state)."""
    out = torch.zeros_like(v)
    for t in range(q.shape[2]):
        weights = (q[:, :, t:t + 1] * k[:, :, :t + 1]).sum(-1, keepdim=True)  # (B, nh, t+1, 1)
        out[:, :, t] = (weights * v[:, :, :t + 1]).sum(2) / (weights.sum(2) + 1e-6)
    return out


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_chunked_linear_attention_is_the_causal_kernel_sum(chunk_size):
    from hybrid.mixers.linear import causal_linear_attention

    q, k, v = torch.rand(2, 3, 13, 4), torch.rand(2, 3, 13, 4), torch.randn(2, 3, 13, 5)
    assert torch.allclose(causal_linear_attention(q, k, v, chunk_size), _softmax_free_reference(q, k, v), atol=1e-5)


@pytest.mark.parametrize("name", ["linear", "t2r", "performer"])
def test_linear_attention_applies_its_feature_map_to_the_rotated_queries_and_keys(name):
    from hybrid.layers import merge_heads, project_qkv

    mixer = _mixer(name)
    x = torch.randn(2, 9, 16)
    q, k, v = project_qkv(mixer.qkv(x), mixer.n_heads, mixer.rotary, 0)
    features_q, features_k = mixer.feature_map(q), mixer.feature_map(k)
    assert (features_q >= 0).all() and features_q.shape[-1] == mixer.feature_size
    expected = mixer.out(merge_heads(_softmax_free_reference(features_q, features_k, v)))
    assert torch.allclose(mixer(x), expected, atol=1e-5)
    if name == "linear":  # Katharopoulos et al.: elu(x) + 1
        assert torch.equal(features_q, torch.nn.functional.elu(q) + 1)
    elif name == "t2r":  # Kasai et al.: relu(W x + b), one W per head
        assert mixer.feature_weight.shape == (mixer.n_heads, 32, mixer.head_dim)
    else:  # Choromanski et al.: 2 x head_dim random features by default, one draw for every head
        assert mixer.projection.shape == (2 * mixer.head_dim, mixer.head_dim)


def test_performer_features_are_favor_plus():
    mixer = _mixer("performer", feature_size=20)  # head_dim 8: two full orthogonal blocks and half of one
    projection = mixer.projection
    norms = projection.norm(dim=1)
    for block in projection.split(8):  # rows orthogonal within a block, each as long as a Gaussian vector
        assert torch.allclose(block @ block.T, torch.diag(block.norm(dim=1) ** 2), atol=1e-4)
    assert norms.std() > 0.1  # chi-distributed lengths, not unit rows scaled by sqrt(head_dim)
    x = torch.randn(2, 2, 5, 8)
    expected = torch.empty(2, 2, 5, 20)
    for t in range(5):  # Choromanski et al. 2021, Lemma 1: phi(x) = exp(-|x|^2/2) (exp(w_j . x))_j / sqrt(m)
        scaled = x[:, :, t] / 8 ** 0.25  # so that phi(q) . phi(k) estimates exp(q . k / sqrt(head_dim))
        for j in range(20):
            expected[:, :, t, j] = torch.exp((projection[j] * scaled).sum(-1) - scaled.square().sum(-1) / 2) / 20 ** 0.5
    assert torch.allclose(mixer.feature_map(x), expected, rtol=1e-5)
    # Queries lose a factor of their own, which their outputs do not see; their largest feature is 1.
    ratio = mixer.query_feature_map(x) / expected
    assert torch.allclose(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-4)
    assert torch.equal(mixer.query_feature_map(x).amax(-1), torch.ones(2, 2, 5))


def test_performer_key_features_stay_finite_where_the_formula_overflows_float32():
    config = ModelConfig(vocab_size=11, d_model=256, n_heads=1, d_ff=32, decoder_layers=1, dropout=0.0,
                         mixer_options={"performer": {"feature_size": 16}})
    torch.manual_seed(0)
    mixer = MIXERS["performer"](config, config.options_for("performer")).eval()
    row = mixer.projection[0]
    key = (row * 256 ** 0.25).view(1, 1, 1, 256)  # scaled, the row itself: exponent |w|^2 / 2, about 128
    assert (row.square().sum() / 2).exp().isinf()  # float32 ends at e^88.7
    features = mixer.feature_map(key)
    assert torch.isfinite(features).all() and features.max() > 1e20


def test_performer_approaches_softmax_attention_as_its_features_grow():
    from hybrid.mixers import AttentionMixer

    x = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(0))
    errors = []
    for features in (16, 64, 256, 1024):
        relative = []
        for seed in range(4):  # the mean over draws: one draw may land lucky
            performer = _mixer("performer", feature_size=features)
            torch.manual_seed(seed)
            performer.projection.copy_(orthogonal_random_features(features, performer.head_dim))
            config = _config()
            attention = AttentionMixer(config, config.options_for("attention")).eval()
            attention.qkv.load_state_dict(performer.qkv.state_dict())
            attention.out.load_state_dict(performer.out.state_dict())
            with torch.no_grad():
                exact = attention(x)
                relative.append(((performer(x) - exact).norm() / exact.norm()).item())
        errors.append(sum(relative) / len(relative))
    assert errors == sorted(errors, reverse=True) and len(set(errors)) == len(errors), errors


def test_performer_redraws_its_features_in_training_every_interval_and_never_in_eval():
    mixer = _mixer("performer", redraw_interval=3).train()
    x = torch.randn(2, 5, 16)
    drawn = mixer.projection.clone()
    for _ in range(3):
        mixer(x)
        assert torch.equal(mixer.projection, drawn)
    mixer(x)  # the fourth call, after redraw_interval calls on the first draw
    assert not torch.equal(mixer.projection, drawn) and mixer.projection.shape == drawn.shape
    redrawn = mixer.projection.clone()
    mixer.eval()
    state = mixer.allocate_state(2, 5, x.device, x.dtype)
    for t in range(5):
        mixer(x)
        mixer.step(x[:, t], state, t)
    assert torch.equal(mixer.projection, redrawn)
    never = _mixer("performer", redraw_interval=None).train()
    first = never.projection.clone()
    for _ in range(5):
        never(x)
    assert torch.equal(never.projection, first)


@pytest.mark.parametrize("name", list(MIXERS))
def test_a_state_declares_the_dimension_its_length_sizes_exactly_when_it_grows(name):
    model = tiny_model([name] * 2)
    state = model.start(padded_batch([3, 2], seed=0), max_steps=5).mixer_states[0]
    assert (type(state).steps_dim is None) == MIXERS[name].constant_state
    if type(state).steps_dim is not None:
        assert all(tensor.shape[type(state).steps_dim] == 5 for tensor in state.tensors())


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_a_mixer_leaves_dropout_on_its_output_to_the_decoder_layer(name):
    # The layer drops every mixer's branch once; a mixer that also dropped its own output would zero
    # about 90% of it here (and train its ablation arm with twice the others' dropout).
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=32, decoder_layers=1, dropout=0.9)
    mixer = MIXERS[name](config, config.options_for(name))
    x = torch.randn(4, 9, 16)
    zeros_in_training = (mixer.train()(x) == 0).float().mean()
    zeros_in_eval = (mixer.eval()(x) == 0).float().mean()
    assert zeros_in_training <= zeros_in_eval + 0.05, f"{name} drops {zeros_in_training:.0%} of its output"
