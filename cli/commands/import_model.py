"""`tf import`: a pretrained Hugging Face Marian model (OPUS-MT) as a `tf` run."""

from __future__ import annotations

from pathlib import Path

from cli.importers.marian import import_marian


def run_import(source: str, out: Path, force: bool) -> str:
    """Import SOURCE (a directory, or a hub name such as Helsinki-NLP/opus-mt-es-en) into the
    run directory `out`, which every command then takes."""
    return import_marian(source, out, force)
