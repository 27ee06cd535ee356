"""NLLB-200 and M2M100 (`M2M100ForConditionalGeneration`, model_type m2m_100, dense) as `tf`
runs: what differs from mBART-50 (`cli.importers.fairseq` holds what they share).

Their switches are `model.m2m100.LAYOUT`'s: fairseq's sinusoids, counted from padding_idx + 1
(config.json's pad_token_id + 1), no bias on the logits. Their tokenizers: NLLB-200's
(`NllbTokenizer`, 202 codes such as fra_Latn) and M2M100's (`M2M100Tokenizer`, 100 such as fr,
written __fr__). NLLB-MoE (model_type nllb_moe) is another network: `cli.importers.families`
refuses it.
"""

from __future__ import annotations

from functools import partial

from cli.importers.fairseq import FILES, Layout, fairseq_plan
from cli.importers.plan import Family
from data.fairseq import M2M100, NLLB
from model import m2m100

LAYOUT = Layout(
    config_class="M2M100Config",
    switches=m2m100.LAYOUT,
    names=m2m100.m2m100_weights,
    tokenizers=(NLLB, M2M100),
    # `create_position_ids_from_input_ids` numbers the real tokens from padding_idx + 1.
    position_offset=lambda hf: hf["pad_token_id"] + 1,
)
FAMILY = Family("NLLB-200 and M2M100", ("m2m_100",), FILES, partial(fairseq_plan, layout=LAYOUT))
