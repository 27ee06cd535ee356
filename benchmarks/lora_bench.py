"""LoRA against full fine-tuning at NLLB-200's size, and `tf`'s LoRA against `peft`'s (issue 58).

The model: a stand-in of facebook/nllb-200-distilled-600M (`benchmarks.fairseq_standin`: d_model
1024, 12+12 layers, 16 heads, FFN 4,096, 256,206 rows over a tokenizer of the published
256,204 ids; transformers' own random initialisation), imported with `tf import`. The same
batches of the bundled corpus (spa_Latn -> eng_Latn, `configs/finetune.yaml`'s recipe at a
smaller token budget), the same precision, each loop in a process of its own:

- tf, full: `tf train configs/finetune.yaml --init RUN` as launched, every weight trained;
- tf, LoRA: the same with `train.lora.rank=16` on the attention projections (q, k, v, o);
- transformers + peft, LoRA: `M2M100ForConditionalGeneration`, `peft.get_peft_model` with the
  same rank, alpha and layers (q_proj, k_proj, v_proj, out_proj), AdamW over the adapters,
  `model(**batch).loss` on tf's batches (`benchmarks.finetune_bench`).

Reported: target tokens/s (the first log window left out), peak resident memory, and the size
of the checkpoint each tf run writes. Then the two LoRA updates paired: in one process, on each
batch in turn, tf's update (`Trainer.update`, what `tf train` runs) and peft's, their order
swapped at each batch, the first two batches left out. The machine's speed drifts by up to
1.5x between processes minutes apart; paired updates seconds apart share it.

    python -m benchmarks.lora_bench [--updates 8] [--size nllb-600m] [--max-tokens 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks import finetune_bench
from benchmarks.common import OUT, corpus_head, cpu_name, print_table, run_python
from cli.device import autocast_dtype

RANK = 16


def run(
    updates: int = 8,
    size: str = "nllb-600m",
    max_tokens: int = 1024,
    out: Path = OUT,
    log_every: int = 2,
) -> dict:
    """The three loops on the stand-in of `size` (finetune_bench.STANDINS; "nllb-tiny" shows
    the benchmark runs, its numbers mean nothing)."""
    directory, imported = finetune_bench.standin_run(out, size)
    train = corpus_head("train", 2000 if size.endswith("tiny") else 28_045, out)
    dev = corpus_head("dev", 40, out)
    dtype = autocast_dtype("auto", torch.device("cpu"))
    precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    sets = finetune_bench.tf_settings(updates, precision, train, dev, log_every, size)
    sets += [f"train.max_tokens={max_tokens}"]
    common = [str(directory), str(imported)]
    loops = {
        "tf, full": ("child-tf", json.dumps(sets)),
        "tf, LoRA": ("child-tf", json.dumps(sets + [f"train.lora.rank={RANK}"])),
        "transformers + peft, LoRA": ("child-hf", json.dumps(sets)),
    }
    results: dict = {"cpu": cpu_name(), "precision": precision, "size": size, "rank": RANK}
    results.update(updates=updates, max_tokens=max_tokens, loops={})
    for name, (kind, settings) in loops.items():
        args = [kind, *common, settings, str(updates)] + ([str(RANK)] if "peft" in name else [])
        measured = run_python("-m", "benchmarks.finetune_bench", *args)
        results["loops"][name] = json.loads(measured)
    loops_ = results["loops"]
    full, lora, peft = (loops_[name] for name in loops)
    results["lora_over_full"] = {
        "peak_rss": lora["peak_rss_gb"] / full["peak_rss_gb"],
        "tokens_per_s": lora["tokens_per_s"] / full["tokens_per_s"],
        "checkpoint": lora["checkpoint_mb"] / full["checkpoint_mb"],
    }
    results["tf_over_peft"] = lora["tokens_per_s"] / peft["tokens_per_s"]
    paired = run_python(
        "-m", "benchmarks.lora_bench", "child-paired", *common, json.dumps(sets), str(updates)
    )
    results["paired"] = json.loads(paired)
    return results


def child_paired(directory: Path, imported: Path, sets: list[str], updates: int) -> dict:
    """tf's LoRA update and peft's on the same batches, alternated in this process (so under
    the same process-wide settings, tf's `configure_device` included). `Trainer.update` is
    what `tf train` runs at each step; the learning-rate schedule stays at its first step
    (`Trainer.fit`, which advances it, is not run), which costs the same."""
    from cli.config import load_config
    from cli.training.distributed import Dist
    from cli.training.init import with_init
    from cli.training.run import start_run
    from cli.training.trainer import Trainer

    if updates <= 2:
        raise ValueError(f"--updates {updates}: the first two are left out; give at least 3")
    sets = sets + [f"train.init={imported}", f"train.lora.rank={RANK}"]
    config = with_init(load_config("configs/finetune.yaml", sets))
    run = start_run(config, imported.parent / "lora-bench-paired", force=True)
    trainer = Trainer(config, run, Dist(), torch.device("cpu"))  # its batches started
    seconds, tokens = {"tf": 0.0, "peft": 0.0}, 0
    try:
        peft_update = finetune_bench.transformers_update(directory, config, RANK)
        for step in range(updates):
            batches = trainer.next_batches()
            took = {}
            for name in ("tf", "peft") if step % 2 == 0 else ("peft", "tf"):
                start = time.perf_counter()
                if name == "tf":
                    trainer.update(batches)
                else:
                    peft_update(batches)
                took[name] = time.perf_counter() - start
            if step >= 2:
                tokens += sum(b.n_tgt_tokens for b in batches)
                seconds = {name: seconds[name] + took[name] for name in seconds}
    finally:
        trainer.close()
    tf, peft = (tokens / seconds[name] for name in ("tf", "peft"))
    return {"tf_tokens_per_s": tf, "peft_tokens_per_s": peft, "tf_over_peft": tf / peft}


def print_results(r: dict) -> None:
    print(
        f"CPU: {r['cpu']}; {r['precision']}; the {r['size']} stand-in; {r['updates']} updates "
        f"of {r['max_tokens']} tokens each; LoRA rank {r['rank']} on q, k, v, o"
    )
    rows = [("loop", "target tokens/s", "peak RSS (GB)", "checkpoint (MB)")]
    for name, m in r["loops"].items():
        ckpt = f"{m['checkpoint_mb']:,.1f}" if "checkpoint_mb" in m else "-"
        rows.append((name, f"{m['tokens_per_s']:,.0f}", f"{m['peak_rss_gb']:.2f}", ckpt))
    print_table(rows)
    ratios = r["lora_over_full"]
    print(
        f"LoRA / full: peak RSS {ratios['peak_rss']:.2f}x, tokens/s "
        f"{ratios['tokens_per_s']:.2f}x, checkpoint {ratios['checkpoint']:.3%}; "
        f"tf LoRA / peft LoRA tokens/s {r['tf_over_peft']:.2f}x"
    )
    p = r["paired"]
    print(
        f"Paired, update by update in one process: tf LoRA {p['tf_tokens_per_s']:,.0f} "
        f"tokens/s, peft LoRA {p['peft_tokens_per_s']:,.0f}: {p['tf_over_peft']:.2f}x"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["child-paired"]:
        directory, imported, sets, updates = sys.argv[2:]
        paired = child_paired(Path(directory), Path(imported), json.loads(sets), int(updates))
        print(json.dumps(paired))
        sys.exit()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--size", default="nllb-600m", choices=list(finetune_bench.STANDINS))
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args(sys.argv[1:])
    print_results(run(args.updates, args.size, args.max_tokens))
