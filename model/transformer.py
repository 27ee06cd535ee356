"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) for translation.

Batch first; dims are B (batch), S (source), T (target), D (d_model), H (heads), V (vocabulary).
Masks follow nn.Transformer: src_pad_mask (B, S) and tgt_pad_mask (B, T) are bool, True = padding;
the causal mask is (T, T) bool, True = blocked. Layers reuse torch's module names, so the state
dict of `Transformer.encoder` / `.decoder` loads as it is into `nn.TransformerEncoder` /
`nn.TransformerDecoder` (batch_first=True; norm=None for Post-LN, norm=LayerNorm for Pre-LN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from data.ranges import ranged
from model.attention import (
    CrossAttention,
    KVCache,
    LayerStepCache,
    MultiheadAttention,
    SelfAttention,
    StepCache,
    keep_bias,
    keep_mask,
    rows_to_move,
)
from model.dropout import Dropout
from model.loss import IGNORE_INDEX, projected_label_smoothed_cross_entropy
from model.packed import linear_activation

TIE_EMBEDDINGS = ("none", "decoder", "all")
# The feed-forward's nonlinearity: the paper's ReLU, or what a pretrained model was trained with
# (OPUS-MT's Marian models use swish, x * sigmoid(x), which torch calls SiLU).
ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


@dataclass
class ModelConfig:
    """The network's settings (`model` in a config file). Each number declares its range
    (`ranged`: `data.ranges`), which the config's loader checks (`cli/config.py`), as it
    checks every section's."""

    d_model: int = ranged(512, "(0, inf)")
    n_heads: int = ranged(8, "(0, inf)")
    d_ff: int = ranged(2048, "(0, inf)")
    n_encoder_layers: int = ranged(6, "(0, inf)")
    n_decoder_layers: int = ranged(6, "(0, inf)")
    # Residual, embeddings (paper's P_drop).
    dropout: float = ranged(0.1, "[0, 1)")
    # On attention probabilities (torch applies `dropout` there too).
    attention_dropout: float = ranged(0.1, "[0, 1)")
    # After the FFN activation (as torch).
    activation_dropout: float = ranged(0.1, "[0, 1)")
    norm_first: bool = False  # Pre-LN option; Post-LN default
    tie_embeddings: Literal["none", "decoder", "all"] = "all"  # decoder: tgt embedding = generator
    # The width of a head; 0: d_model / n_heads (a pruned model keeps its heads' width).
    d_head: int = ranged(0, "[0, inf)")
    max_positions: int = ranged(1024, "(0, inf)")
    # The switches a pretrained model may need (`tf import`); each default is the paper's model.
    activation: Literal["relu", "swish", "gelu"] = "relu"  # the FFN's (section 3.3: ReLU)
    output_bias: bool = False  # a bias on the logits (Marian's, mBART's `final_logits_bias`)
    # The token fed first: Marian's is pad; M2M100's, NLLB's and mBART-50's is EOS.
    decoder_start: Literal["bos", "pad", "eos"] = "bos"
    # Every LayerNorm's epsilon.
    norm_eps: float = ranged(1e-5, "(0, inf)")
    # Positions. Sinusoids: "interleaved" sin, cos, sin, cos ... (the paper's PE(pos, 2i) and
    # PE(pos, 2i+1)); "halves": all sines, then all cosines (Marian). The same frequencies: only
    # the order of the model dimension differs. "fairseq": halves at fairseq's frequencies,
    # 10000^(-i / (D/2 - 1)) computed in float32 as fairseq computes them, and a pad token gets
    # no position (M2M100's and NLLB's `M2M100SinusoidalPositionalEmbedding`). "learned": a
    # trained table per stack (mBART's `MBartLearnedPositionalEmbedding`).
    positions: Literal["interleaved", "halves", "fairseq", "learned"] = "interleaved"
    # The table row of the first position: fairseq numbers positions from padding_idx + 1, 2 in
    # M2M100, NLLB and mBART (where it moves the sinusoids' angles, and leaves a learned
    # table's first 2 rows unused).
    position_offset: int = ranged(0, "[0, inf)")
    scale_embedding: bool = True  # token embeddings x sqrt(D) (section 3.4), or x 1
    layernorm_embedding: bool = False  # a LayerNorm after embeddings + positions (mBART's)
    # LayerDrop (Fan et al., 2019): in training, each layer of a stack skipped with this
    # probability (transformers' `encoder_layerdrop` / `decoder_layerdrop`; M2M100: 0.05).
    encoder_layerdrop: float = ranged(0.0, "[0, 1)")
    decoder_layerdrop: float = ranged(0.0, "[0, 1)")


def count_parameters(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> int:
    """The number of parameters of `Transformer(config, src_vocab_size, tgt_vocab_size, pad)`."""
    D, F = config.d_model, config.d_ff
    inner = config.n_heads * (config.d_head or D // config.n_heads)  # D unless pruned
    attention = 4 * D * inner + 3 * inner + D  # W_q, W_k, W_v, W_o and their biases
    feed_forward = 2 * D * F + F + D
    layer_norm = 2 * D
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm
    final_norms = 2 * layer_norm if config.norm_first else 0
    rows = config.max_positions + config.position_offset
    positions = 2 * rows * D if config.positions == "learned" else 0  # one table per stack
    embedding_norms = 2 * layer_norm if config.layernorm_embedding else 0
    embeddings = {
        "none": (src_vocab_size + 2 * tgt_vocab_size) * D,  # source, target, generator
        "decoder": (src_vocab_size + tgt_vocab_size) * D,
        "all": tgt_vocab_size * D,
    }[config.tie_embeddings]
    output_bias = tgt_vocab_size if config.output_bias else 0
    return (
        config.n_encoder_layers * encoder_layer
        + config.n_decoder_layers * decoder_layer
        + final_norms
        + positions
        + embedding_norms
        + embeddings
        + output_bias
    )


def sinusoidal_positions(
    n_positions: int,
    d_model: int,
    layout: Literal["interleaved", "halves", "fairseq"] = "interleaved",
) -> Tensor:
    """Paper section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(same).

    `layout` "halves" puts the same values in Marian's order: the D/2 sines, then the cosines.
    "fairseq" is `fairseq_sinusoids`.

    Shape: -> (n_positions, D), float32.
    """
    if layout == "fairseq":
        return fairseq_sinusoids(n_positions, d_model)
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    angles = position * inv_freq  # (P, D/2)
    if layout == "halves":
        return torch.cat([angles.sin(), angles.cos()], dim=-1).float()  # (P, D): sin.. | cos..
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (P, D/2, 2)
    return pe.reshape(n_positions, d_model).float()  # (P, D): sin, cos, sin, cos, ...


def fairseq_sinusoids(n_positions: int, d_model: int) -> Tensor:
    """fairseq's (tensor2tensor's) sinusoids, which M2M100 and NLLB were trained with: the
    sines, then the cosines, of pos * 10000^(-i / (D/2 - 1)), i < D/2 (the paper divides by
    D/2), computed in float32 as `SinusoidalPositionalEmbedding.get_embedding` computes them,
    so that the table is theirs bit for bit.

    Shape: -> (n_positions, D), float32.
    """
    half = d_model // 2
    step = math.log(10000) / (half - 1)
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float32) * -step)  # (D/2,)
    angles = torch.arange(n_positions, dtype=torch.float32)[:, None] * inv_freq  # (P, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (P, D): sin.. | cos..


def dropped(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """dropout(x), without calling the module where it does nothing (evaluation, or p = 0):
    a decoding step made 16 such calls, a tenth of its time at one row where the arithmetic
    is nil (16-wide layers: 0.68 -> 0.61 ms, 2 cores)."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True = blocked: position i may not attend to j > i."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)


class Embedding(nn.Module):
    """Token embedding x sqrt(D) (section 3.4) + positions (3.5), then dropout (5.4).

    The switches of `ModelConfig` a pretrained model may need: the scale (`scale_embedding`),
    the positions (`positions`, from row `position_offset` of the table), a LayerNorm before
    the dropout (mBART's `layernorm_embedding`).

    Args:
        config: the model's settings.
        vocab_size, pad_id: the vocabulary and its padding id.
        token: a token embedding to share (`tie_embeddings: all`), or None for a new one. Only
            the token embedding is shared between the stacks: the positions and the norm are
            each stack's own, as in mBART.
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, pad_id: int, token: nn.Embedding | None = None
    ):
        super().__init__()
        D = config.d_model
        self.token = nn.Embedding(vocab_size, D, padding_idx=pad_id) if token is None else token
        self.scale = math.sqrt(D) if config.scale_embedding else 1.0
        self.max_positions = config.max_positions
        self.offset = config.position_offset
        rows = config.max_positions + config.position_offset
        if config.positions == "learned":  # (P + offset, D), in checkpoints
            self.positions = nn.Parameter(torch.empty(rows, D))
        else:  # (P + offset, D), computed: not in checkpoints
            pe = sinusoidal_positions(rows, D, config.positions)
            self.register_buffer("positions", pe, persistent=False)
        # fairseq numbers the positions of real tokens only: a pad token's is a zero row.
        self.pad_has_no_position = config.positions == "fairseq"
        self.norm = nn.LayerNorm(D, eps=config.norm_eps) if config.layernorm_embedding else None
        self.dropout = Dropout(config.dropout)

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        """Embed ids (B, T) at positions start .. start + T - 1 -> (B, T, D)."""
        end = start + ids.size(1)
        if end > self.max_positions:
            raise ValueError(f"position {end - 1} is beyond max_positions {self.max_positions}")
        pe = self.positions[start + self.offset : end + self.offset]  # (T, D)
        if self.pad_has_no_position:
            pe = pe * (ids != self.token.padding_idx).unsqueeze(-1)  # (B, T, D)
        x = self.token(ids) * self.scale + pe
        if self.norm is not None:
            x = self.norm(x)
        return dropped(self.dropout, x)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward sub-layers (section 3.1), torch's names and numbers.

    Post-LN (the paper): x = norm(x + dropout(sublayer(x))).
    Pre-LN: x = x + dropout(sublayer(norm(x))), and the stack ends in one more norm.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        D = config.d_model
        self.self_attn = SelfAttention(D, config.n_heads, config.attention_dropout, config.d_head)
        self.linear1 = nn.Linear(D, config.d_ff)
        self.activation = ACTIVATIONS[config.activation]
        self.dropout = Dropout(config.activation_dropout)  # after the activation
        self.linear2 = nn.Linear(config.d_ff, D)
        self.norm_first = config.norm_first
        self.norm1 = nn.LayerNorm(D, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(D, eps=config.norm_eps)
        self.dropout1 = Dropout(config.dropout)
        self.dropout2 = Dropout(config.dropout)

    def forward(self, x: Tensor, src_keep: Tensor | None) -> Tensor:
        """x (B, S, D), src_keep (B, 1, 1, S) from `keep_mask` (True = real) -> (B, S, D)."""
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_keep)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_keep))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, src_keep: Tensor | None) -> Tensor:
        return dropped(self.dropout1, self.self_attn(x, keep=src_keep))

    def _ff_block(self, x: Tensor) -> Tensor:
        """Section 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2 (max(0, .): `model.activation`)."""
        hidden = linear_activation(self.linear1, self.activation, x)  # (..., d_ff)
        return dropped(self.dropout2, self.linear2(dropped(self.dropout, hidden)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention and feed-forward sub-layers (section 3.1)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        D = config.d_model
        self.self_attn = SelfAttention(D, config.n_heads, config.attention_dropout, config.d_head)
        self.multihead_attn = CrossAttention(
            D, config.n_heads, config.attention_dropout, config.d_head
        )
        self.linear1 = nn.Linear(D, config.d_ff)
        self.activation = ACTIVATIONS[config.activation]
        self.dropout = Dropout(config.activation_dropout)  # after the activation
        self.linear2 = nn.Linear(config.d_ff, D)
        self.norm_first = config.norm_first
        self.norm1 = nn.LayerNorm(D, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(D, eps=config.norm_eps)
        self.norm3 = nn.LayerNorm(D, eps=config.norm_eps)
        self.dropout1 = Dropout(config.dropout)
        self.dropout2 = Dropout(config.dropout)
        self.dropout3 = Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        memory_kv: KVCache,
        src_keep: Tensor | None,
        causal: bool = False,
        cache: StepCache | None = None,
        attention: list[Tensor] | None = None,
    ) -> Tensor:
        """One decoder layer over a whole target sequence, or over one new position with a cache.

        Args:
            x: (B, T, D) target states; T = 1 when decoding step by step.
            memory_kv: keys and values of the encoder output for `multihead_attn`, (B, H, S, D/H).
            src_keep: (B, 1, 1, S) from `keep_mask` of the source padding (True = real).
            causal: position i attends to target positions up to i; False when stepping (the
                cache holds only the past).
            cache: self-attention keys and values of earlier positions; x's are appended.
            attention: if a list, the cross-attention probabilities (B, H, T, S) are appended
                to it (computed explicitly; for inspection in eval mode).

        Returns:
            (B, T, D)
        """
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), causal, cache)
            x = x + self._mha_block(self.norm2(x), memory_kv, src_keep, attention)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, causal, cache))
            x = self.norm2(x + self._mha_block(x, memory_kv, src_keep, attention))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, causal: bool, cache: LayerStepCache | None) -> Tensor:
        return dropped(self.dropout1, self.self_attn(x, is_causal=causal, cache=cache))

    def _mha_block(
        self,
        x: Tensor,
        memory_kv: KVCache,
        src_keep: Tensor | None,
        attention: list[Tensor] | None = None,
    ) -> Tensor:
        if attention is None:
            return dropped(self.dropout2, self.multihead_attn(x, memory_kv, src_keep))
        out, probabilities = self.multihead_attn.forward_with_probabilities(x, memory_kv, src_keep)
        attention.append(probabilities)
        return dropped(self.dropout2, out)

    def _ff_block(self, x: Tensor) -> Tensor:
        """Section 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2 (max(0, .): `model.activation`)."""
        hidden = linear_activation(self.linear1, self.activation, x)  # (..., d_ff)
        return dropped(self.dropout3, self.linear2(dropped(self.dropout, hidden)))


def _final_norm(config: ModelConfig) -> nn.LayerNorm | None:
    # A Post-LN stack already ends in a norm; Pre-LN needs one more (as torch's `norm=`).
    return nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.norm_first else None


@torch.compiler.disable  # compiled, the draw would come from inductor's generator instead
def layer_dropped(p: float) -> bool:
    """LayerDrop (Fan et al., 2019): whether a training forward skips the next layer, drawn as
    transformers draws it (`torch.rand([]) < p`, one draw per layer, none at p = 0) from the
    CPU generator, whose state every checkpoint keeps (an exact resume draws the same), and
    eagerly under `torch.compile` too (`train.compile`: the same draws)."""
    return p > 0 and float(torch.rand(())) < p


def skipped(x: Tensor, layer: nn.Module, *args) -> Tensor:
    """What a layer LayerDrop skips gives: its input x. Under DistributedDataParallel, whose
    reducer waits for a gradient of every parameter (a skipped layer would give none and stop
    the step), the layer still runs and its output is discarded by `torch.where`, which passes
    it a zero gradient (and no NaN of it reaches x, as a multiplication by 0 would)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return x
    return torch.where(torch.ones((), dtype=torch.bool, device=x.device), x, layer(x, *args))


class Encoder(nn.Module):
    """The stack of encoder layers, named as nn.TransformerEncoder (`layers`, `norm`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.norm = _final_norm(config)
        self.layerdrop = config.encoder_layerdrop

    def forward(self, x: Tensor, src_pad_mask: Tensor | None) -> Tensor:
        """x (B, S, D), src_pad_mask (B, S) True = padding -> (B, S, D)."""
        src_keep = keep_mask(src_pad_mask)  # (B, 1, 1, S): once for all layers
        for layer in self.layers:
            if self.training and layer_dropped(self.layerdrop):
                x = skipped(x, layer, src_keep)
            else:
                x = layer(x, src_keep)
        return x if self.norm is None else self.norm(x)


class Decoder(nn.Module):
    """The stack of decoder layers, named as nn.TransformerDecoder (`layers`, `norm`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = _final_norm(config)
        self.layerdrop = config.decoder_layerdrop

    def project_memory(self, memory: Tensor) -> list[KVCache]:
        """Every layer's cross-attention keys and values of memory (B, S, D): (B, H, S, D/H)."""
        return [layer.multihead_attn.project_memory(memory) for layer in self.layers]

    def forward(
        self,
        x: Tensor,
        memory_kv: list[KVCache],
        src_keep: Tensor | None,
        causal: bool = False,
        cache: StepCache | None = None,
    ) -> Tensor:
        """Embedded targets x (B, T, D) -> (B, T, D); arguments as `DecoderLayer.forward`,
        `cache` every layer's. LayerDrop skips layers of a training forward (never a step
        with a cache, each layer of which must see every position)."""
        drops = self.training and cache is None
        for i, (layer, kv) in enumerate(zip(self.layers, memory_kv, strict=True)):
            if drops and layer_dropped(self.layerdrop):
                x = skipped(x, layer, kv, src_keep, causal)
            else:
                x = layer(x, kv, src_keep, causal, None if cache is None else cache.layer(i))
        return x if self.norm is None else self.norm(x)

    def cross_attention(
        self, x: Tensor, memory_kv: list[KVCache], src_keep: Tensor | None
    ) -> Tensor:
        """Each layer's cross-attention probabilities, x (B, T, D) -> (L, B, H, T, S): one
        teacher-forced pass, each layer run once."""
        probabilities: list[Tensor] = []
        for layer, kv in zip(self.layers, memory_kv, strict=True):
            x = layer(x, kv, src_keep, causal=True, attention=probabilities)
        return torch.stack(probabilities)


@dataclass
class DecoderCache:
    """What `Transformer.decode_step` keeps between steps, for N rows (sentences x beams)."""

    self_attn: StepCache  # every layer's keys/values of the fed tokens
    # Per layer, the source's keys/values, (B, H, S, D/H) each, once per sentence: its N / B
    # rows (beams) share them (see CrossAttention.forward), so a beam reorder copies nothing.
    cross_attn: list[KVCache]
    src_keep: Tensor | None  # (B, 1, 1, S) additive (`keep_bias`), built once per cache
    step: int = 0  # tokens fed so far = position of the next one
    group: int = 1  # rows per sentence: N = group * B

    def reorder(
        self, index: Tensor, group: int = 1, same_sentences: bool | None = None
    ) -> DecoderCache:
        """Row i of the result is row index[i] of this cache; index (N',) long. The new rows
        come in `group`s of consecutive rows of one sentence, each in its old place while no
        sentence leaves (as both searches keep them): a sentence's keys and values move only
        when sentences leave, and then only those that fill the places of the others (in
        place, `rows_to_move`), as do the rows of self-attention's cache. `same_sentences`
        says whether the groups hold the same sentences as before; None judges by their
        number, which that order allows (a caller whose groups repeat a sentence, as
        `cli.inference.shapes` pads them, must say)."""
        cross, keep = self.cross_attn, self.src_keep
        if same_sentences is None:
            same_sentences = index.numel() // group == cross[0].keys.size(0)
        if not same_sentences:  # some sentences left (or split)
            sentences = index[::group] // self.group  # the old sentence of each new group
            moved = rows_to_move(sentences, cross[0].keys.size(0))
            cross = [kv.reorder(sentences, moved) for kv in cross]
            keep = None if keep is None else keep.index_select(0, sentences)
        moved = rows_to_move(index, self.self_attn.rows)
        return DecoderCache(
            self_attn=self.self_attn.reorder(index, moved),
            cross_attn=cross,
            src_keep=keep,
            step=self.step,
            group=group,
        )


class Transformer(nn.Module):
    """Encoder-decoder Transformer with a generator (the output projection).

    Initialisation follows fairseq's `transformer`: xavier_uniform on every projection (attention,
    feed-forward) with zero biases; embeddings normal(0, D^-0.5) with the pad row zeroed, so the
    scaled embedding x sqrt(D) has unit variance; an untied generator also normal(0, D^-0.5),
    its bias (`output_bias`) zero. LayerNorms start at weight 1, bias 0.

    Args:
        config: the architecture.
        src_vocab_size, tgt_vocab_size: vocabulary sizes (equal when tie_embeddings is "all").
        pad_id: the padding id of the target vocabulary, and of the source's unless
            `src_pad_id` gives it (a Marian model's two vocabularies may differ).
    """

    def __init__(
        self,
        config: ModelConfig,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        src_pad_id: int | None = None,
    ):
        super().__init__()
        tie = config.tie_embeddings
        if tie not in TIE_EMBEDDINGS:
            raise ValueError(f"tie_embeddings must be one of {TIE_EMBEDDINGS}, not {tie!r}")
        if tie == "all" and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f'tie_embeddings "all" needs one joint vocabulary, got source {src_vocab_size} '
                f"and target {tgt_vocab_size}"
            )
        self.config = config
        self.pad_id = pad_id
        self.src_pad_id = pad_id if src_pad_id is None else src_pad_id
        D = config.d_model
        self.src_embed = Embedding(config, src_vocab_size, self.src_pad_id)
        # Tied, the stacks share the token embedding (under both names, `src_embed.token` and
        # `tgt_embed.token`, in a state dict), each keeping its positions and norm.
        shared = self.src_embed.token if tie == "all" else None
        self.tgt_embed = Embedding(config, tgt_vocab_size, pad_id, shared)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = nn.Linear(D, tgt_vocab_size, bias=config.output_bias)
        self._init_weights()
        if tie != "none":  # section 3.4: the embeddings share the pre-softmax projection's matrix
            self.generator.weight = self.tgt_embed.token.weight

    def _init_weights(self) -> None:
        std = self.config.d_model**-0.5
        for module in self.modules():
            if isinstance(module, MultiheadAttention):
                module.reset_parameters()
            elif isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
            elif isinstance(module, Embedding) and isinstance(module.positions, nn.Parameter):
                nn.init.normal_(module.positions, mean=0.0, std=std)  # as fairseq's learned
        nn.init.normal_(self.generator.weight, mean=0.0, std=std)

    def num_parameters(self) -> int:
        """The number of distinct parameters (tied matrices count once)."""
        return sum(p.numel() for p in self.parameters())

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Tensor:
        """Source ids src (B, S), src_pad_mask (B, S) True = padding -> memory (B, S, D)."""
        return self.encoder(self.src_embed(src), src_pad_mask)

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor, tgt_pad_mask: Tensor | None
    ) -> Tensor:
        """Teacher-forced decoding of a whole target sequence under the causal mask.

        Targets are right-padded (as `data.batching.collate` pads them), so the causal mask
        alone already hides every padding position from every real one: self-attention takes
        SDPA's `is_causal` flag, which admits its fastest kernels, and no (B, 1, T, T) mask is
        built. Outputs at padding positions are not those of torch (which masks them too) and
        are never used.

        Args:
            tgt_in: (B, T) target ids, the start token first (`decoder_start`), right-padded.
            memory: (B, S, D) from `encode`.
            src_pad_mask: (B, S) True = padding.
            tgt_pad_mask: (B, T) True = padding, or None; hidden by the causal mask already
                (see above), it is accepted as torch's `tgt_key_padding_mask` is.

        Returns:
            hidden states (B, T, D); `project` turns them into logits.
        """
        memory_kv = self.decoder.project_memory(memory)
        src_keep = keep_mask(src_pad_mask)  # (B, 1, 1, S): once for all layers
        return self.decoder(self.tgt_embed(tgt_in), memory_kv, src_keep, causal=True)

    def project(self, hidden: Tensor) -> Tensor:
        """The generator: hidden (..., D) -> logits (..., V)."""
        return self.generator(hidden)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_pad_mask: Tensor,
        tgt_pad_mask: Tensor | None,
        positions: Tensor | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits of the next target token, or with `targets` the training loss; arguments as
        `decode`.

        Args:
            positions: (N,) long indices into the flattened (B*T) target positions, or None.
                Training passes the real (non-pad) ones, so that the generator, the largest
                matmul of the model, is never run on padding.
            targets: (N,) the reference ids at `positions` (`model.loss.IGNORE_INDEX`: a row
                that counts for nothing): the generator and the label-smoothed loss then run as
                one step (`model.loss`), and no logits are returned. Inside `forward`, so
                that DistributedDataParallel sees every parameter used there.
            label_smoothing: the loss's epsilon.

        Returns:
            (B, T, V) logits at every position, or (N, V) at `positions`, in their order; with
            `targets`, (loss_sum, nll_sum) as `label_smoothed_cross_entropy` returns them.
        """
        memory = self.encode(src, src_pad_mask)
        hidden = self.decode(tgt_in, memory, src_pad_mask, tgt_pad_mask)  # (B, T, D)
        if positions is not None:
            hidden = hidden.flatten(0, 1).index_select(0, positions)  # (N, D)
        if targets is not None:
            generator = self.generator
            return projected_label_smoothed_cross_entropy(
                hidden, generator.weight, generator.bias, targets, label_smoothing, IGNORE_INDEX
            )
        return self.project(hidden)

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, src_pad_mask: Tensor, tgt_pad_mask: Tensor | None
    ) -> Tensor:
        """Teacher-forced cross-attention probabilities of every decoder layer, for inspection.

        Shape: src (B, S), tgt_in (B, T), masks (B, S), (B, T) -> (L, B, H, T, S), rows sum to 1,
        zero on source padding.
        """
        memory = self.encode(src, src_pad_mask)
        memory_kv = self.decoder.project_memory(memory)
        x = self.tgt_embed(tgt_in)
        return self.decoder.cross_attention(x, memory_kv, keep_mask(src_pad_mask))

    def init_cache(self, memory: Tensor, src_pad_mask: Tensor, steps: int = 0) -> DecoderCache:
        """The cache for `decode_step`: the cross-attention keys and values are computed here,
        once; self-attention's are written in place (`StepCache`) into room for `steps` tokens
        (0: the first step's), doubled when a row runs past it.

        Shape: memory (N, S, D), src_pad_mask (N, S).
        """
        cross_attn = self.decoder.project_memory(memory)
        return DecoderCache(
            self_attn=StepCache(len(self.decoder.layers), steps),
            cross_attn=cross_attn,
            src_keep=keep_bias(keep_mask(src_pad_mask), cross_attn[0].keys.dtype),
        )

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Feed one token per row, the logits of the next; O(t) work at step t.

        Only the new token goes through the layers: it attends to the cached keys and values of
        the earlier ones, and its own are appended to `cache`, whose step count gives its position.

        Shape: tokens (N,) long -> logits (N, V).
        """
        x = self.tgt_embed(tokens[:, None], start=cache.step)  # (N, 1, D)
        x = self.decoder(x, cache.cross_attn, cache.src_keep, cache=cache.self_attn)
        cache.step += 1
        return self.project(x[:, 0])  # (N, V)
