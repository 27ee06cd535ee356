"""`tf import`: a pretrained Hugging Face translation model (Marian/OPUS-MT, NLLB-200, M2M100,
mBART-50) as a `tf` run."""

from __future__ import annotations

from pathlib import Path

from cli.families.registry import import_model


def run_import(source: str, out: Path, force: bool) -> str:
    """Import SOURCE (a directory, or a hub name such as Helsinki-NLP/opus-mt-es-en or
    facebook/nllb-200-distilled-600M) into the run directory `out`, which every command then
    takes."""
    return import_model(source, out, force)
