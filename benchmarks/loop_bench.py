"""The training loop users run: `tf train` launched as from the command line, against the
torch.nn.Transformer fp32 reference step timed in the same process just before and after it.

`train_bench` times one isolated step; this times what a user waits for: a few hundred
updates of `tf train CONFIG` (batches streamed from the encoded corpus, the update with its
collective and host sync, logging; validation and checkpoints off), read from the run's own
metrics.jsonl (`tokens_per_s` of each log window, the first one left out as warm-up).

    python -m benchmarks.loop_bench [--config small] [--updates 150]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import torch

from benchmarks.common import OUT, ROOT, corpus_batches, corpus_spec, print_table
from benchmarks.train_bench import build, time_pass
from cli.config import load_config
from cli.device import configure_device


def tf_train_loop(config_name: str, updates: int, precision: str, *sets: str) -> float:
    """Mean target tokens/s of the log windows of a `tf train` run, the first one excluded."""
    out = OUT / f"loop-{config_name}-{precision}"
    overrides = [
        f"data.train={corpus_spec('train')}",
        f"data.dev={corpus_spec('dev')}",
        f"train.max_steps={updates}",
        f"train.precision={precision}",
        "train.eval_every=0",
        "train.eval_bleu_sentences=10",  # the one validation at the end: kept short
        "train.save_every=0",
        "train.log_every=25",
        *sets,
    ]
    command = [sys.executable, "-m", "cli.main", "train", f"configs/{config_name}.yaml"]
    command += ["--out", str(out), "--force"] + [a for s in overrides for a in ("--set", s)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    windows = [
        record["tokens_per_s"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "tokens_per_s" in (record := json.loads(line))
    ]
    return statistics.mean(windows[1:])


def run(config_name: str = "small", updates: int = 150, precisions=("fp32", "bf16")) -> dict:
    cpu = torch.device("cpu")
    configure_device(cpu)
    config = load_config(config_name)
    tokenizer, batches = corpus_batches(config, 6)
    tokens = sum(b.n_tgt_tokens for b in batches)
    reference = build("reference", config, tokenizer, cpu)
    time_pass(reference, batches[:2], None, cpu)  # warm-up
    results: dict = {"config": config_name, "updates": updates}
    for precision in precisions:
        before = time_pass(reference, batches, None, cpu)
        loop = tf_train_loop(config_name, updates, precision)
        after = time_pass(reference, batches, None, cpu)
        ref = tokens / ((before + after) / 2)
        results[f"tf_loop_{precision}_tokens_per_s"] = loop
        results[f"reference_fp32_around_{precision}_tokens_per_s"] = ref
        results[f"tf_loop_{precision}_vs_reference_fp32"] = loop / ref
    return results


def print_results(r: dict) -> None:
    rows = [("`tf train` loop", "target tokens/s", "reference fp32 (same run)", "ratio")]
    for precision in ("fp32", "bf16"):
        if f"tf_loop_{precision}_tokens_per_s" in r:
            rows.append(
                (
                    f"{r['config']} {precision}, {r['updates']} updates",
                    f"{r[f'tf_loop_{precision}_tokens_per_s']:,.0f}",
                    f"{r[f'reference_fp32_around_{precision}_tokens_per_s']:,.0f}",
                    f"{r[f'tf_loop_{precision}_vs_reference_fp32']:.2f}x",
                )
            )
    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--updates", type=int, default=150)
    args = parser.parse_args()
    print_results(run(args.config, args.updates))
