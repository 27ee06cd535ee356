"""`tf translate --attention DIR`: a heatmap of the cross-attention behind each translation.

The model's own translation is fed back teacher-forced (BOS + hypothesis) and one decoder layer's
encoder-decoder attention probabilities are drawn: row t is the step that predicts target piece t
(the hypothesis, then EOS), column s a source piece. A layer's heads may look at quite different
things, so the default average over heads is only a summary; `--attention-head` shows one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cli.figures import new_figure, require_matplotlib
from data.errors import InputError
from data.tokenizer import Tokenizer
from model.transformer import ModelConfig, Transformer

CELL_INCHES = 0.32  # per source/target piece: labels of 8-point text stay apart
MAX_INCHES = 60.0  # 6000 pixels at 100 dpi, for sentences near the model's length limit


@dataclass
class AttentionOptions:
    """Where and what to draw: `layer` indexes the decoder layers as a list (-1 = last);
    `head` None averages over the heads."""

    directory: Path
    layer: int = -1
    head: int | None = None


def attention_options(
    directory: Path | None, layer: int | None, head: int | None
) -> AttentionOptions | None:
    """`--attention DIR` with `--attention-layer` (None: the last) and `--attention-head`; None
    without DIR, which a layer or head given alone needs (else ignored without a word).

    Raises:
        InputError: naming the flag given without --attention.
    """
    if directory is None:
        for flag, value in (("--attention-layer", layer), ("--attention-head", head)):
            if value is not None:
                raise InputError(f"{flag} needs --attention DIR: it chooses what that draws")
        return None
    return AttentionOptions(directory, -1 if layer is None else layer, head)


def prepare_attention(options: AttentionOptions, config: ModelConfig) -> None:
    """Before anything is translated: check the layer, the head and matplotlib, make the folder.

    Raises:
        InputError: a layer or head the model does not have, no matplotlib, or DIR is a file.
    """
    n_layers, n_heads = config.n_decoder_layers, config.n_heads
    if not -n_layers <= options.layer < n_layers:
        raise InputError(
            f"--attention-layer {options.layer}: the model has {n_layers} decoder layers "
            f"(0..{n_layers - 1}, or -1 for the last)"
        )
    if options.head is not None and not 0 <= options.head < n_heads:
        raise InputError(
            f"--attention-head {options.head}: the model has {n_heads} heads (0..{n_heads - 1})"
        )
    require_matplotlib("tf translate --attention")
    if options.directory.exists() and not options.directory.is_dir():
        raise InputError(f"{options.directory}: not a folder (--attention DIR)")
    options.directory.mkdir(parents=True, exist_ok=True)


@torch.inference_mode()
def attention_matrix(
    model: Transformer,
    tokenizer: Tokenizer,
    src_ids: list[int],
    hyp_tokens: list[int],
    layer: int = -1,
    head: int | None = None,
) -> tuple[np.ndarray, list[str], list[str]]:
    """The cross-attention of one decoder layer while the model re-reads its own translation.

    Args:
        model: the model that produced `hyp_tokens` (on any device).
        tokenizer: its tokenizer, for the special ids and the piece names.
        src_ids: the source ids as translated (no BOS/EOS, already truncated).
        hyp_tokens: the hypothesis, without BOS and EOS.
        layer: decoder layer, indexed as a list (-1 = last).
        head: one head, or None for the mean over heads.

    Returns:
        (weights, src_pieces, tgt_pieces): weights (T, S) float32, each row summing to 1, where
        T = len(hyp_tokens) + 1 (the targets hyp + EOS) and S = len(src_ids).
    """
    device = next(model.parameters()).device
    src = torch.tensor([src_ids], dtype=torch.long, device=device)  # (1, S)
    start = tokenizer.decoder_start_id(model.config.decoder_start)
    tgt_in = torch.tensor([[start, *hyp_tokens]], dtype=torch.long, device=device)
    src_pad_mask = torch.zeros_like(src, dtype=torch.bool)  # (1, S) one sentence: no padding
    probabilities = model.cross_attention(src, tgt_in, src_pad_mask, None)  # (L, 1, H, T, S)
    heads = probabilities[layer, 0]  # (H, T, S)
    weights = heads.mean(dim=0) if head is None else heads[head]  # (T, S)
    tgt_pieces = tokenizer.tgt_pieces([*hyp_tokens, tokenizer.eos_id])
    return weights.float().cpu().numpy(), tokenizer.src_id_pieces(src_ids), tgt_pieces


def save_heatmap(
    weights: np.ndarray, src_pieces: list[str], tgt_pieces: list[str], path: Path, title: str
) -> Path:
    """Draw an attention matrix as a PNG: source pieces across, target pieces down.

    Args:
        weights: (T, S) probabilities in [0, 1].
        src_pieces, tgt_pieces: the S column and T row labels.
        path: the picture to write (its folder must exist).
        title: a line above the matrix.

    Returns:
        path.
    """
    n_tgt, n_src = weights.shape
    # Fixed room for the labels and colour bar, then a fixed size per cell: long sentences
    # grow the picture instead of squeezing their labels together.
    width = min(MAX_INCHES, 2.5 + CELL_INCHES * n_src)
    height = min(MAX_INCHES, 2.0 + CELL_INCHES * n_tgt)
    figure = new_figure(max(width, 4.0), max(height, 3.0), "tf translate --attention")
    axes = figure.subplots()
    # Colours span 0 to the largest weight, not 0 to 1: attention spread over many source pieces
    # (an untrained model, an averaged head) would otherwise all be the same dark shade.
    vmax = max(float(weights.max()), 1e-6)
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    axes.set_xticks(range(n_src), src_pieces, rotation=60, ha="right", rotation_mode="anchor")
    axes.set_yticks(range(n_tgt), tgt_pieces)
    axes.tick_params(labelsize=8)
    axes.set_xlabel("source")
    axes.set_ylabel("target (translation + EOS)")
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.05, pad=0.02)
    figure.savefig(path, dpi=100)
    return path


def write_attention(
    model: Transformer,
    tokenizer: Tokenizer,
    options: AttentionOptions,
    line_number: int,
    src_ids: list[int],
    hyp_tokens: list[int],
) -> Path | None:
    """Save the heatmap of one translated input line as DIR/NNNN.png; None for an empty line.

    Args:
        line_number: 1-based, the file name (zero-padded to 4 digits or more).
        src_ids: the line's source ids as translated; hyp_tokens: its best translation,
            without BOS and EOS.
    """
    if not src_ids:
        return None
    weights, src_pieces, tgt_pieces = attention_matrix(
        model, tokenizer, src_ids, hyp_tokens, options.layer, options.head
    )
    n_layers = model.config.n_decoder_layers
    heads = "mean over heads" if options.head is None else f"head {options.head}"
    title = (
        f"line {line_number}: cross-attention of decoder layer "
        f"{options.layer % n_layers} (of 0..{n_layers - 1}), {heads}"
    )
    path = options.directory / f"{line_number:04d}.png"
    return save_heatmap(weights, src_pieces, tgt_pieces, path, title)
