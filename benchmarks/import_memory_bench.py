"""Peak memory of `tf import` of a 600M-parameter model: the weights read once, tensor by
tensor, each copied into the model's parameters and dropped (`cli.importers.weights`).

A stand-in of facebook/nllb-200-distilled-600M's size (`benchmarks.fairseq_standin`: d_model
1024, 12+12 layers, 16 heads, FFN 4096, config.json's 256,206 rows over a tokenizer of the
published 256,204 ids; transformers' own `M2M100ForConditionalGeneration`, its own random
initialisation, `save_pretrained`) is imported by `python -m cli.main import` in a child
process, whose peak RSS (`wait4`'s ru_maxrss, of a process forked by a small launcher) is
set against the bytes of the weights file: model.safetensors, and the same weights as the
pytorch_model.bin that facebook/nllb-200-* publish. Beside it, the RSS of a process that
imports what `tf import` imports and reads nothing (what any import costs), and the bytes of
the model's parameters (what it must hold).

Slow (building the stand-in and each import take a minute or more at full size) and large (it
needs ~8 GB of memory and ~8 GB of disk under the temporary folder, deleted at the end): run it
on its own, not in `make bench`.

    python -m benchmarks.import_memory_bench [--size tiny] [--keep DIR] [--out bench-out]

--keep DIR builds the stand-ins in DIR and keeps them (a second run reuses them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, cpu_name, print_table

# What `tf import` imports before it reads a byte of a model: the baseline of any import.
IMPORTS = "from cli.families.registry import import_model; from transformers import M2M100Config"


def standin(root: Path, size: str) -> Path:
    """The stand-in's directory under `root` (`size` "published" or "tiny"), built by
    `benchmarks.fairseq_standin` in a child process (its own memory is no import's)."""
    out = root / "nllb"
    if (out / "config.json").is_file():
        return out
    args = ["-m", "benchmarks.fairseq_standin", str(out), "nllb", "--model", size]
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the stand-in failed:\n{done.stderr[-3000:]}")
    return out


def as_pickle(directory: Path) -> Path:
    """A copy of `directory` whose weights are pytorch_model.bin (torch.save of the state
    dict), as the hub's facebook/nllb-200-* folders hold them."""
    import torch
    from safetensors.torch import load_file

    pickled = directory.with_name(f"{directory.name}-bin")
    if (pickled / "pytorch_model.bin").is_file():
        return pickled
    shutil.copytree(directory, pickled, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(load_file(directory / "model.safetensors"), pickled / "pytorch_model.bin")
    return pickled


# Runs `python ARGS` in a child of its own and prints the child's peak RSS (kB). Linux gives
# a process the peak of the one it was forked from (kept through exec), and subprocess forks
# from this one, which holds the stand-in: a small launcher forks the measured process.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def peak_rss(args: list[str]) -> tuple[float, float]:
    """(peak RSS in bytes, seconds) of `python ARGS` run to its end in the checkout."""
    start = time.perf_counter()
    command = [sys.executable, "-c", LAUNCHER, *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return int(done.stdout.split()[-1]) * 1024, time.perf_counter() - start  # Linux: kB


def parameter_bytes(run: Path) -> int:
    """The bytes of the imported model's parameters (each tied matrix once)."""
    import torch

    from cli.runs.models import load_for_inference

    model, _, _ = load_for_inference(run, torch.device("cpu"))
    return sum(p.numel() * p.element_size() for p in model.parameters())


def measure(directory: Path, weights: str, root: Path) -> dict:
    """`tf import` of `directory` in a child: its peak RSS against the weights' bytes."""
    run = root / f"run-{weights.split('.')[0]}"
    peak, seconds = peak_rss(["-m", "cli.main", "import", str(directory), "-o", str(run)])
    size = (directory / weights).stat().st_size
    params = parameter_bytes(run)
    shutil.rmtree(run)
    return {
        "weights": weights,
        "weights_gb": size / 1e9,
        "parameters_gb": params / 1e9,
        "peak_rss_gb": peak / 1e9,
        "peak_over_weights": peak / size,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["published", "tiny"], default="published")
    parser.add_argument("--keep", type=Path, help="build the stand-in here and keep it")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="import-memory-"))
    try:
        directory = standin(root, args.size)
        results = [measure(directory, "model.safetensors", root)]
        results.append(measure(as_pickle(directory), "pytorch_model.bin", root))
        baseline, _ = peak_rss(["-c", IMPORTS])
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    report = {"cpu": cpu_name(), "size": args.size, "baseline_rss_gb": baseline / 1e9}
    report["imports"] = results
    rows = [("weights", "file GB", "params GB", "peak RSS GB", "peak / file", "s")]
    rows += [
        (r["weights"], f"{r['weights_gb']:.2f}", f"{r['parameters_gb']:.2f}")
        + (f"{r['peak_rss_gb']:.2f}", f"{r['peak_over_weights']:.2f}", f"{r['seconds']:.0f}")
        for r in results
    ]
    print(f"tf import of an NLLB-200-600M-sized stand-in ({args.size}), {report['cpu']}")
    print_table(rows)
    print(f"a process importing what tf import imports, reading nothing: {baseline / 1e9:.2f} GB")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "import_memory.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
