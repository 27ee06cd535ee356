"""A `Transformer`'s state dict under the names of Hugging Face's `MarianMTModel`, and back.

Marian names its weights as the rest of the BART family (`model.bart_family`, which holds the
table and what the names hide: the fused projections, the positions' layout): a Post-LN model
with sinusoidal positions (`positions: halves`, or interleaved ones moved into that layout),
embeddings x sqrt(D), and `final_logits_bias` on its logits (`model.output_bias`). Its decoder
starts from `<pad>` (`decoder_start: pad`). Pure torch: `cli/exporters` and `cli/importers` read
and write the files.
"""

from __future__ import annotations

import torch

from model.bart_family import hf_weights, reorder_vocabulary, tf_weights
from model.transformer import Transformer

__all__ = ["LAYOUT", "marian_weights", "position_offset", "reorder_vocabulary", "tf_weights"]


def position_offset(pad_id: int) -> int:
    """The position table's first row: Marian's sinusoids start at position 0, whatever the
    pad."""
    return 0


# The switches of every Marian model (its embeddings' tying is its config.json's).
LAYOUT = dict(
    norm_first=False,
    positions="halves",
    position_offset=position_offset(0),
    scale_embedding=True,
    layernorm_embedding=False,
    output_bias=True,
    decoder_start="pad",
)


def marian_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, `final_logits_bias` among them (zeros where the model
    has no `output_bias`)."""
    return hf_weights(model, logits_bias=True)
