"""What LoRA costs in quality against full fine-tuning on the bundled corpus (issue 58).

As docs/recipes.md's fine-tuning table: a `tf` model pretrained on half the bundled pairs (the
odd verses, `configs/backtranslate.yaml`, 2,000 updates: `benchmarks.backtranslation`'s run A),
then fine-tuned on the other half (the even verses) with `configs/finetune.yaml` as launched,
each run for the same number of updates:

    full      every weight trains (lr 5e-4, the rate that table found for this small model)
    lora-R    LoRA rank R on q, k, v, o, the base frozen (lr 2e-3: adapters start at zero and
              take a larger rate, as peft's and the LoRA paper's recipes do)

Each fine-tuned run is scored with `tf eval` (the recipe's beam 4) on the bundled dev and test
sets; wall seconds and the peak resident memory of its `tf train` process are recorded beside.
Results: bench-out/lora-quality/results.json; a second invocation keeps what the first made.

    python -m benchmarks.lora_quality [--updates 600] [--ranks 8,32]
        [--pretrain-steps 2000] [--lines N] [--out bench-out]

`--lines N` scores the first N lines of each set only (a test's tiny run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import backtranslation
from benchmarks.backtranslation import BUNDLED
from benchmarks.common import OUT, ROOT, cpu_name, print_table

FINETUNE = ROOT / "configs" / "finetune.yaml"
PRETRAIN_STEPS = 2000


def timed_tf(*args: str) -> tuple[float, float]:
    """Run `tf ARGS` as a user does; its seconds and its peak resident memory in GB."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "cli.main", *map(str, args)], cwd=ROOT)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"tf {args[0]} failed with exit {child.returncode}")
    return time.perf_counter() - started, usage.ru_maxrss / 1e6  # ru_maxrss is in KB on Linux


def run(
    updates: int = 600,
    ranks: tuple[int, ...] = (8, 32),
    out: Path = OUT,
    pretrain_steps: int = PRETRAIN_STEPS,
    lines: int = 0,
) -> dict:
    # benchmarks.backtranslation's folder for this budget (its run A), under `out`
    halves = out / backtranslation.results_dir(pretrain_steps, ()).name
    backtranslation.split(halves)
    pretrained = halves / "forward-A"
    backtranslation.train(pretrained, pretrain_steps, (), f"data.train={halves / 'half-a'}")
    home = out / "lora-quality"
    home.mkdir(parents=True, exist_ok=True)
    saved = home / "results.json"
    results: dict = json.loads(saved.read_text()) if saved.is_file() else {}
    results.update(cpu=cpu_name(), updates=updates, pretrained=str(pretrained))
    results.setdefault("runs", {})
    scored = {split: scored_lines(split, lines, home) for split in ("dev", "test")}
    if "pretrained" not in results["runs"]:
        results["runs"]["pretrained"] = scores(pretrained, scored)
    runs = {"full": ["train.lr=5e-4"]}
    runs |= {f"lora-{r}": ["train.lr=2e-3", f"train.lora.rank={r}"] for r in ranks}
    for name, sets in runs.items():
        if name in results["runs"]:
            continue
        run_dir = home / name
        budget = [f"train.max_steps={updates}", "train.max_time=0", "train.eval_every=0"]
        budget += ["train.eval_on_start=false", f"data.train={halves / 'half-b'}"]
        seconds, rss = timed_tf(
            "train", FINETUNE, "--init", pretrained, "--out", run_dir, "--force",
            *[a for s in [*budget, *sets] for a in ("--set", s)],
        )  # fmt: skip
        checkpoint = run_dir / "checkpoints" / "last.pt"
        results["runs"][name] = {
            **scores(run_dir, scored),
            "train_seconds": seconds,
            "peak_rss_gb": rss,
            "checkpoint_mb": checkpoint.stat().st_size / 1e6,
        }
        saved.write_text(json.dumps(results, indent=1))
    saved.write_text(json.dumps(results, indent=1))
    return results


def scored_lines(split: str, lines: int, home: Path) -> tuple[Path, Path]:
    """The bundled `split`'s source and reference files, or copies of their first `lines`."""
    src, ref = BUNDLED / f"{split}.es", BUNDLED / f"{split}.en"
    if not lines:
        return src, ref
    copies = []
    for path in (src, ref):
        copy = home / f"{split}-{lines}{path.suffix}"
        with path.open(encoding="utf-8") as f:
            copy.write_text("".join(f.readline() for _ in range(lines)), encoding="utf-8")
        copies.append(copy)
    return copies[0], copies[1]


def scores(run_dir: Path, sets: dict[str, tuple[Path, Path]]) -> dict:
    dev, test = (backtranslation.evaluate_files(run_dir, *sets[split]) for split in ("dev", "test"))
    return {
        "dev_bleu": dev["bleu"],
        "dev_chrf": dev["chrf"],
        "test_bleu": test["bleu"],
        "test_chrf": test["chrf"],
        "bleu_signature": test["bleu_signature"],
    }


def print_results(results: dict) -> None:
    print(f"{results['cpu']}; {results['updates']} fine-tuning updates on the even verses")
    rows = [("run", "dev BLEU", "dev chrF", "test BLEU", "test chrF", "s", "peak RSS GB", "MB")]
    for name, r in results["runs"].items():
        scores = [f"{r[k]:.2f}" for k in ("dev_bleu", "dev_chrf", "test_bleu", "test_chrf")]
        cost = [f"{r[k]:{f}}" if k in r else "-" for k, f in TRAINING_COSTS]
        rows.append((name, *scores, *cost))
    print_table(rows)


TRAINING_COSTS = (("train_seconds", ".0f"), ("peak_rss_gb", ".2f"), ("checkpoint_mb", ".1f"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=600)
    parser.add_argument("--ranks", default="8,32")
    parser.add_argument("--pretrain-steps", type=int, default=PRETRAIN_STEPS)
    parser.add_argument("--lines", type=int, default=0, help="score the first N lines only")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(sys.argv[1:])
    ranks = tuple(int(r) for r in args.ranks.split(","))
    print_results(run(args.updates, ranks, args.out, args.pretrain_steps, args.lines))
