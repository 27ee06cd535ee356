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


def run(updates: int = 600, ranks: tuple[int, ...] = (8, 32), out: Path = OUT) -> dict:
    halves = backtranslation.results_dir(PRETRAIN_STEPS, ())
    backtranslation.split(halves)
    pretrained = halves / "forward-A"
    backtranslation.train(pretrained, PRETRAIN_STEPS, (), f"data.train={halves / 'half-a'}")
    home = out / "lora-quality"
    home.mkdir(parents=True, exist_ok=True)
    saved = home / "results.json"
    results: dict = json.loads(saved.read_text()) if saved.is_file() else {}
    results.update(cpu=cpu_name(), updates=updates, pretrained=str(pretrained))
    results.setdefault("runs", {})
    if "pretrained" not in results["runs"]:
        results["runs"]["pretrained"] = scores(pretrained)
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
            **scores(run_dir),
            "train_seconds": seconds,
            "peak_rss_gb": rss,
            "checkpoint_mb": checkpoint.stat().st_size / 1e6,
        }
        saved.write_text(json.dumps(results, indent=1))
    saved.write_text(json.dumps(results, indent=1))
    return results


def scores(run_dir: Path) -> dict:
    dev, test = (backtranslation.evaluate(run_dir, split) for split in ("dev", "test"))
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
    args = parser.parse_args(sys.argv[1:])
    print_results(run(args.updates, tuple(int(r) for r in args.ranks.split(","))))
