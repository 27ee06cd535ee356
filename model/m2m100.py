"""NLLB-200 and M2M100 (`M2M100ForConditionalGeneration`, model_type m2m_100) as `tf`'s
Transformer: the weights under their names and back (`model.bart_family`'s table), and the
`ModelConfig` switches every such model has.

- Pre-LN layers, a `layer_norm` ending each stack: `norm_first: true`;
- `M2M100SinusoidalPositionalEmbedding`, fairseq's sinusoids at positions counted from
  padding_idx + 1 over the non-pad tokens, a pad's a zero row: `positions: fairseq`,
  `position_offset: 2`;
- `decoder_start_token_id` 2, the EOS: `decoder_start: eos`;
- `shared`, tied to `lm_head`, and no `final_logits_bias`: `tie_embeddings: all`,
  `output_bias: false`;

and, as its config.json says: `scale_embedding`, `activation_function` (`activation`),
`encoder_layerdrop`/`decoder_layerdrop`, the widths, `max_position_embeddings`
(`max_positions`). The sinusoids are computed, never stored (transformers keeps no table in a
state dict).
"""

from __future__ import annotations

import torch

from model.bart_family import hf_weights, tf_weights
from model.transformer import Transformer

__all__ = ["LAYOUT", "m2m100_weights", "position_offset", "tf_weights"]


def position_offset(pad_id: int) -> int:
    """The position table's first row: padding_idx + 1, from which
    `create_position_ids_from_input_ids` counts a sentence's tokens."""
    return pad_id + 1


# The switches of every M2M100 model, its offset that of pad_token_id 1 (every published
# model's: `position_offset` of another pad).
LAYOUT = dict(
    norm_first=True,
    positions="fairseq",
    position_offset=position_offset(1),
    decoder_start="eos",
    tie_embeddings="all",
    output_bias=False,
    layernorm_embedding=False,
)


def m2m100_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under `M2M100ForConditionalGeneration`'s names (its whole state dict)."""
    return hf_weights(model, logits_bias=False)
