"""`tf compare`: models side by side on one test set, as a person choosing one would look at
them: parameters, BLEU and chrF at beam 5, and beam-5 and greedy sentences per second."""

from __future__ import annotations

import time
from pathlib import Path

from cli.device import pick_device
from cli.inference.decoding import hypothesis_texts
from cli.inference.engines import load_engine
from cli.inference.scoring import check_parallel, score
from data.text import read_file_lines


def run_compare(
    runs: list[str],
    src: Path,
    ref: Path,
    device_name: str,
    limit: int,
    to: str = "",
    frm: str = "",
) -> str:
    """The table, one row per run (or exported CTranslate2 directory); `to`: the output
    language of the multilingual ones (a one-way model takes its own)."""
    sources, refs = read_file_lines(src), read_file_lines(ref)
    check_parallel(src, sources, ref, refs)
    if limit:
        sources, refs = sources[:limit], refs[:limit]
    device = pick_device(device_name)
    rows = [("model", "parameters", "BLEU", "chrF", "beam-5 sent/s", "greedy sent/s")]
    for run in runs:
        speeds, scores = {}, {}
        for name, beam in (("beam5", 5), ("greedy", 1)):
            engine = load_engine(
                run, device, [f"decode.beam_size={beam}", "decode.nbest=1"], to=to, frm=frm
            )
            start = time.perf_counter()
            hyps = [h[0] for _, h in engine.stream(sources, str(src))]
            speeds[name] = len(sources) / (time.perf_counter() - start)
            if name == "beam5":
                scores = score(hypothesis_texts(engine.tokenizer, hyps), refs)
        params = engine.parameters
        rows.append(
            (
                run,
                f"{params / 1e6:.2f}M" if params else "-",
                f"{scores['bleu']:.2f}",
                f"{scores['chrf']:.2f}",
                f"{speeds['beam5']:.1f}",
                f"{speeds['greedy']:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
