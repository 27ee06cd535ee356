"""Multi-head attention (paper section 3.2.2) over torch's fused `scaled_dot_product_attention`.

The parameters carry the names of `nn.MultiheadAttention`: `in_proj_weight` (3D, D) stacks
W_q, W_k and W_v, `in_proj_bias` (3D,) their biases, `out_proj` is W_o. A state dict therefore
moves between ours and torch's unchanged. Self-attention projects Q, K and V with one matmul over
the whole (3D, D) matrix; cross-attention projects Q from the decoder and K, V together from the
encoder output (rows D: of the same matrix), once per source when decoding step by step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.dropout import dropout
from model.packed import PackedLinear


@dataclass
class KVCache:
    """Keys and values that stay put while decoding: cross-attention's, of the source."""

    keys: Tensor  # (N, H, S, D/H)
    values: Tensor  # (N, H, S, D/H)

    def reorder(self, index: Tensor, moved: Tensor | None = None) -> KVCache:
        """Row i of the result is row index[i] of this cache; index is (N',) long. With `moved`
        from `rows_to_move`, in place: only those rows are copied, and this cache is spent."""
        if moved is None or not self.keys.is_contiguous():
            return KVCache(self.keys.index_select(0, index), self.values.index_select(0, index))
        for table in (self.keys, self.values):
            move_rows_(table.view(table.size(0), -1), moved, index[moved])
        n = index.numel()
        return KVCache(self.keys[:n], self.values[:n])


def rows_to_move(index: Tensor, rows: int) -> Tensor | None:
    """The rows i with index[i] != i when reordering `rows` rows by `index` (N',) is cheaper
    in place, else None. In place, each row that moves is copied twice (read out first, for
    it may overwrite another's source), and the others not at all; a reorder into new memory
    copies every row once. So: when N' <= rows and fewer than half move. The searches arrange
    their rows so that most stay put (`model.search`): at beam 5 a quarter moved."""
    n = index.numel()
    if n > rows:
        return None
    moved = (index != torch.arange(n, device=index.device)).nonzero().squeeze(1)  # (M,)
    return moved if 2 * moved.numel() < n else None


def move_rows_(table: Tensor, targets: Tensor, sources: Tensor) -> None:
    """Rows `targets` of the 2-D `table` take the values rows `sources` had before."""
    table.index_copy_(0, targets, table.index_select(0, sources))


class StepCache:
    """Self-attention's keys and values of the positions fed so far, every decoder layer's,
    written in place.

    Its 2L tables (layer l's keys at 2l and its values at 2l + 1, (N, H, `steps`, D/H) each) are
    allocated at the first step, and each layer writes its step's positions into its own
    (`layer` gives a layer's view). A reorder that moves few rows (`rows_to_move`) copies their
    first t positions in place; one that moves most copies the rows kept into a second set of
    tables, allocated once and then taking turns with the first. So a step allocates nothing
    and copies only what the search's reorder moves. Past `steps` positions the tables
    double. (The searches keep most rows in place: at beam 5, copying every row at every step
    had been 18% of the test set's search, `small`, fp32, 2 cores, and moving only the moved
    ones 7%, the whole search 12% faster.) One cache for all layers works out which rows to
    copy once a reorder, where each layer's own cache had done so again: ~55 ops a step of
    one sentence's search at beam 5, now ~37.
    (Growing by concatenation copied the whole cache at every step, and in beam search again
    at its reorder: the test set's search at beam 5 took 7% longer, `small` on 2 cores; greedy
    search, whose rows are reordered only as sentences finish, took the same time.)

    A reorder hands this cache's tables to its result as the spares: the cache it was called
    on is spent, as the searches never use a state again after reordering it.
    """

    def __init__(self, layers: int, steps: int = 0):
        self.steps = steps  # positions the tables hold (0: chosen at the first step)
        self.lengths = [0] * layers  # positions each layer has fed so far
        self.rows = 0
        self.tables: list[Tensor] = []  # 2L of (N_b, H, steps, D/H); [] before the first step
        self.spare: list[Tensor] = []

    def layer(self, layer: int) -> LayerStepCache:
        """What layer `layer`'s self-attention appends to and reads."""
        return LayerStepCache(self, layer)

    def view(self, table: int) -> Tensor:
        """(N, H, t, D/H), a view of table `table` (2l: layer l's keys, 2l + 1 its values)."""
        if not self.tables:
            raise RuntimeError("an empty or spent StepCache")
        return self.tables[table][: self.rows, :, : self.lengths[table // 2]]

    def _check_live(self) -> None:
        """A spent cache (positions fed, tables handed on) would write after, or copy,
        positions it no longer holds."""
        if not self.tables and any(self.lengths):
            raise RuntimeError("a StepCache used after its reorder; use the one it returned")

    def append(self, layer: int, keys: Tensor, values: Tensor) -> None:
        """Write layer `layer`'s keys and values of new positions, (N, H, T, D/H) each, after
        its old ones."""
        self._check_live()
        N, H, T, d_head = keys.shape
        start = self.lengths[layer]
        end = start + T
        if not self.tables or end > self.steps:
            # Every layer's tables at once (the first layer to run past them grows them all),
            # with the positions fed so far. Separate tensors, not one of (2L, N, ...): that one
            # made the test set's search at beam 5 1.06x as slow in paired passes (at a
            # batch's hundreds of rows, perhaps as the allocator maps so large a block afresh
            # each time), the separate tables 0.93x-0.97x.
            fed = max(self.lengths)
            steps = max(self.steps, end, 2 * fed)
            grown = [keys.new_empty(N, H, steps, d_head) for _ in range(2 * len(self.lengths))]
            for new, old in zip(grown, self.tables):
                new[:, :, :fed] = old[:N, :, :fed]
            self.tables, self.spare, self.steps = grown, [], steps
        self.rows = N
        self.tables[2 * layer][:N, :, start:end] = keys
        self.tables[2 * layer + 1][:N, :, start:end] = values
        self.lengths[layer] = end

    def reorder(self, index: Tensor, moved: Tensor | None = None) -> StepCache:
        """Row i of the result is row index[i] of this cache; index is (N',) long. Spends this
        cache (its tables become the result's, or its spares). With `moved` from
        `rows_to_move(index, rows)`, only those rows are copied, in place."""
        self._check_live()
        if len(set(self.lengths)) > 1:  # it would copy the first layer's positions of each
            raise RuntimeError(f"a StepCache reordered mid-step: its layers hold {self.lengths}")
        result = StepCache(len(self.lengths), self.steps)
        result.lengths, result.rows = list(self.lengths), index.numel()
        if not self.tables:
            return result
        n, t = index.numel(), self.lengths[0]
        N_b, H, steps, d_head = self.tables[0].shape
        heads = torch.arange(H, device=index.device)

        def rows(table: Tensor, count: int) -> Tensor:
            """The first t positions of each of a table's first `count` rows x heads: one
            contiguous run each, which index_select copies whole (selecting (N, H, t, D/H)
            views went element by element, twice as slow)."""
            return table.view(-1, steps * d_head)[: count * H, : t * d_head]

        if moved is not None:
            targets = (moved[:, None] * H + heads).flatten()  # (M H,)
            sources = (index[moved][:, None] * H + heads).flatten()
            for table in self.tables:
                move_rows_(rows(table, N_b), targets, sources)
            result.tables, result.spare = self.tables, self.spare
        else:
            spare = self.spare
            if not spare or spare[0].size(0) < n:
                spare = [table.new_empty(max(n, N_b), H, steps, d_head) for table in self.tables]
            sources = (index[:, None] * H + heads).flatten()  # (N' H,)
            for old, new in zip(self.tables, spare, strict=True):
                torch.index_select(rows(old, N_b), 0, sources, out=rows(new, n))
            result.tables, result.spare = spare, self.tables
        self.tables, self.spare = [], []
        return result


@dataclass
class LayerStepCache:
    """One layer's part of a `StepCache`: what its self-attention appends to and reads."""

    cache: StepCache
    layer: int

    def append(self, keys: Tensor, values: Tensor) -> None:
        """Write the keys and values of new positions, (N, H, T, D/H) each, after the old ones."""
        self.cache.append(self.layer, keys, values)

    @property
    def keys(self) -> Tensor:
        """(N, H, t, D/H), a view of the layer's table."""
        return self.cache.view(2 * self.layer)

    @property
    def values(self) -> Tensor:
        return self.cache.view(2 * self.layer + 1)


def decoding_dtype(keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Keys and values as decoding keeps them: on a CPU in float32, where attention while
    decoding runs in float32 (`MultiheadAttention._attend`); kept in bf16, the whole cache was
    cast again at every step. The values are the same: float32 holds every bf16 number."""
    if keys.device.type == "cpu" and keys.dtype in (torch.bfloat16, torch.float16):
        return keys.float(), values.float()
    return keys, values


def keep_mask(key_pad_mask: Tensor | None) -> Tensor | None:
    """SDPA's boolean keep-mask from torch's key-padding mask, or None when nothing is masked.

    Built once per forward (or once per decoding cache) by the stacks and shared by their
    layers; the causal mask is SDPA's `is_causal` flag instead (see `Transformer.decode`).

    Args:
        key_pad_mask: (B, S) bool, True = padding key, or None.

    Returns:
        (B, 1, 1, S) bool, True = may attend: it broadcasts over heads and queries, so no
        (B, H, T, S) mask is ever built.
    """
    if key_pad_mask is None:
        return None
    # The one place a mask changes polarity: nn.Transformer's masks say True = padding/blocked,
    # scaled_dot_product_attention's boolean attn_mask says True = may attend. Opposite meanings.
    keep = ~key_pad_mask[:, None, None, :]  # (B, 1, 1, S)
    # A query whose keys are all masked (an all-padding source) would take a softmax over nothing,
    # NaN on some backends: let it attend to every key instead. Its output is never used.
    return keep | ~keep.any(dim=-1, keepdim=True)


def keep_bias(keep: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A keep-mask (`keep_mask`) as the additive one SDPA takes as well: 0 where kept, -inf
    elsewhere, in `dtype`, the attention's (a decoding cache takes its keys'; SDPA's CPU kernel
    read a float32 mask of float64 queries as float64). A decoding cache keeps this: SDPA
    turns a boolean mask into it at every call, and `written_out_attention` took two ops a
    step where it now takes one. Training keeps the boolean mask (`keep_mask`), which SDPA
    turns into an additive one in the queries' dtype itself, whatever autocast made it."""
    if keep is None:
        return None
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return bias.masked_fill_(~keep, float("-inf"))


# A float32 decoding step's attention on a CPU, one query per row and head, is written out
# from this many queries (rows x heads) up. SDPA's fused kernel spends about a microsecond on
# each (row, head) pair whatever its work, which at one query is little. Over 30 keys, 4 heads
# (2 cores, Xeon with AMX): 128 rows took 0.50 ms fused and 0.33 written out, 48 rows about
# the same both ways, 32 rows 0.051 and 0.060. Greedy search of the whole test set, `small`,
# alternated in one process: 0.92x the time in one set of passes, 0.99x in another, the same
# translations; end to end no change was measurable through the machine's noise.
WRITTEN_OUT_QUERIES = 192


def written_out_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool, dropout_p: float
) -> Tensor:
    """What `scaled_dot_product_attention` computes, as two matmuls around a float32 softmax,
    where torch's fused kernel (flash) is the slower on a CPU. Under autocast it took 30 ms for
    the forward and backward of one (64, 4, 36, 64) bf16 attention, its math backend 11 ms,
    this 6 ms (benchmarks/attention_bench.py); it was a fifth of a bf16 training update. In
    float32 the fused kernel is the faster in training, and in decoding steps but those of
    many rows (`WRITTEN_OUT_QUERIES`)."""
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1)  # (B, H, T, S)
    if is_causal:  # SDPA's convention: query i sees keys 0..i
        T, S = scores.shape[-2:]
        future = torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if keep is not None and keep.is_floating_point():  # `keep_bias`
        scores = scores + keep
    elif keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
    if dropout_p:
        probs = dropout(probs, dropout_p)
    return probs.to(v.dtype) @ v


def float64_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool
) -> Tensor:
    """What `scaled_dot_product_attention` computes, in float64 and rounded to float32: a
    row's numbers then do not depend on the rows and padding beside it. In float32 they do,
    in their last bits: the kernels sum over the keys in another order when a batch's padding
    adds keys (masked, weight 0) or its rows make another kernel run, and int8's rounding of
    the next layer's input (`model.int8`) turns such a bit into a whole step now and then:
    7 of 100 test sentences translated otherwise alone than in a batch (`demo`, int8, beam 5).
    float64's differences are some 2^-29 of float32's last bit and vanish when rounded (none
    in those 100 sentences, whose scores were the same bit for bit). For decoding, no dropout.
    """
    if keep is not None and keep.is_floating_point():  # `keep_bias`, in the keys' dtype
        keep = keep.double()
    # Written out: SDPA's float64 kernel took up to 4x its time (a greedy step's 100 rows).
    return written_out_attention(q.double(), k.double(), v.double(), keep, is_causal, 0.0).float()


def _many_single_queries(q: Tensor) -> bool:
    """Whether q (B, H, T, D/H) is a decoding step's one query per row and head, and there are
    many (`WRITTEN_OUT_QUERIES`)."""
    B, H, T, _ = q.shape
    return T == 1 and B * H >= WRITTEN_OUT_QUERIES and not torch.is_grad_enabled()


class MultiheadAttention(nn.Module):
    """Parameters and the attention itself, shared by self- and cross-attention."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, d_head: int = 0):
        """d_head: the width of each head; 0 is the paper's d_model / n_heads. A pruned model
        keeps its heads' width with fewer heads, so its H * d_head is below d_model."""
        super().__init__()
        if not d_head and d_model % n_heads != 0:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.d_head = d_head or d_model // n_heads
        self.inner = n_heads * self.d_head  # H * d_head: d_model unless pruned
        self.dropout = dropout  # on the attention probabilities, as torch's
        self.in_proj_weight = nn.Parameter(torch.empty(3 * self.inner, d_model))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * self.inner))
        self.out_proj = nn.Linear(self.inner, d_model)
        # LoRA adapters on W_q, W_k, W_v (`model.lora.add_lora`), each x (..., D) -> the update
        # of its rows' projection (..., inner); None where there is none (plain attributes
        # then, read at no cost while decoding).
        self.lora_q: nn.Module | None = None
        self.lora_k: nn.Module | None = None
        self.lora_v: nn.Module | None = None
        # Layers that compute in_proj's rows while decoding on a CPU, by part (`set_in_proj`):
        # packed copies for oneDNN (`model.packed`) or int8 ones (`model.int8`).
        self.packed: dict[str, nn.Module] = {}
        # Attention in float64, rounded to float32 (`float64_attention`): for int8 decoding
        # (`model.int8`), where a row's numbers must not depend on the rows beside it.
        self.attend_in_float64 = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights and zero biases, as torch's MultiheadAttention.

        Xavier over the stacked (3D, D) matrix gives each of W_q, W_k, W_v the bound
        sqrt(6 / 4D): fairseq's per-matrix xavier_uniform with gain 1/sqrt(2).
        """
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.in_proj_bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def pack(self, dtype: torch.dtype) -> None:
        """Pack each part of in_proj that `_in_proj` computes (`model.packed.pack_linears`)."""
        self.set_in_proj(lambda w, b: PackedLinear(w, b, dtype))

    def set_in_proj(self, layer: Callable[[Tensor, Tensor], nn.Module]) -> None:
        """Compute each part of in_proj that `_in_proj` computes ("qkv", "q", "kv") with
        `layer(its weight rows, its bias rows)` from now on (packed, `pack`; int8,
        `model.int8.quantize_linears`)."""
        for part in ("qkv", "q", "kv"):
            rows = self._rows(part)
            self.packed[part] = layer(self.in_proj_weight[rows], self.in_proj_bias[rows])

    def _rows(self, part: str) -> slice:
        """in_proj's rows of `part`: "qkv" all (self-attention), "q" W_q, "kv" W_k and W_v."""
        rows = {"qkv": slice(None), "q": slice(None, self.inner), "kv": slice(self.inner, None)}
        return rows[part]

    def _in_proj(self, x: Tensor, part: str) -> Tensor:
        """x (B, T, D) projected by in_proj's rows of `part` -> (B, T, n H d_head), with the
        updates of the LoRA adapters on those rows, if any."""
        if part in self.packed:
            y = self.packed[part](x)
        else:
            rows = self._rows(part)
            y = F.linear(x, self.in_proj_weight[rows], self.in_proj_bias[rows])
        if self.lora_q is None and self.lora_k is None and self.lora_v is None:
            return y
        return self._add_lora(x, y, part)

    def _add_lora(self, x: Tensor, y: Tensor, part: str) -> Tensor:
        """y, the projection of x by the rows of `part`, plus each adapter's low-rank update
        of its rows, in place in its columns of y (W_q's [0, inner) of "qkv" and "q"; W_k's
        [inner, 2 inner) of "qkv", [0, inner) of "kv"; ...): W x + scale B A x without ever
        forming W + scale B A, so a frozen W costs no gradient matmul."""
        for i, name in enumerate(part):  # "qkv": q, k, v; "q": q; "kv": k, v
            adapter = getattr(self, "lora_" + name)
            if adapter is not None:
                y[..., i * self.inner : (i + 1) * self.inner] += adapter(x)  # (B, T, inner)
        return y

    def _split_heads(self, x: Tensor, n: int) -> Tensor:
        """(B, T, n*D) projections -> (n, B, H, T, D/H)."""
        B, T, _ = x.shape
        x = x.view(B, T, n, self.n_heads, self.d_head)  # (B, T, n, H, D/H)
        return x.permute(2, 0, 3, 1, 4)  # (n, B, H, T, D/H)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool = False
    ) -> Tensor:
        """softmax(QK^T / sqrt(d_k)) V over the heads, then W_o (paper eq. 1).

        q (B, H, T, D/H), k and v (B, H, S, D/H), keep broadcastable to (B, H, T, S) or None
        (boolean, True = may attend, or additive: `keep_bias`),
        is_causal: query i sees keys up to i (SDPA's flag, which admits its fastest kernels)
        -> (B, T, D).
        """
        dropout_p = self.dropout if self.training else 0.0
        half = q.dtype in (torch.bfloat16, torch.float16)
        if self.attend_in_float64:
            out = float64_attention(q, k, v, keep, is_causal)
        elif q.device.type == "cpu" and half and not torch.is_grad_enabled():
            # Decoding under CPU autocast: in float32, with autocast off around it (autocast
            # casts SDPA's inputs to bf16 whatever they are, and its bf16 CPU kernel took 1.1 ms
            # where float32's took 0.34, one step's attention of 100 rows over 30 keys, 1 thread,
            # Xeon with AMX). Its matmuls' shapes change at every step (one more key) and oneDNN,
            # which runs half-precision ones, builds and keeps a kernel per shape; float32
            # attention needs none.
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), attn_mask=keep, is_causal=is_causal
                )
            out = out.to(q.dtype)
        elif q.device.type == "cpu" and (half or _many_single_queries(q)):
            out = written_out_attention(q, k, v, keep, is_causal, dropout_p)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=dropout_p, is_causal=is_causal
            )
        B, H, T, d_head = out.shape
        out = out.transpose(1, 2).reshape(B, T, H * d_head)  # (B, T, D)
        return self.out_proj(out)

    def _probabilities(self, q: Tensor, k: Tensor, keep: Tensor | None) -> Tensor:
        """The attention probabilities, computed explicitly (for inspection, never for training)."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, S)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        return scores.softmax(dim=-1)


class SelfAttention(MultiheadAttention):
    """Attention of a sequence over itself, with an optional cache of past keys and values."""

    def forward(
        self,
        x: Tensor,
        keep: Tensor | None = None,
        is_causal: bool = False,
        cache: LayerStepCache | None = None,
    ) -> Tensor:
        """Attend from every position of x to the positions of x (and of the cache).

        Args:
            x: (B, T, D) the sequence.
            keep: SDPA's keep-mask from `keep_mask` (True = may attend), (B, 1, 1, T) for key
                padding, or None.
            is_causal: position i attends to positions up to i only.
            cache: keys and values of earlier positions (B, H, t, D/H); those of x are appended
                and x attends to all of them. Masks then must be None: the cache holds only the
                past of real tokens.

        Returns:
            (B, T, D)
        """
        qkv = self._in_proj(x, "qkv")  # (B, T, 3D)
        q, k, v = self._split_heads(qkv, 3)  # (B, H, T, D/H) each
        if cache is not None:
            cache.append(*decoding_dtype(k, v))
            k, v = cache.keys, cache.values  # (B, H, t + T, D/H)
        return self._attend(q, k, v, keep, is_causal)


class CrossAttention(MultiheadAttention):
    """Attention of the decoder over the encoder output ("memory")."""

    def project_memory(self, memory: Tensor) -> KVCache:
        """Keys and values of the memory, (B, S, D) -> (B, H, S, D/H) each: once per source."""
        kv = self._in_proj(memory, "kv")  # (B, S, 2D)
        k, v = self._split_heads(kv, 2)  # (B, H, S, D/H) each
        if not torch.is_grad_enabled():  # decoding: kept for every step, moved by reorders,
            # which copy contiguous rows 4x as fast as these views' (tried: (100, 4, 48, 64)).
            k, v = (t.contiguous() for t in self._memory_kept(k, v))
        return KVCache(k, v)

    def _memory_kept(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """The memory's keys and values as decoding keeps them (`decoding_dtype`); in float64
        where attention runs in it (`float64_attention`): cast once per source, not at every
        step. (Self-attention's cache stays float32, cast at each step: kept in float64, its
        reorders copied twice the bytes, and an int8 search of the test set took as long.)"""
        if self.attend_in_float64:
            return keys.double(), values.double()
        return decoding_dtype(keys, values)

    def _project_query(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, D/H)."""
        q = self._in_proj(x, "q")  # (B, T, H * d_head)
        return self._split_heads(q, 1)[0]

    def forward(self, x: Tensor, memory_kv: KVCache, keep: Tensor | None) -> Tensor:
        """Attend from x to the memory.

        Args:
            x: (B, T, D) decoder states, or (g B, T, D) while decoding: the g hypotheses
                (beams) of each sentence, in consecutive rows, share its keys and values.
            memory_kv: from `project_memory`, (B, H, S, D/H) each.
            keep: (B, 1, 1, S) from `keep_mask` of the source padding, or None.

        Returns:
            x's shape.
        """
        N, T, _ = x.shape
        B = memory_kv.keys.size(0)
        if N != B:  # a sentence's beams are more queries of one attention: no copied keys
            x = x.reshape(B, N // B * T, x.size(-1))
        q = self._project_query(x)
        out = self._attend(q, memory_kv.keys, memory_kv.values, keep)
        return out.reshape(N, T, out.size(-1))

    def forward_with_probabilities(
        self, x: Tensor, memory_kv: KVCache, keep: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """`forward` computed explicitly, also returning its probabilities (for inspection,
        in eval mode: no dropout).

        Shape: x (B, T, D), keep (B, 1, 1, S) -> (B, T, D) and (B, H, T, S), the latter zero
        on padding keys.
        """
        q = self._project_query(x)
        probabilities = self._probabilities(q, memory_kv.keys, keep)  # (B, H, T, S)
        out = probabilities @ memory_kv.values  # (B, H, T, D/H)
        B, H, T, d_head = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, H * d_head)), probabilities
