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

__all__ = ["marian_weights", "reorder_vocabulary", "tf_weights"]


def marian_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, `final_logits_bias` among them (zeros where the model
    has no `output_bias`)."""
    return hf_weights(model, logits_bias=True)
