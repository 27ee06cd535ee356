"""`tf eval`: corpus BLEU (13a tokenisation) and chrF through sacrebleu, with their signatures."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from cli.checkpoint import load_for_inference
from cli.translate import (
    SearchOptions,
    pick_device,
    read_lines,
    resolve_options,
    translate_stream,
)
from data.errors import InputError


def score(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF of detokenised hypotheses against one reference each."""
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


def read_text(path: Path) -> list[str]:
    """A text file's lines (UTF-8 checked, file:line on error)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    with open(path, "rb") as f:
        return list(read_lines(f, str(path)))


def check_parallel(src: Path, src_lines: list[str], ref: Path, ref_lines: list[str]) -> None:
    if len(src_lines) != len(ref_lines):
        raise InputError(f"{src} has {len(src_lines)} lines but {ref} has {len(ref_lines)}")


def run_eval(
    run: str | None,
    src: Path | None,
    ref: Path,
    hyp: Path | None,
    beam_size: int | None,
    greedy: bool,
    device_name: str,
    limit: int,
    as_json: bool,
) -> str:
    """Translate `src` with the run's model (or read `hyp`) and score it against `ref`."""

    refs = read_text(ref)
    settings: dict[str, Any] = {}
    if hyp is not None:
        hyps = read_text(hyp)
        check_parallel(hyp, hyps, ref, refs)
    else:
        if run is None or src is None:
            raise InputError("tf eval needs RUN and --src, or --hyp")
        srcs = read_text(src)
        check_parallel(src, srcs, ref, refs)
        device = pick_device(device_name)
        model, tokenizer, config = load_for_inference(run, device)
        options = resolve_options(SearchOptions(1 if greedy else (beam_size or 0)), config.decode)
        if limit:
            srcs, refs = srcs[:limit], refs[:limit]
        out = translate_stream(model, tokenizer, srcs, config.decode, options, device, str(src))
        hyps = tokenizer.decode_tgt([h[0].tokens for _, h in out])
        settings = {"beam_size": options.beam_size, **asdict(config.decode)}
        settings.pop("nbest")
    result = score(hyps, refs)
    if settings:
        result["decoding"] = settings
    if as_json:
        return json.dumps(result, ensure_ascii=False)
    return (
        f"BLEU = {result['bleu']:.2f}  {result['bleu_signature']}\n"
        f"chrF = {result['chrf']:.2f}  {result['chrf_signature']}\n"
        f"{result['bleu_detail']}"
    )
