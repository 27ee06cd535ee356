"""`tf import`'s one dispatcher: config.json's model_type picks the family that reads the model
(Marian, NLLB-200 and M2M100, mBART-50), and what is none of them is one line saying what
`tf import` takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.importers import m2m100, marian, mbart
from cli.importers.plan import Family, import_plan
from cli.importers.source import locate, read_config_json
from data.errors import InputError
from data.files import check_output_dir

FAMILIES = (marian.FAMILY, m2m100.FAMILY, mbart.FAMILY)
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
