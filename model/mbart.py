"""mBART-50 (`MBartForConditionalGeneration`, model_type mbart) as `tf`'s Transformer: the
weights under its names and back (`model.bart_family`'s table), and the `ModelConfig` switches
every such model has.

- Pre-LN layers, a `layer_norm` ending each stack: `norm_first: true`;
- `MBartLearnedPositionalEmbedding` per stack, read from row 2 on (its `offset`):
  `positions: learned`, `position_offset: 2`;
- `layernorm_embedding` per stack: `layernorm_embedding: true`;
- `final_logits_bias`: `output_bias: true`;
- `decoder_start_token_id` 2, the EOS (mBART-50): `decoder_start: eos`;
- `shared`, tied to `lm_head`: `tie_embeddings: all`;

and, as its config.json says: `scale_embedding`, `activation_function` (`activation`: gelu),
`encoder_layerdrop`/`decoder_layerdrop`, the widths, `max_position_embeddings`
(`max_positions`: each table has 2 rows more).
"""

from __future__ import annotations

import torch

from model.bart_family import hf_weights, tf_weights
from model.transformer import Transformer

__all__ = ["LAYOUT", "mbart_weights", "position_offset", "tf_weights"]

OFFSET = 2  # transformers' `MBartLearnedPositionalEmbedding.offset`


def position_offset(pad_id: int) -> int:
    """The position table's first row: transformers' constant, whatever the pad."""
    return OFFSET


# The switches of every mBART model.
LAYOUT = dict(
    norm_first=True,
    positions="learned",
    position_offset=OFFSET,
    layernorm_embedding=True,
    output_bias=True,
    decoder_start="eos",
    tie_embeddings="all",
)


def mbart_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under `MBartForConditionalGeneration`'s names (its whole state dict)."""
    return hf_weights(model, logits_bias=True)
