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
from pathlib import Path

import torch

from benchmarks.common import (
    OUT,
    corpus_batches,
    corpus_head,
    print_table,
    run_python,
)
from benchmarks.train_bench import build, time_pass
from cli.config import load_config
from cli.device import configure_device


def tf_train_loop(
    config_name: str,
    updates: int,
    precision: str,
    train_spec: str,
    dev_spec: str,
    out: Path = OUT,
    log_every: int = 25,
) -> float:
    """Mean target tokens/s of the log windows of a `tf train` run, the first one excluded."""
    run_dir = out / f"loop-{config_name}-{precision}"
    overrides = [
        f"data.train={train_spec}",
        f"data.dev={dev_spec}",
        f"train.max_steps={updates}",
        f"train.precision={precision}",
        "train.eval_every=0",
        "train.eval_bleu_sentences=10",  # the one validation at the end: kept short
        "train.save_every=0",
        f"train.log_every={log_every}",
    ]
    sets = [a for s in overrides for a in ("--set", s)]
    command = ["-m", "cli.main", "train", f"configs/{config_name}.yaml", "--out", str(run_dir)]
    run_python(*command, "--force", *sets)
    windows = [
        record["tokens_per_s"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "tokens_per_s" in (record := json.loads(line))
    ]
    return statistics.mean(windows[1:])


def run(
    config_name: str = "small",
    updates: int = 150,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    pairs: int | None = None,
    out: Path = OUT,
    log_every: int = 25,
    dev_pairs: int | None = None,
) -> dict:
    """`tf train` tokens/s per precision, each between two timings of the reference step; on
    the corpus (or its first `pairs` pairs; validated once at the end on the first `dev_pairs`
    of dev), runs and tokenizer in `out`. Set `log_every` to leave at least two log windows in
    `updates` (the first is warm-up)."""
    cpu = torch.device("cpu")
    configure_device(cpu)
    config = load_config(config_name)
    tokenizer, batches = corpus_batches(config, 6, pairs=pairs, out=out)
    tokens = sum(b.n_tgt_tokens for b in batches)
    reference = build("reference", config, tokenizer, cpu)
    time_pass(reference, batches[:2], None, cpu)  # warm-up
    train_spec, dev_spec = corpus_head("train", pairs, out), corpus_head("dev", dev_pairs, out)
    results: dict = {"config": config_name, "updates": updates}
    for precision in precisions:
        before = time_pass(reference, batches, None, cpu)
        loop = tf_train_loop(config_name, updates, precision, train_spec, dev_spec, out, log_every)
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
