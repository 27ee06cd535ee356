"""What back-translation buys on the bundled corpus (issue: back-translation).

The training pairs are split in two by verse number: half A (odd verses) keeps its pairs,
half B (even verses) only its English, the monolingual text. Every run below is `tf train` as
launched, on the same recipe (`configs/backtranslate.yaml`, that of `make backtranslate`) for
the same number of updates, 2,000 by default (not the same seconds: this machine is shared, and
an update budget keeps the runs comparable under load):

    reverse   en->es on A                 (translates B's English)
    A         es->en on A alone
    beam      A + B back-translated with beam 5, tagged <bt>
    sampled   A + B back-translated by sampling (top-k 10), tagged <bt>
    untagged  A + B sampled, untagged
    ceiling   A + B with its real Spanish
    beam-w2   as beam, with A's weight 2 (its pairs seen twice as often: fairseq's
              --upsample-primary)

The back-translations run through CTranslate2 in int8 (the fastest engine here) when it is
installed, else through the reverse run in PyTorch; both are timed. Each forward run is scored
once on the test set, and on the dev set, where choices are made (beam and length penalty as the
recipe). Each back-translation is also scored against B's real Spanish: how good the synthetic
sources are. Results: bench-out/bt-steps2000/results.json, a folder for each budget and recipe
(--set KEY=VALUE, on every run, the reverse one included); a second invocation keeps what the
first made.

    python -m benchmarks.backtranslation split DIR      # the halves only (make backtranslate)
    python -m benchmarks.backtranslation run [--steps N] [--runs A,beam,...] [--seed N]
                                             [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, print_table

BUNDLED = ROOT / "data" / "corpora" / "bible-es-en"
RECIPE = ROOT / "configs" / "backtranslate.yaml"


def split(out: Path) -> None:
    """OUT/half-a.{es,en} (odd verses) and OUT/half-b.{es,en} (even verses) of the bundled
    training pairs; half-b.en is the monolingual text, half-b.es the ceiling's real sources."""

    def read(name: str) -> list[str]:
        with gzip.open(BUNDLED / name, "rt", encoding="utf-8") as f:
            return f.read().splitlines()

    ids, es, en = read("train.ids.gz"), read("train.es.gz"), read("train.en.gz")
    odd = [int(verse.rsplit(".", 1)[1]) % 2 == 1 for verse in ids]
    out.mkdir(parents=True, exist_ok=True)
    for half, keep in (("a", True), ("b", False)):
        for lang, lines in (("es", es), ("en", en)):
            text = "".join(line + "\n" for line, o in zip(lines, odd) if o == keep)
            partial = out / f".half-{half}.{lang}.partial"
            partial.write_text(text, encoding="utf-8")
            partial.rename(out / f"half-{half}.{lang}")  # half-b.en last: there means whole


def tf(*args: str) -> float:
    """Run `tf ARGS` as a user does; its seconds."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], check=True, cwd=ROOT)
    return time.perf_counter() - started


def train(out: Path, steps: int, recipe: tuple[str, ...], *sets: str) -> None:
    if (out / "checkpoints" / "last.pt").is_file():
        return  # done in an earlier invocation
    budget = ["train.max_time=0", f"train.max_steps={steps}", "train.save_every=0", *recipe]
    tf(
        "train",
        RECIPE,
        "--out",
        out,
        "--force",
        *[a for s in [*budget, *sets] for a in ("--set", s)],
    )


def corpora(*entries: str) -> str:
    return f"data.train=[{', '.join(entries)}]"


def results_dir(steps: int, recipe: tuple[str, ...]) -> Path:
    """A folder for each budget and recipe: bench-out/bt-steps2000, ...-model.dropout=0."""
    return OUT / "-".join([f"bt-steps{steps}", *(s.replace("/", "_") for s in recipe)])


def run(
    steps: int,
    names: list[str] | None = None,
    seed: int | None = None,
    recipe: tuple[str, ...] = (),
) -> dict:
    """Train and score the forward runs `names` (all when None), and what they need; results
    of earlier invocations in OUT/results.json are kept. With `seed`, the forward runs train
    with that `train.seed` (the reverse model and the back-translations stay the same): runs
    NAME-seedN, for the spread between seeds. `recipe`: overrides of every run's recipe."""
    out = results_dir(steps, recipe)
    split(out)
    saved = out / "results.json"
    results: dict = json.loads(saved.read_text()) if saved.is_file() else {}
    results = {"backtranslation": {}, "runs": {}, **results, "steps": steps, "recipe": list(recipe)}
    reverse = out / "reverse"
    swapped = ["data.src_lang=en", "data.tgt_lang=es"]
    train(reverse, steps, recipe, f"data.train={out / 'half-a'}", *swapped)
    engine = str(reverse)
    try:
        import ctranslate2  # noqa: F401

        engine = str(out / "reverse-ct2-int8")
        if not Path(engine, "model.bin").is_file():
            tf("export", reverse, "--to", "ctranslate2", "--quantization", "int8", "-o", engine)
    except ImportError:
        pass
    a = f'{{corpus: "{out / "half-a"}"}}'
    forward = {
        "A": [f"data.train={out / 'half-a'}"],
        "beam": [corpora(a, f'{{corpus: "{out / "bt-beam" / "train"}", tag: "<bt>"}}')],
        "sampled": [corpora(a, f'{{corpus: "{out / "bt-sampled" / "train"}", tag: "<bt>"}}')],
        "untagged": [corpora(a, f'{{corpus: "{out / "bt-sampled" / "train"}"}}')],
        "ceiling": [corpora(a, f'{{corpus: "{out / "half-b"}"}}')],
        "beam-w2": [
            corpora(
                f'{{corpus: "{out / "half-a"}", weight: 2}}',
                f'{{corpus: "{out / "bt-beam" / "train"}", tag: "<bt>"}}',
            )
        ],
    }
    names = names or list(forward)
    unknown = set(names) - set(forward)
    if unknown:
        raise SystemExit(f"unknown runs {sorted(unknown)}; known: {', '.join(forward)}")
    searches = {
        "beam": ["--beam", "5"],
        "sampled": ["--greedy", "--set", "decode.sampling_topk=10"],
    }
    for name, search in searches.items():
        if not any(f"bt-{name}" in " ".join(forward[run]) for run in names):
            continue
        synthetic = out / f"bt-{name}"
        if (synthetic / "backtranslate.json").is_file() and name in results["backtranslation"]:
            continue  # made (and timed) by an earlier invocation
        seconds = tf("backtranslate", engine, out / "half-b.en", "--out", synthetic, *search)
        lines = sum(1 for _ in open(out / "half-b.en", encoding="utf-8"))
        results["backtranslation"][name] = {
            "engine": "ctranslate2 int8" if "ct2" in engine else "pytorch",
            "seconds": seconds,
            "lines_per_s": lines / seconds,
            **quality(synthetic / "train.es", out / "half-b.es"),
        }
    for base in names:
        name = base if seed is None else f"{base}-seed{seed}"
        run_dir = out / f"forward-{name}"
        seeded = [] if seed is None else [f"train.seed={seed}"]
        train(run_dir, steps, recipe, *forward[base], *seeded)
        if "dev_bleu" in results["runs"].get(name, {}):
            continue  # scored by an earlier invocation
        dev, test = evaluate(run_dir, "dev"), evaluate(run_dir, "test")
        data = json.loads((run_dir / "data.json").read_text())
        results["runs"][name] = {
            "bleu": test["bleu"],
            "chrf": test["chrf"],
            "bleu_signature": test["bleu_signature"],
            "dev_bleu": dev["bleu"],  # what choices are made on
            "dev_chrf": dev["chrf"],
            "kept_pairs": [c["kept"] for c in data["corpora"]],
        }
        saved.write_text(json.dumps(results, indent=1))
    return results


def quality(synthetic: Path, real: Path) -> dict:
    """BLEU and chrF of the synthetic Spanish against B's real Spanish."""
    import sacrebleu

    hyps, refs = (p.read_text(encoding="utf-8").splitlines() for p in (synthetic, real))
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    return {"bleu_vs_real": bleu, "chrf_vs_real": sacrebleu.corpus_chrf(hyps, [refs]).score}


def evaluate(run_dir: Path, split: str) -> dict:
    """`tf eval RUN` on the bundled `split` (the recipe's beam and length penalty)."""
    return evaluate_files(run_dir, BUNDLED / f"{split}.es", BUNDLED / f"{split}.en")


def evaluate_files(run_dir: Path, src: Path, ref: Path) -> dict:
    """`tf eval RUN --src SRC --ref REF --json`, as a user runs it."""
    command = [sys.executable, "-m", "cli.main", "eval", str(run_dir), "--json"]
    command += ["--src", str(src), "--ref", str(ref)]
    done = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    return json.loads(done.stdout)


def print_results(results: dict) -> None:
    rows = [("run", "dev BLEU", "test BLEU", "test chrF", "pairs kept per corpus")]
    for name, r in results["runs"].items():
        dev = f"{r['dev_bleu']:.2f}" if "dev_bleu" in r else "-"
        scores = (dev, f"{r['bleu']:.2f}", f"{r['chrf']:.2f}")
        rows.append((name, *scores, str(r["kept_pairs"])))
    print_table(rows)
    for name, r in results["backtranslation"].items():
        speed = f"{r['seconds']:.0f} s, {r['lines_per_s']:.0f} lines/s"
        real = f"BLEU {r['bleu_vs_real']:.2f} against the real Spanish"
        print(f"back-translation {name}: {speed}, {r['engine']}, {real}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("split").add_argument("out", type=Path)
    measure = sub.add_parser("run")
    measure.add_argument("--steps", type=int, default=2000)
    measure.add_argument("--runs", help="comma-separated forward runs (default: all)")
    measure.add_argument("--seed", type=int, help="train.seed of the forward runs")
    measure.add_argument(
        "--set", action="append", default=[], dest="recipe", help="KEY=VALUE on every run"
    )
    args = parser.parse_args()
    if args.command == "split":
        split(args.out)
    else:
        names = args.runs.split(",") if args.runs else None
        print_results(run(args.steps, names, args.seed, tuple(args.recipe)))


if __name__ == "__main__":
    main()
