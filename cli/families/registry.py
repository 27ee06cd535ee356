"""The registry of model families: each record (`cli.families.family.Family`) listed once, and
the two dispatches over them. `tf import` picks the family by config.json's `model_type`
(`family_of`), and what is none of them is one line saying what `tf import` takes; `tf export
--to huggingface` picks it by the model's switches (`exporting_family`): its positions and the
place of its layer norm, each family's `switches`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.families.family import Family
from cli.families.m2m100 import M2M100
from cli.families.marian import MARIAN
from cli.families.mbart import MBART
from cli.importers.plan import import_plan
from cli.importers.source import locate, read_config_json
from data.errors import InputError
from data.files import check_output_dir
from model.transformer import ModelConfig

FAMILIES = (MARIAN, M2M100, MBART)
TAKES = (
    "tf import takes Marian translation models (MarianMTModel, OPUS-MT's "
    "Helsinki-NLP/opus-mt-*), NLLB-200 and M2M100 (model_type m2m_100, dense) and mBART-50's "
    "(model_type mbart)"
)
# Models of a known kind that tf's Transformer is not, each with why.
REFUSED = {
    "nllb_moe": (
        "NLLB-MoE (NllbMoeForConditionalGeneration) is a mixture of experts, not dense: tf's "
        "layers have one feed-forward each; take a dense NLLB-200 "
        "(facebook/nllb-200-distilled-600M, -distilled-1.3B, -1.3B, -3.3B)"
    ),
}


def import_model(source: str, out: Path, force: bool = False) -> str:
    """Import SOURCE (a directory or a hub name) as the run `out`, which every command then
    takes; returns a report for the user: the model, its vocabulary, its languages, its
    generation settings."""
    check_output_dir(out, force, "-o", [Path(source)] if Path(source).exists() else [])
    directory, origin = locate(source, lambda directory: family_of(directory)[0].files)
    family, hf = family_of(directory)
    return import_plan(family.plan(directory, hf, source), directory, out, origin)


def family_of(directory: Path) -> tuple[Family, dict[str, Any]]:
    """The family of the model in `directory`, and its config.json as read.

    Raises:
        InputError: no config.json, or a model of no family tf imports, naming it.
    """
    hf = read_config_json(directory)
    kind = hf.get("model_type")
    for family in FAMILIES:
        if kind in family.model_types:
            return family, hf
    where = directory / "config.json"
    known = kind.replace("-", "_") if isinstance(kind, str) else None
    if known in REFUSED:
        raise InputError(f"{where}: {REFUSED[known]}; {TAKES}")
    named = ", ".join(map(str, hf.get("architectures") or [])) or "no architecture"
    raise InputError(f"{where}: a {kind or 'unknown'} model ({named}); {TAKES}")


def exporting_family(c: ModelConfig) -> Family:
    """The family whose class `tf export --to huggingface` writes for a model of `c`: a Pre-LN
    family's for a Pre-LN model of its positions (M2M100's fairseq sinusoids, mBART's learned
    table), else the Post-LN one's (Marian's, whose `check_exportable` checks its positions).

    Raises:
        InputError: a model no Hugging Face class runs, as one line.
    """
    pre_ln = {f.switches["positions"]: f for f in FAMILIES if f.switches["norm_first"]}
    family = pre_ln.get(c.positions)
    if not c.norm_first and family is None:
        return next(f for f in FAMILIES if not f.switches["norm_first"])
    if family is None:
        raise InputError(
            f"no Hugging Face class runs a Pre-LN model with model.positions {c.positions}: "
            "M2M100's takes fairseq, mBART's learned (Marian's sinusoids are Post-LN)"
        )
    if not c.norm_first:
        raise InputError(
            f"no Hugging Face class runs a Post-LN model with model.positions {c.positions}: "
            f"{family.model_class} is Pre-LN (model.norm_first), Marian takes the paper's "
            "sinusoids"
        )
    return family
