"""`tf backtranslate`: synthetic parallel data from monolingual target-language text
(Sennrich et al., 2016), made by a reverse model.

RUN translates the other way (for an es->en system, an en->es run); MONO is text in RUN's
source language. The corpus is OUT/train.SRC (MONO's lines, RUN's source) and OUT/train.TGT
(their translations), with OUT/backtranslate.json recording what made it: read as the forward
system's corpus, the translations are its sources and the real text its targets. Train on it
beside the parallel data, tagged (Caswell et al., 2019):

    data:
      train:
        - corpus: parallel
        - corpus: OUT/train
          tag: "<bt>"

Sampled translations (`--set decode.sampling_topk=10 --greedy`: one sample from the 10 most
probable tokens at each step) teach more than beam search's (Edunov et al., 2018). Resumable as
`cli.inference.bulk` says.
"""

from __future__ import annotations

from pathlib import Path

from cli.device import pick_device
from cli.inference.bulk import translate_corpus
from cli.inference.engines import load_engine
from data.errors import InputError
from data.files import check_dir
from data.text import read_file_lines


def run_backtranslate(
    run: str,
    mono: Path,
    out: Path,
    overrides: list[str],
    device_name: str,
    to: str = "",
    frm: str = "",
) -> str:
    """Translate MONO with the reverse model RUN (a multilingual one's into `to`) into OUT (see
    the module docstring)."""
    check_dir(out, "--out")
    lines = [" ".join(line.split()) for line in read_file_lines(mono)]
    if not any(lines):  # else "0 pairs" now, and a corpus that training refuses later
        raise InputError(f"{mono}: no text to back-translate (empty, or blank lines only)")
    device = pick_device(device_name)
    engine = load_engine(run, device, overrides, to=to, frm=frm)
    extra = {"monolingual": str(mono)}  # for the reader: the sources' digest identifies them
    return translate_corpus(engine, run, device, lines, out, "backtranslate", extra)
