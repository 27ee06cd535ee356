"""NLLB-200 and M2M100 (`M2M100ForConditionalGeneration`, model_type m2m_100, dense): the
family's record, what differs from mBART-50 (`cli.families.fairseq` holds what they share).

Their switches are `model.m2m100.LAYOUT`'s: fairseq's sinusoids, counted from padding_idx + 1
(`model.m2m100.position_offset` of config.json's pad_token_id), no bias on the logits. Their
tokenizers: NLLB-200's (`NllbTokenizer`, 202 codes such as fra_Latn) and M2M100's
(`M2M100Tokenizer`, 100 such as fr, written __fr__). NLLB-MoE (model_type nllb_moe) is another
network: `cli.families.registry` refuses it. CTranslate2's converter converts their export
exactly: its M2M100 loader starts the decoder where config.json says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.config import Config
from cli.families.fairseq import CONVERTER, FILES, export_pre_ln, fairseq_plan, tokenizer_classes
from cli.families.family import Family
from cli.importers.plan import Plan
from data.fairseq import M2M100 as M2M100_TOKENIZER
from data.fairseq import NLLB
from data.tokenizer_base import BaseTokenizer
from model import m2m100
from model.transformer import Transformer


def m2m100_plan(directory: Path, hf: dict[str, Any], source: str) -> Plan:
    """An NLLB-200 or M2M100 model's `Plan`."""
    return fairseq_plan(directory, hf, source, M2M100)


def export_m2m100(model: Transformer, tokenizer: BaseTokenizer, config: Config, out: Path) -> None:
    """`model` as an `M2M100ForConditionalGeneration` directory `out`."""
    export_pre_ln(M2M100, model, tokenizer, config, out)


def converter_problem(model: Transformer, tokenizer: BaseTokenizer) -> str | None:
    """None: CTranslate2's M2M100 loader starts the decoder where config.json says."""
    return None


M2M100 = Family(
    title="NLLB-200 and M2M100",
    model_types=("m2m_100",),
    config_class="M2M100Config",
    model_class="M2M100ForConditionalGeneration",
    switches=m2m100.LAYOUT,
    position_offset=m2m100.position_offset,
    names=m2m100.m2m100_weights,
    tokenizer_classes=tokenizer_classes(NLLB, M2M100_TOKENIZER),
    files=FILES,
    plan=m2m100_plan,
    export=export_m2m100,
    converter=CONVERTER,
    converter_problem=converter_problem,
)
