"""What terminology constraints and ensembles cost and buy (issue: what translators ask for).

Constraints: the first 200 sentences of the bundled test set, each with one term taken from
its reference: the longest word of 4 letters or more that is not a function word (the first
such, on a tie), and on every other sentence that word with the word after it (a two-word
phrase). Translated at beam 5 through `tf translate --input-format jsonl` as launched, with
and without the constraints: the share of outputs that hold their term, BLEU and chrF on those
200, and sentences/s of each (the whole command, the model's loading included, timed).
`--beams 1 4 8` measures the same at each of those beams instead: what beam constrained search
needs to work well (the table in docs/recipes.md, "Constraints and ensembles").

Ensembles (with `--seeds`): the whole test set at beam 5 through `tf eval`, each model alone
and together: a run's last two saved checkpoints, and two runs that differ only in their seed.

    python -m benchmarks.control_bench --run RUN --seeds RUN_A RUN_B
    python -m benchmarks.control_bench --run RUN --beams 1 4 8 [--sentences 200]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, print_table
from cli.inference.scoring import score

TEST = ROOT / "data" / "corpora" / "bible-es-en" / "test"
FUNCTION_WORDS = set(
    "about above after again against also among because been before being below between "
    "both could does doing down during each from further have having here into itself "
    "just more most other over same shall should some such than that their theirs them "
    "then there these they this those through under until upon very were what when where "
    "which while whom will with would your yours unto thee thou thy hath".split()
)


def term(reference: str, phrase: bool) -> str:
    """The reference's longest content word (4 letters or more), or it and the next word."""
    words = re.findall(r"[A-Za-z]+(?:'[a-z]+)?", reference)
    content = [
        (len(w), -i) for i, w in enumerate(words) if len(w) >= 4 and w.lower() not in FUNCTION_WORDS
    ]
    if not content:
        return ""
    _, i = max(content)
    i = -i
    if phrase and i + 1 < len(words):
        return f"{words[i]} {words[i + 1]}"
    return words[i]


def tf(*args, input_path: Path | None = None) -> tuple[str, float]:
    started = time.perf_counter()
    with open(input_path, "rb") if input_path else open("/dev/null", "rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", *map(str, args)],
            cwd=ROOT,
            stdin=stdin,
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stdout, time.perf_counter() - started


def scores(hyp: Path, ref: Path) -> dict:
    """`tf eval --hyp HYP --ref REF`'s scores, computed here (no process of its own to start)."""
    lines = [path.read_text(encoding="utf-8").splitlines() for path in (hyp, ref)]
    return score(*lines)


def constraints(run: str, out: Path, n: int = 200, beam: int = 5) -> dict:
    """Hit rate, BLEU, chrF and sentences/s of the first `n` test sentences at `beam`, without
    and with their terms as constraints (see the module docstring); files under `out`."""
    src = TEST.with_suffix(".es").read_text(encoding="utf-8").splitlines()[:n]
    ref = TEST.with_suffix(".en").read_text(encoding="utf-8").splitlines()[:n]
    terms = [term(r, phrase=i % 2 == 1) for i, r in enumerate(ref)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "ref.en").write_text("".join(r + "\n" for r in ref), encoding="utf-8")
    plain = out / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": s}) + "\n" for s in src), encoding="utf-8")
    asked = out / "constrained.jsonl"
    asked.write_text(
        "".join(
            json.dumps({"text": s, "constraints": [t] if t else []}, ensure_ascii=False) + "\n"
            for s, t in zip(src, terms)
        ),
        encoding="utf-8",
    )
    results = {"sentences": n, "terms": sum(1 for t in terms if t)}
    for name, path in (("without", plain), ("with", asked)):
        hyps, seconds = tf(
            "translate", run, "--input-format", "jsonl", "--beam", str(beam), input_path=path
        )
        (out / f"{name}.en").write_text(hyps, encoding="utf-8")
        lines = hyps.splitlines()
        held = sum(1 for h, t in zip(lines, terms) if t and t in h)
        s = scores(out / f"{name}.en", out / "ref.en")
        results[name] = {
            "terms_held": held / results["terms"],
            "bleu": s["bleu"],
            "chrf": s["chrf"],
            "sentences_per_s": n / seconds,
        }
    return results


def ensembles(groups: dict[str, list[str]], limit: int = 0) -> dict:
    """Each group of runs (one, or an ensemble) scored on the test set (its first `limit`
    lines; 0: all) at beam 5 through `tf eval`, timed end to end."""
    src, ref = TEST.with_suffix(".es"), TEST.with_suffix(".en")
    results = {}
    for name, runs in groups.items():
        args = ["--src", src, "--ref", ref, "--beam", "5", "--json", "--limit", str(limit)]
        out, seconds = tf("eval", *runs, *args)
        s = json.loads(out)
        results[name] = {
            "bleu": s["bleu"],
            "chrf": s["chrf"],
            "sentences_per_s": s["sentences"] / seconds,
        }
    return results


def constraint_beams(run: str, out: Path, beams=(1, 4, 8), n: int = 200) -> dict:
    """`constraints` at each of `beams`: {"sentences", "terms", "beams": {beam: its results}}."""
    per_beam = {str(b): constraints(run, out / f"beam{b}", n, beam=b) for b in beams}
    counts = {key: next(iter(per_beam.values()))[key] for key in ("sentences", "terms")}
    for r in per_beam.values():
        del r["sentences"], r["terms"]
    return {**counts, "beams": per_beam}


def print_constraint_table(results: dict) -> None:
    """One row per beam and search: terms held, BLEU, chrF, sentences/s."""
    n = results["sentences"]
    rows = [(f"constraints ({n} test lines)", "terms held", "BLEU", "chrF", "sent/s")]
    for beam, r in results["beams"].items():
        for name in ("without", "with"):
            rows.append((f"beam {beam}, {name}", *_cells(r[name])))
    print_table(rows)


def _cells(r: dict) -> tuple[str, ...]:
    return (
        f"{r['terms_held']:.1%}",
        f"{r['bleu']:.2f}",
        f"{r['chrf']:.2f}",
        f"{r['sentences_per_s']:.1f}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a trained run (its last two step_N.pt)")
    parser.add_argument("--seeds", nargs=2, help="two runs of another seed each (ensembles)")
    parser.add_argument("--beams", type=int, nargs="+", help="constraints at each of these beams")
    parser.add_argument("--sentences", type=int, default=200, help="test lines constrained")
    args = parser.parse_args()
    if args.beams:
        per_beam = constraint_beams(args.run, OUT / "constraint-beams", args.beams, args.sentences)
        results, name = {"constraint_beams": per_beam}, "control-beams.json"
        print_constraint_table(per_beam)
    else:  # the first table: beam 5
        c = constraints(args.run, OUT / "constraints", args.sentences)
        results, name = {"constraints": c}, "control.json"
        print_constraint_table({"sentences": c["sentences"], "beams": {"5": c}})
    if args.seeds:
        results["ensembles"] = ensembles(ensemble_groups(args.run, args.seeds))
        print_ensemble_table(results["ensembles"])
    (OUT / name).write_text(json.dumps(results, indent=1))


def ensemble_groups(run: str, seeds: list[str]) -> dict[str, list[str]]:
    """A run's last two saved checkpoints and two seed runs, each alone and as an ensemble."""
    saved = sorted(Path(run, "checkpoints").glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
    last_two = saved[-2:]
    a, b = seeds
    return {
        f"checkpoint {last_two[0].stem}": [str(last_two[0])],
        f"checkpoint {last_two[1].stem}": [str(last_two[1])],
        "ensemble of the two checkpoints": [str(p) for p in last_two],
        f"seed run {a}": [a],
        f"seed run {b}": [b],
        "ensemble of the two seeds": [a, b],
    }


def print_ensemble_table(results: dict) -> None:
    rows = [("ensembles (1,000 test lines, beam 5)", "BLEU", "chrF", "sent/s")]
    for name, r in results.items():
        rows.append((name, f"{r['bleu']:.2f}", f"{r['chrf']:.2f}", f"{r['sentences_per_s']:.1f}"))
    print_table(rows)


if __name__ == "__main__":
    main()
