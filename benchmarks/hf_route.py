"""The Hugging Face export as a `transformers` user loads it (`AutoTokenizer`,
`AutoModelForSeq2SeqLM`, `generate(**tokenizer(lines, return_tensors="pt", padding=True))`,
nothing else) against `tf translate --greedy` in fp32, on the first lines of the test set:
how many translations are the same, and the lines that differ.

    python -m benchmarks.hf_route RUN [--lines 100]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT

TEST = ROOT / "data" / "corpora" / "bible-es-en" / "test.es"


def tf(*args, stdin: str = "") -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *map(str, args)],
        cwd=ROOT, input=stdin, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def drop_in(directory: Path, lines: list[str], batch: int = 16) -> list[str]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSeq2SeqLM.from_pretrained(directory)
    out = []
    for i in range(0, len(lines), batch):
        inputs = tokenizer(lines[i : i + batch], return_tensors="pt", padding=True)
        out += tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--lines", type=int, default=100)
    args = parser.parse_args()
    lines = TEST.read_text(encoding="utf-8").splitlines()[: args.lines]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "hf"
        tf("export", args.run, "--to", "huggingface", "-o", directory)
        theirs = drop_in(directory, lines)
    ours = tf("translate", args.run, "--greedy", "--set", "decode.precision=fp32",
              stdin="".join(line + "\n" for line in lines)).splitlines()  # fmt: skip
    same = sum(a == b for a, b in zip(theirs, ours))
    print(f"{same} of {len(lines)} lines: the export's generate() == tf translate --greedy")
    for n, (a, b) in enumerate(zip(theirs, ours), start=1):
        if a != b:
            print(f"line {n}:\n  transformers: {a}\n  tf:           {b}")


if __name__ == "__main__":
    main()
