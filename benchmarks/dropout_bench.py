"""Dropout's forward and backward on the CPU: torch's `F.dropout` against `tf`'s
(model/dropout.py: four 16-bit uniforms from each 64-bit draw), in bf16 and fp32, on a residual
stream of a training batch (1,024 tokens of width 1,024: NLLB-600M's at `max_tokens` 1024);
then what `tf train` gains from it (`loop`).

    python -m benchmarks.dropout_bench [--config small] [--updates 60] [--precision auto]
        [--pairs N] [--out bench-out]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import model.attention as attention
import model.dropout as masks
from benchmarks.common import OUT, corpus_head, cpu_name, print_table
from model.dropout import dropout

SHAPE = (8, 128, 1024)  # (B, T, D)
P = 0.1


def milliseconds(fn, dtype: torch.dtype, repeats: int, shape: tuple[int, ...] = SHAPE) -> float:
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    grad = torch.randn(shape, dtype=dtype)
    for _ in range(3):
        fn(x, P).backward(grad)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(x, P).backward(grad)
    return (time.perf_counter() - start) / repeats * 1000


def run(repeats: int = 20, shape: tuple[int, ...] = SHAPE) -> dict:
    """Milliseconds of forward + backward per implementation and precision, alternated."""
    results: dict = {"cpu": cpu_name(), "shape": list(shape), "p": P}
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        torch_ms, ours_ms = [], []
        for _ in range(3):  # alternated: the machine's speed drifts
            torch_ms.append(milliseconds(F.dropout, dtype, repeats, shape))
            ours_ms.append(milliseconds(dropout, dtype, repeats, shape))
        results[f"torch_{name}_ms"] = min(torch_ms)
        results[f"ours_{name}_ms"] = min(ours_ms)
        results[f"ours_over_torch_{name}"] = min(ours_ms) / min(torch_ms)
    return results


def loop(
    config_name: str = "small",
    updates: int = 60,
    pairs: int | None = None,
    dev_pairs: int | None = 40,
    out: Path = OUT,
    precision: str = "auto",
) -> dict:
    """What a user's `tf train` gains: `Trainer.update` (the update `tf train` runs) of
    `config_name` with `model.dropout` 0.1 in `precision` (auto: bf16 where native), torch's
    mask and tf's alternated update by update in this process, one model training on; target
    tokens/s of each, the first two updates left out. The learning-rate schedule stays at its
    first step (`Trainer.fit`, which advances it, is not run): it costs the same at any step."""
    from cli.config import load_config
    from cli.training.distributed import Dist
    from cli.training.run import start_run
    from cli.training.trainer import Trainer

    if updates < 4:
        raise ValueError(f"updates {updates}: two are left out, then each mask takes one: 4+")
    overrides = [
        f"data.train={corpus_head('train', pairs, out)}",
        f"data.dev={corpus_head('dev', dev_pairs, out)}",
        "model.dropout=0.1",
        f"train.precision={precision}",
    ]
    config = load_config(config_name, overrides)
    run = start_run(config, out / f"dropout-loop-{config_name}", force=True)
    trainer = Trainer(config, run, Dist(), torch.device("cpu"))
    ours = masks.dropout
    seconds, tokens = {"torch": 0.0, "tf": 0.0}, {"torch": 0, "tf": 0}
    try:
        for step in range(updates):
            name = "tf" if step % 2 else "torch"
            # What `Dropout` and the written-out attention call (the latter imported it).
            masks.dropout = attention.dropout = ours if name == "tf" else F.dropout
            batches = trainer.next_batches()
            start = time.perf_counter()
            trainer.update(batches)
            if step >= 2:
                seconds[name] += time.perf_counter() - start
                tokens[name] += sum(b.n_tgt_tokens for b in batches)
    finally:
        masks.dropout = attention.dropout = ours
        trainer.close()
    rates = {name: tokens[name] / seconds[name] for name in seconds}
    precision = "bf16" if trainer.dtype == torch.bfloat16 else "fp32"
    return {"config": config_name, "updates": updates, "precision": precision, **rates}


def print_results(r: dict) -> None:
    print(f"CPU: {r['cpu']}; shape {tuple(r['shape'])}, p {r['p']}; the fastest of 3 passes")
    rows = [("precision", "F.dropout ms", "tf's dropout ms", "time ratio")]
    for name in ("bf16", "fp32"):
        rows.append(
            (
                name,
                f"{r[f'torch_{name}_ms']:.2f}",
                f"{r[f'ours_{name}_ms']:.2f}",
                f"{r[f'ours_over_torch_{name}']:.2f}x",
            )
        )
    print_table(rows)
    if "loop" in r:
        m = r["loop"]
        print(
            f"`{m['config']}` with model.dropout 0.1, {m['precision']}, {m['updates']} updates "
            f"alternated in one process: target tokens/s {m['torch']:,.0f} with F.dropout's "
            f"masks, {m['tf']:,.0f} with tf's ({m['tf'] / m['torch']:.2f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small", help="the model trained in the loop")
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--pairs", type=int, default=None, help="training pairs (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    results = run()
    results["loop"] = loop(
        args.config, args.updates, args.pairs, out=args.out, precision=args.precision
    )
    print_results(results)
