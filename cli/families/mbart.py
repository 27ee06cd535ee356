"""mBART-50's translation models (`MBartForConditionalGeneration`, model_type mbart, with
`MBart50Tokenizer`: facebook/mbart-large-50-many-to-many-mmt, -one-to-many-mmt,
-many-to-one-mmt): the family's record, what differs from NLLB-200 and M2M100
(`cli.families.fairseq` holds what they share).

Their switches are `model.mbart.LAYOUT`'s: a learned position table per stack, read from row 2
on (`model.mbart.position_offset`, whatever the pad), a LayerNorm after the embeddings, a bias
on the logits. Their tokenizer has 52 codes (fr_XX ...), a source's first. Their config.json
keeps fairseq's names of the layout, which CTranslate2's mBART loader reads (`CONFIG_LAYOUT`).

mBART-25 (facebook/mbart-large-cc25, and the translation models fine-tuned from it such as
facebook/mbart-large-en-ro) is another layout under the same model_type: `MBartTokenizer`
puts the code after a source's `</s>`, and its decoders start from the target's code. Its
files say so (`refuse_mbart25`), and it is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.config import Config
from cli.families.fairseq import CONVERTER, FILES, export_pre_ln, fairseq_plan, tokenizer_classes
from cli.families.family import Family
from cli.importers.plan import Plan
from data.errors import InputError
from data.fairseq import HF_CONFIG, MBART50, TOKENIZER_JSON
from data.files import read_json_object
from data.tokenizer_base import BaseTokenizer
from model import mbart
from model.transformer import Transformer

MBART25_CLASSES = ("MBartTokenizer", "MBartTokenizerFast")
MBART25_CODES = 25  # ar_AR ... zh_CN; mBART-50 adds 27 more
# config.json's fairseq names of the layout (`normalize_before`: Pre-LN;
# `normalize_embedding`: the embeddings' norm), which CTranslate2's mBART loader reads.
CONFIG_LAYOUT = {"normalize_before": True, "normalize_embedding": True}


def mbart_plan(directory: Path, hf: dict[str, Any], source: str) -> Plan:
    """An mBART-50 translation model's `Plan`, mBART-25 refused first."""
    refuse_mbart25(directory, hf)
    return fairseq_plan(directory, hf, source, MBART)


def refuse_mbart25(directory: Path, hf: dict[str, Any]) -> None:
    """A one-line InputError where the files are mBART-25's: a tokenizer_class of
    `MBartTokenizer` (tokenizer_config.json's, else config.json's), or, where none is named,
    a tokenizer.json of mBART-25's 25 language codes."""
    named = read_json_object(directory / HF_CONFIG, default={}).get("tokenizer_class")
    named = named or hf.get("tokenizer_class")
    where = directory / HF_CONFIG
    if named in MBART25_CLASSES:
        why = f"tokenizer_class {named}"
    elif named is None and _codes(directory / TOKENIZER_JSON) == MBART25_CODES:
        why, where = f"{MBART25_CODES} language codes", directory / TOKENIZER_JSON
    else:
        return
    raise InputError(
        f"{where}: an mBART-25 model ({why}: mbart-large-cc25 or a fine-tune of it), whose "
        "sources end in their code and whose decoder starts from the target's; tf import takes "
        "mBART-50's translation models (facebook/mbart-large-50-many-to-many-mmt, "
        "-one-to-many-mmt, -many-to-one-mmt)"
    )


def _codes(path: Path) -> int:
    """How many of tokenizer.json's added tokens are mBART codes (xx_YY); 0 without one."""
    added = read_json_object(path, default={}).get("added_tokens") or []
    contents = [t.get("content") for t in added if isinstance(t, dict)]
    return sum(isinstance(c, str) and bool(MBART50.code.fullmatch(c)) for c in contents)


def export_mbart(model: Transformer, tokenizer: BaseTokenizer, config: Config, out: Path) -> None:
    """`model` as an `MBartForConditionalGeneration` directory `out`."""
    export_pre_ln(MBART, model, tokenizer, config, out, extra=CONFIG_LAYOUT)


def converter_problem(model: Transformer, tokenizer: BaseTokenizer) -> str | None:
    """Why CTranslate2's converter would not give this model: its mBART loader starts every
    decoder from EOS (mBART-50's start), whatever config.json says."""
    start = model.config.decoder_start
    if start == "eos":
        return None
    piece = tokenizer.tgt_pieces([tokenizer.decoder_start_id(start)])[0]
    return (
        "its mBART loader starts every decoder from EOS (mBART-50's start), this model's "
        f"from {start.upper()}, `{piece}`: the converted model would translate otherwise"
    )


MBART = Family(
    title="mBART-50",
    model_types=("mbart",),
    config_class="MBartConfig",
    model_class="MBartForConditionalGeneration",
    switches=mbart.LAYOUT,
    position_offset=mbart.position_offset,
    names=mbart.mbart_weights,
    tokenizer_classes=tokenizer_classes(MBART50),
    files=FILES,
    plan=mbart_plan,
    export=export_mbart,
    converter=CONVERTER,
    converter_problem=converter_problem,
)
