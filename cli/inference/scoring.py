"""Corpus scores through sacrebleu: BLEU (13a tokenisation) and chrF, with their signatures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from data.errors import InputError, counted


def score(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF of detokenised hypotheses against one reference each."""
    if not references:  # sacrebleu would fail with an IndexError
        raise InputError("no sentences to score")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "sentences": len(hypotheses),
    }


def check_parallel(src: Path, src_lines: list[str], ref: Path, ref_lines: list[str]) -> None:
    """Refuse two files of different lengths, or nothing to score at all."""
    if not ref_lines:
        raise InputError(f"{ref}: no lines: nothing to score")
    if len(src_lines) != len(ref_lines):
        raise InputError(
            f"{src} has {counted(len(src_lines), 'line')} but {ref} has {len(ref_lines)}"
        )
