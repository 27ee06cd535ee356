"""Memory over long runs, as users launch them: `tf train CONFIG` for N updates at
`data.pad_multiple: 1` (each side padded to its own longest sentence, any number of sentences:
the batches before shapes were rounded) and at its default, its RSS sampled twice a second
against the update it last logged; then `tf translate` of the test set repeated to M lines, its
RSS against time (its output appears whole at the end).

Why: oneDNN, which runs PyTorch's CPU bf16 and int8 matmuls, builds and keeps a kernel (with
its scratch memory) for each shape it meets, up to 1,024 of them. A run whose matmuls change
shape with every batch grows until that cache is full: a `demo` run went from 1.7 GB at update
100 to 3.2 GB. Reported for each: RSS at the first tenth of the run, the peak, their ratio, and
the run's tokens/s (the same recipe both ways: a like-for-like speed comparison).

    python -m benchmarks.memory_bench [--config demo] [--updates 1000] [--lines 10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import OUT, ROOT, corpus_head, cpu_name, print_table
from benchmarks.corpus_bench import memory_kb
from benchmarks.decode_bench import default_run, source_sentences
from data.config import DataConfig


def sampled(command: list[str], progress: Callable[[], int]) -> list[tuple[int, float]]:
    """Run `python COMMAND` in the checkout; (progress(), RSS in GB) twice a second until it
    ends. Raises RuntimeError with its stderr's tail if it fails."""
    # Its log goes to a file: a pipe read only at the end would fill and stop a long run.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log
        )
        samples = []
        while proc.poll() is None:
            rss = memory_kb(proc.pid)[0]
            if rss:
                samples.append((progress(), rss / 2**20))
            time.sleep(0.5)
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    if proc.returncode != 0 or not samples:
        raise RuntimeError(f"python {' '.join(command)} failed:\n{stderr[-3000:]}")
    return samples


def growth(samples: list[tuple[int, float]], total: int) -> dict:
    """RSS once a tenth of `total` is done, the peak, and their ratio."""
    early = [rss for done, rss in samples if done >= total // 10]
    at = early[0] if early else samples[-1][1]
    peak = max(rss for _, rss in samples)
    return {"rss_at_tenth_gb": at, "peak_rss_gb": peak, "peak_over_tenth": peak / at}


def logged(path: Path) -> list[dict]:
    """The records of a metrics.jsonl being written (its last line may be half written)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[:-1]]


def train_memory(
    config: str, updates: int, pad_multiple: int, train_spec: str, dev_spec: str, out: Path
) -> dict:
    run_dir = out / f"memory-{config}-pad{pad_multiple}"
    sets = [
        f"data.train={train_spec}",
        f"data.dev={dev_spec}",
        f"data.pad_multiple={pad_multiple}",
        "train.max_time=0",
        f"train.max_steps={updates}",
        "train.eval_every=0",
        "train.eval_bleu_sentences=10",
        "train.save_every=0",
        f"train.log_every={max(1, min(25, updates // 10))}",
    ]
    command = ["-m", "cli.main", "train", f"configs/{config}.yaml", "--out", str(run_dir)]
    command += ["--force", *(a for s in sets for a in ("--set", s))]
    metrics = run_dir / "metrics.jsonl"
    samples = sampled(command, lambda: max((r["step"] for r in logged(metrics)), default=0))
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]  # the first: warm-up
    return {**growth(samples, updates), "tokens_per_s": statistics.mean(speeds[1:] or speeds)}


def translate_memory(run_dir: Path, lines: int, out: Path) -> dict:
    test = source_sentences(1000)
    source = out / "memory-translate.es"
    source.write_text("".join(f"{test[i % len(test)]}\n" for i in range(lines)), encoding="utf-8")
    output = out / "memory-translate.en"
    command = ["-m", "cli.main", "translate", str(run_dir), "-i", str(source), "-o", str(output)]
    # Progress in milliseconds: the output appears whole at the end (written aside, renamed).
    started = time.perf_counter()
    samples = sampled(command, lambda: int(1000 * (time.perf_counter() - started)))
    seconds = time.perf_counter() - started
    return {**growth(samples, int(1000 * seconds)), "sentences_per_s": lines / seconds}


def run(
    config: str,
    updates: int,
    lines: int,
    decode_run: Path | None = None,
    pairs: int | None = None,
    out: Path = OUT,
) -> dict:
    """Both `tf train` runs (`pairs`: the corpus's first pairs; all when None) and the
    `tf translate` run (of `decode_run`, default a user's runs/CONFIG or one trained here)."""
    from cli.device import autocast_dtype, engine_precision, pick_device

    train_spec, dev_spec = corpus_head("train", pairs, out), corpus_head("dev", 100, out)
    results: dict = {"config": config, "updates": updates, "lines": lines}
    cpu = pick_device("cpu")
    results["precision"] = "bf16" if autocast_dtype("auto", cpu) is not None else "fp32"
    # `tf translate` decodes as engines do (`cli.device.engine_precision`): fp32 where packed.
    translated = engine_precision("auto", cpu)
    results["translate_precision"] = results["precision"] if translated == "auto" else translated
    for m in sorted({1, DataConfig.pad_multiple}):
        key = f"train_pad_multiple_{m}"
        results[key] = train_memory(config, updates, m, train_spec, dev_spec, out)
    decode_run = decode_run or default_run(out, config, ())
    results["translate"] = translate_memory(decode_run, lines, out)
    return results


def print_results(r: dict) -> None:
    print(f"CPU: {cpu_name()}; precision (auto): training {r['precision']}, ", end="")
    print(f"translating {r['translate_precision']}")

    def row(name: str, m: dict, speed: str) -> tuple:
        gb = [f"{m[key]:.2f} GB" for key in ("rss_at_tenth_gb", "peak_rss_gb")]
        return (name, *gb, f"{m['peak_over_tenth']:.2f}x", speed)

    rows = [("run", "RSS at 1/10", "peak RSS", "peak / at 1/10", "speed")]
    for key, m in r.items():
        if key.startswith("train_pad_multiple_"):
            name = f"tf train {r['config']}, {r['updates']} updates, pad_multiple "
            rows.append(row(name + key.rsplit("_", 1)[1], m, f"{m['tokens_per_s']:,.0f} tokens/s"))
    t = r["translate"]
    name = f"tf translate, {r['lines']:,} lines"
    rows.append(row(name, t, f"{t['sentences_per_s']:,.1f} sentences/s"))
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="demo")
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=10000)
    parser.add_argument("--run", type=Path, default=None, help="the run translated")
    args = parser.parse_args()
    print_results(run(args.config, args.updates, args.lines, args.run))


if __name__ == "__main__":
    main()
