"""Seq2Seq: a transformer encoder and a decoder whose token mixer is swappable per layer.

Read top to bottom: the encoder layer, the decoder layer, then the model with its three
ways to run: ``forward`` (teacher forcing, the whole target at once), ``start``/``step``
(one token at a time over a preallocated :class:`DecodeState`, through the model's
accelerator), and ``generate``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from hybrid.accel import Accelerator, Eager
from hybrid.accel.cuda_graph import CUDAGraphAccelerator
from hybrid.accel.onnx import OnnxAccelerator, cache_dir_for
from hybrid.config import ModelConfig
from hybrid.files import write_atomically
from hybrid.generation import generate
from hybrid.inputs import check_length, check_token_ids, source_mask
from hybrid.layers import CrossAttention, EncoderSelfAttention, FeedForward, position_table, residual
from hybrid.mixers import MIXERS
from hybrid.state import FIRST_CAPACITY, DecodeState

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
GENERATION_CONFIG_FILE = "generation_config.json"  # the model's own generation defaults, when it has any


class EncoderLayer(nn.Module):
    """Transformer encoder layer: self-attention, then FFN, each a residual block, pre-norm
    (x + f(LN(x))) by default or post-norm (LN(x + f(x))), as ``config.pre_norm`` says."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.residual = residual(config)
        self.attn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = EncoderSelfAttention(config)
        self.ffn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout, config.activation)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        x = self.residual(x, self.attn_norm, lambda h: self.dropout(self.attn(h, key_mask)))
        return self.residual(x, self.ffn_norm, self.ffn)


class DecoderLayer(nn.Module):
    """Decoder layer: token mixer -> cross-attention -> FFN, each a residual block (pre- or post-norm).

    Only the mixer differs between an LSTM and a transformer decoder layer; the
    cross-attention to the encoder is always kept.
    """

    def __init__(self, config: ModelConfig, mixer: str) -> None:
        super().__init__()
        self.residual = residual(config)
        self.mixer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mixer = MIXERS[mixer](config, config.options_for(mixer))
        self.cross_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.cross = CrossAttention(config.d_model, config.n_heads, config.dropout)
        self.ffn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout, config.activation)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, key_mask: Tensor) -> Tensor:
        """Parallel form. x: (B, T, D) -> (B, T, D)."""
        x = self.residual(x, self.mixer_norm, lambda h: self.dropout(self.mixer(h)))
        x = self.residual(x, self.cross_norm, lambda h: self.dropout(self.cross(h, keys, values, key_mask)))
        return self.residual(x, self.ffn_norm, self.ffn)

    def step(self, x: Tensor, layer: int, state: DecodeState, position: int | Tensor) -> Tensor:
        """Step form. x: (B, D) -> (B, D), updating this layer's mixer state in place. Decoding runs in
        eval mode, where dropout is off."""
        x = self.residual(x, self.mixer_norm, lambda h: self.mixer.step(h, state.mixer_states[layer], position))
        x = self.residual(x, self.cross_norm, lambda h: self._attend(h, layer, state))
        return self.residual(x, self.ffn_norm, self.ffn)

    def _attend(self, x: Tensor, layer: int, state: DecodeState) -> Tensor:
        # The rows of one source (beams, samples) query its memory together: (sources, group, D).
        queries = x.view(-1, state.group_size, x.shape[-1])
        attended = self.cross(queries, state.cross_keys[layer], state.cross_values[layer], state.memory_mask)
        return attended.view_as(x)


class Seq2Seq(nn.Module):
    """Encoder-decoder whose decoder layers mix tokens with the mixers named in ``config.decoder_mixers``.

    A plain ``nn.Module``: training wrappers (Lightning) and configuration (Hydra) stay
    outside, so an exported model needs neither.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)  # shared by encoder and decoder
        # Each side's own position table and embedding norm (modules without weights where the config has none).
        self.encoder_positions, self.decoder_positions = position_table(config), position_table(config)
        self.encoder_embedding_norm, self.decoder_embedding_norm = self._optional_norm(config.embedding_norm), \
            self._optional_norm(config.embedding_norm)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.encoder_norm = self._optional_norm(config.final_norm)
        self.decoder_layers = nn.ModuleList(DecoderLayer(config, mixer) for mixer in config.decoder_mixers)
        self.decoder_norm = self._optional_norm(config.final_norm)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.final_logits_bias)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # The model's own defaults for generate() (an imported model's generation config; none for hybrid's
        # own), which its keyword arguments override; saved as generation_config.json.
        self.generation_config: dict = {}
        # What steps the decoder (hybrid.accel): the eager step, until optimize_for_inference installs a
        # faster one (ONNX Runtime on a CPU, CUDA graphs on a GPU).
        self.accelerator: Accelerator = Eager(self)
        # Set by from_pretrained: the folder the weights came from, where the fast path caches its graphs.
        self.pretrained_folder: Path | None = None

    def _optional_norm(self, present: bool) -> nn.Module:
        return nn.LayerNorm(self.config.d_model, eps=self.config.layer_norm_eps) if present else nn.Identity()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation; nn.LSTM keeps PyTorch's own uniform(-1/sqrt(H), 1/sqrt(H)).
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    # ----- encoder -------------------------------------------------------------------

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Encode a padded source batch.

        Returns the encoder output (B, S, D) and the attention key mask (B, 1, 1, S)
        that every attention over the source uses (True on real tokens).
        """
        src_ids, key_mask = self._source(src_ids, src_mask)
        return self._encode_masked(src_ids, key_mask), key_mask

    def _source(self, src_ids: Tensor, src_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The source ids, checked, and their key mask (B, 1, 1, S), True on real tokens."""
        src_ids = check_token_ids("src_ids", src_ids, self.config.vocab_size, ndim=2)
        check_length("source length", src_ids.shape[1], self.config.max_positions, "max_positions")
        return src_ids, source_mask(src_ids, src_mask, self.config.pad_id)[:, None, None, :]

    def _encode_masked(self, src_ids: Tensor, key_mask: Tensor) -> Tensor:
        x = self.embed_dropout(self._embed(src_ids, self.encoder_positions, self.encoder_embedding_norm))  # (B, S, D)
        for layer in self.encoder_layers:
            x = layer(x, key_mask)
        return self.encoder_norm(x)

    def eager_memory(self, src_ids: Tensor, key_mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The encoder and every decoder layer's cross-attention keys and values (each (B, nh, S, hd),
        contiguous), in PyTorch, unchecked: what an accelerator (:mod:`hybrid.accel`) runs or exports."""
        memory = self._encode_masked(src_ids, key_mask)
        projected = [layer.cross.project_memory(memory) for layer in self.decoder_layers]
        # Contiguous, so that every step reads them in order (and the fast step can bind them by address).
        return [k.contiguous() for k, _ in projected], [v.contiguous() for _, v in projected]

    # ----- teacher forcing -----------------------------------------------------------

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, vocab) for decoder inputs ``tgt_ids`` (starting with ``bos_id``).

        ``src_mask`` is True (or 1) on real tokens, like Hugging Face's ``attention_mask``;
        when omitted it is ``src_ids != pad_id``. Target padding needs no mask: it comes
        after the real tokens, and every mixer is causal.
        """
        tgt_ids = check_token_ids("tgt_ids", tgt_ids, self.config.vocab_size, ndim=2)
        check_length("target length", tgt_ids.shape[1], self.config.max_positions, "max_positions")
        if isinstance(src_ids, Tensor) and src_ids.dim() == 2 and src_ids.shape[0] != tgt_ids.shape[0]:
            # One target row would otherwise broadcast silently against every source.
            raise ValueError(f"tgt_ids has {tgt_ids.shape[0]} rows but src_ids has {src_ids.shape[0]}: "
                             "give one target row per source")
        memory, key_mask = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, key_mask)

    def decode(self, tgt_ids: Tensor, memory: Tensor, key_mask: Tensor) -> Tensor:
        """Parallel decoder pass over a whole (prefix of a) target: (B, T) -> (B, T, vocab)."""
        x = self.embed_dropout(self._embed(tgt_ids, self.decoder_positions, self.decoder_embedding_norm))  # (B, T, D)
        for layer in self.decoder_layers:
            x = layer(x, *layer.cross.project_memory(memory), key_mask)
        return self.lm_head(self.decoder_norm(x))

    def _embed(self, ids: Tensor, positions: nn.Module, norm: nn.Module, start: int | Tensor = 0) -> Tensor:
        """Token embeddings (scaled), plus positions from ``start`` when the model adds a table of them, normed
        when it has an embedding norm: (B, T) -> (B, T, D), or one step (B,) -> (B, D)."""
        x = self.embed(ids)
        if self.config.embedding_scale != 1.0:
            x = x * self.config.embedding_scale
        return norm(positions(x, start))

    # ----- step-wise decoding --------------------------------------------------------

    @torch.inference_mode()
    def start(self, src_ids: Tensor, src_mask: Tensor | None = None, max_steps: int = 256) -> DecodeState:
        """Encode the source and preallocate the decoding state for ``max_steps`` steps.

        ``max_steps`` is the most tokens the state will be fed: the new tokens to generate plus
        any forced prefix. The cross-attention keys/values are projected here, once per source.
        A state whose size grows with the length (a KV cache) starts smaller and grows in doubling
        buckets as it is fed (:meth:`hybrid.state.DecodeState.reserve`). Feed the BOS token to the
        first :meth:`step`.
        """
        check_length("max_steps", max_steps, self.config.max_positions, "max_positions")
        self.accelerator.check_weights()
        src_ids, key_mask = self._source(src_ids, src_mask)
        keys, values = self.accelerator.memory(src_ids, key_mask)
        batch, dtype, device = src_ids.shape[0], keys[0].dtype, keys[0].device
        # A fixed-size state is allocated whole: growing it would change nothing but its shape key.
        grows = any(not layer.mixer.constant_state for layer in self.decoder_layers)
        capacity = min(max_steps, FIRST_CAPACITY) if grows else max_steps
        mixer_states = [layer.mixer.allocate_state(batch, capacity, device, dtype)
                        for layer in self.decoder_layers]
        return DecodeState(mixer_states, keys, values, key_mask, max_steps, capacity)

    @torch.inference_mode()
    def step(self, token_ids: Tensor, state: DecodeState) -> Tensor:
        """Feed one token per sequence (B,) and return the next-token logits (B, vocab).

        Updates ``state`` in place. The ids are checked here (which reads them on the
        host); the generation engine calls :meth:`step_unchecked` to avoid that sync.
        """
        token_ids = check_token_ids("token_ids", token_ids, self.config.vocab_size, ndim=1)
        if token_ids.shape[0] != state.batch_size:
            raise ValueError(f"token_ids has {token_ids.shape[0]} rows but the state holds "
                             f"{state.batch_size} sequences; reorder the state first")
        return self.step_unchecked(token_ids, state)

    @torch.inference_mode()
    def step_unchecked(self, token_ids: Tensor, state: DecodeState, position: Tensor | None = None) -> Tensor:
        """:meth:`step` without reading ``token_ids`` on the host (the hot path), run by the model's
        :attr:`accelerator`.

        ``position``, a device tensor, replaces the state's host-side counter: 0-d for every row
        (a batch that keeps every row, which CUDA graphs replay, passes one so that replays
        advance) or (B,) for one position per row (continuous refill); see
        :data:`hybrid.mixers.base.Position`.
        """
        if position is None:
            if state.position >= state.max_steps:
                raise ValueError(f"the decoding state is full: it was started with max_steps="
                                 f"{state.max_steps}; start a new one with a larger max_steps")
            position = state.position
            state.position += 1
            state.reserve(state.position)
        elif position.dim() > 1 or (position.dim() == 1 and position.shape[0] != token_ids.shape[0]):
            raise ValueError(f"position must be a 0-d tensor or hold one position per row ({token_ids.shape[0]}), "
                             f"got shape {tuple(position.shape)}")
        return self.accelerator.step(token_ids, state, position)

    def eager_step(self, token_ids: Tensor, state: DecodeState, position: int | Tensor) -> Tensor:
        """The step itself, in PyTorch, unchecked: what an accelerator (:mod:`hybrid.accel`) runs, exports
        or captures."""
        x = self._embed(token_ids, self.decoder_positions, self.decoder_embedding_norm, position)  # (B, D)
        for index, layer in enumerate(self.decoder_layers):
            x = layer.step(x, index, state, position)
        return self.lm_head(self.decoder_norm(x))  # (B, vocab)

    # ----- generation ----------------------------------------------------------------

    def generate(self, src_ids: Tensor, src_mask: Tensor | None = None, **kwargs) -> Tensor:
        """:func:`hybrid.generation.generate` with transformers' options, laid over the model's own
        :attr:`generation_config` (greedy and ``max_new_tokens=256`` where neither says); returns
        (B, L) ids without the leading BOS, EOS included, ``pad_id`` after it.

        ``use_cache=False`` reruns the decoder over the whole prefix at every step: the
        crude loop that the cached path is checked and benchmarked against.
        """
        return generate(self, src_ids, src_mask=src_mask, **kwargs)

    def optimize_for_inference(self, quantize: str | None = None, cache_dir: str | os.PathLike | None = None,
                               threads: int | None = None) -> Seq2Seq:
        """Install the fast decoding path as this model's :attr:`accelerator` and return the model (in
        eval mode).

        On a CPU, the decoder step is exported to ONNX and run by ONNX Runtime
        (:class:`~hybrid.accel.onnx.OnnxAccelerator`); ``quantize="int8"`` gives its matrix products int8
        weights. On a GPU, the step is captured in CUDA graphs and replayed
        (:class:`~hybrid.accel.cuda_graph.CUDAGraphAccelerator`). Every path that steps the model uses it:
        ``generate`` (every strategy), continuous refill and ``hybrid generate``. What it makes is made at
        the first decode of each shape and kept for every later one. With ``cache_dir`` (by default
        ``<folder>/fast`` for a model loaded by :meth:`from_pretrained`, nothing for one built in Python),
        each exported ONNX graph is written there, keyed by a digest of the weights and of everything else
        that shapes it, and a later process with the same weights loads it instead of exporting again; a
        folder that cannot be written only costs that. The ONNX graph holds a copy of the weights: after
        changing them, call this again. ``threads`` is ONNX Runtime's intra-op thread count (CTranslate2's
        ``intra_threads``); by default torch's (``torch.get_num_threads()``). A GPU's graphs need no threads.
        """
        self.eval()
        device = next(self.parameters()).device
        if device.type == "cuda":
            if quantize is not None:
                raise ValueError("quantize is for the CPU path (ONNX Runtime); on a GPU use a bfloat16 or float16 "
                                 "model, e.g. model.to(torch.bfloat16), with CUDA graphs")
            self.accelerator = CUDAGraphAccelerator(self)
            return self
        if cache_dir is None and self.pretrained_folder is not None:
            cache_dir = cache_dir_for(self.pretrained_folder)
        self.accelerator = OnnxAccelerator(self, quantize, cache_dir, threads)
        return self

    # ----- transformers -------------------------------------------------------------

    @classmethod
    def from_transformers(cls, model_or_path, device: str | torch.device = "cpu") -> Seq2Seq:
        """A transformers encoder-decoder (BART, Marian, mBART, M2M100/NLLB; an in-memory model or a local
        ``save_pretrained`` folder) as a hybrid model with attention mixers, whose logits equal transformers'
        forward: its weights, its special ids (``bos_id`` is its decoder start) and its generation config
        (as :attr:`generation_config`). See :mod:`hybrid.hf`; ``hybrid import`` also keeps its tokenizer."""
        from hybrid.hf.importer import from_transformers

        return from_transformers(model_or_path, device)

    def to_transformers(self):
        """This model as the transformers model of its family, with the same weights and generation config;
        only a decoder of attention mixers has one (see :mod:`hybrid.hf.exporter`)."""
        from hybrid.hf.exporter import to_transformers

        return to_transformers(self)

    # ----- persistence ---------------------------------------------------------------

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` and ``model.safetensors`` to ``directory``, each file atomically, and
        ``generation_config.json`` when the model has generation defaults."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config_text = json.dumps(self.config.to_dict(), indent=2, sort_keys=True)
        write_atomically(directory / CONFIG_FILE, config_text + "\n")
        write_atomically(directory / WEIGHTS_FILE, lambda path: save_model(self, str(path)))
        if self.generation_config:
            write_atomically(directory / GENERATION_CONFIG_FILE,
                             json.dumps(self.generation_config, indent=2, sort_keys=True) + "\n")
        else:  # a folder saved over keeps no defaults the model no longer has
            (directory / GENERATION_CONFIG_FILE).unlink(missing_ok=True)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: str | torch.device = "cpu") -> Seq2Seq:
        """Rebuild a model saved by :meth:`save_pretrained`; weights load from safetensors, never pickle."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory} has no {name}; expected a save_pretrained directory")
        config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        try:
            config = ModelConfig.from_saved(json.loads(config_path.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"{config_path} is not a valid model config: {error}") from error
        model = cls(config)
        try:
            load_model(model, str(weights_path), strict=True, device=str(device))
        except Exception as error:  # safetensors raises its own error types for a truncated file
            raise ValueError(f"{weights_path} does not hold this config's weights (truncated, corrupt or "
                             f"from another model): {error}") from error
        generation_path = directory / GENERATION_CONFIG_FILE
        if generation_path.is_file():
            try:
                model.generation_config = json.loads(generation_path.read_text(encoding="utf-8"))
            except ValueError as error:
                raise ValueError(f"{generation_path} is not valid JSON: {error}") from error
            if not isinstance(model.generation_config, dict):
                raise ValueError(f"{generation_path} must hold a JSON object of generate() options, "
                                 f"got {type(model.generation_config).__name__}")
        model.pretrained_folder = directory
        return model.to(device).eval()
