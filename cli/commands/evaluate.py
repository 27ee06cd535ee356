"""`tf eval`: corpus BLEU (13a tokenisation) and chrF through sacrebleu, with their signatures."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cli.device import pick_device
from cli.inference.decoding import hypothesis_texts
from cli.inference.engines import Engine, load_engine
from cli.inference.scoring import check_parallel, score
from data.config import direction_name
from data.errors import InputError
from data.text import check_readable, read_file_lines


def check_hyp_alone(given: dict[str, bool]) -> None:
    """`--hyp` scores a file: no model translates, so an option that chooses the model or how
    it translates (`given`: option -> whether it was given) would be ignored without a word.

    Raises:
        InputError: naming the options given.
    """
    named = [option for option, present in given.items() if present]
    if named:
        raise InputError(
            f"--hyp scores a file without a model: {', '.join(named)} only apply to "
            "translating (tf eval RUN --src SRC); give --hyp and --ref alone"
        )


def run_eval(
    run: str | list[str] | None,
    src: Path | None,
    ref: Path,
    hyp: Path | None,
    overrides: list[str],
    device_name: str,
    limit: int,
    as_json: bool,
    int8: bool = False,
    to: str = "",
    frm: str = "",
) -> str:
    """Translate `src` with the run's model (or read `hyp`) and score it against `ref`; each may
    be a pipe (`--ref <(cmd)`), read once."""
    for path in (ref, hyp if hyp is not None else src):
        if path is not None:
            check_readable(path)  # all of them, before a pipe is consumed
    refs = read_file_lines(ref)
    made: dict[str, Any] = {}  # what made the translations scored, when tf made them
    if hyp is not None:
        hyps = read_file_lines(hyp)
        check_parallel(hyp, hyps, ref, refs)
        if limit:
            hyps, refs = hyps[:limit], refs[:limit]
    else:
        if not run or src is None:
            raise InputError("tf eval needs RUN and --src, or --hyp")
        srcs = read_file_lines(src)
        check_parallel(src, srcs, ref, refs)
        engine = load_engine(run, pick_device(device_name), overrides, int8, to, frm)
        if limit:
            srcs, refs = srcs[:limit], refs[:limit]
        out = engine.stream(srcs, str(src))
        hyps = hypothesis_texts(engine.tokenizer, [h[0] for _, h in out])
        made = made_by(engine)
    result = score(hyps, refs) | made
    if as_json:
        return json.dumps(result, ensure_ascii=False)
    return (
        f"BLEU = {result['bleu']:.2f}  {result['bleu_signature']}\n"
        f"chrF = {result['chrf']:.2f}  {result['chrf_signature']}\n"
        f"{result['bleu_detail']}"
    )


def made_by(engine: Engine) -> dict[str, Any]:
    """What the scores record of the translations: the decode settings and the direction (a
    multilingual run's --to, or its recorded default; none where each line names its own
    language)."""
    decoding = asdict(engine.config.decode)
    decoding.pop("nbest")
    made: dict[str, Any] = {"decoding": decoding}
    if engine.output_language:
        made["direction"] = direction_name(engine.direction("tf eval"))
    return made
