"""`tf train` on the corpora users bring: numbered copies of the bundled pairs (so that none is
a duplicate) at 1M and 10M pairs, `tf train small` launched as a user does, to its first update;
the bundled 28,045 pairs, numbered likewise, give the baseline that the memory grows from.

For each size: seconds per stage (reading, tokenizer, cleaning, encoding, the model and one
update), read off the time each of `tf train`'s log lines arrives; peak RSS and PSS of the
process (PSS splits shared pages between the processes that map them, so it is what a rank
really adds), and the peak PSS of its whole process tree (with the processes that encode a
large corpus); the disk the cache takes; then the second (cached) start, and a cached start of
2 `torchrun` ranks on one machine, each rank's peaks.

    python -m benchmarks.corpus_bench [--pairs 28045 1000000 10000000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, corpus_spec, print_table
from data.corpus import load_corpus

# The log lines that end each stage, in order (the tokenizer line is absent when one exists).
STAGES = (
    ("reading", r"training a \w+ tokenizer|cleaning |encoding "),
    ("tokenizer", r"cleaning |encoding "),
    ("cleaning", r"encoding "),
    ("encoding / cached ids", r": read \d+, removed"),
    ("model + 1 update", r"step \d+: loss"),
)


def numbered_corpus(pairs: int, out: Path) -> str:
    """PREFIX of `pairs` numbered copies of the bundled training pairs ("17. " + each side)."""
    prefix = out / f"numbered-{pairs}" / "train"
    if Path(f"{prefix}.en").exists():  # written last: there means whole
        return str(prefix)
    base = load_corpus(corpus_spec("train"), "es", "en")
    src, tgt = base["src"], base["tgt"]
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, side in (("es", src), ("en", tgt)):
        with open(f"{prefix}.{lang}.partial", "w", encoding="utf-8") as f:
            for copy in range(-(-pairs // len(side))):
                count = min(len(side), pairs - copy * len(side))
                f.write("".join(f"{copy}. {line}\n" for line in side[:count]))
        os.replace(f"{prefix}.{lang}.partial", f"{prefix}.{lang}")
    return str(prefix)


def memory_kb(pid: int) -> tuple[int, int, int]:
    """(RSS, PSS, anonymous PSS) of one process in kB, 0 when it is gone. Anonymous memory is
    the process's own (heap: weights, optimizer, Python objects); the rest of its PSS is its
    share of mapped files (libraries, the memory-mapped ids)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0, 0
    rss = re.search(r"VmRSS:\s+(\d+)", status)
    pss = re.search(r"^Pss:\s+(\d+)", rollup, re.M)
    anon = re.search(r"^Pss_Anon:\s+(\d+)", rollup, re.M)
    return tuple(int(m[1]) if m else 0 for m in (rss, pss, anon))


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def workers(pid: int) -> list[int]:
    """The processes that do the work: `pid` itself, or torchrun's ranks under it (not the
    processes `tf train` forks to encode: `tree` counts those)."""
    if b"torch.distributed.run" not in _cmdline(pid):
        return [pid]
    return [c for c in children(pid) if b"cli.main" in _cmdline(c)] or [pid]


def tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    return [pid, *(p for c in children(pid) for p in tree(c))]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def launch(command: list[str], env: dict) -> dict:
    """Run `tf train`, timing its log lines and sampling its workers' memory every 0.5 s."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    seen: list[tuple[float, str]] = []

    stopped = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            seen.append((time.perf_counter() - started, line))
            if not stopped.is_set() and re.search(STAGES[-1][1], line):
                # Measured: what follows (the closing validation) is not a start's cost. The
                # whole group goes (torchrun's ranks too); `--resume` copes with no checkpoint.
                stopped.set()
                os.killpg(proc.pid, signal.SIGKILL)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peaks: dict[int, tuple[int, int, int]] = {}  # per process: peak RSS, PSS, anonymous PSS
    tree_pss = 0
    while proc.poll() is None:
        # One reading per process per sample, shared by the workers' peaks and the tree's sum:
        # read apart, a worker's PSS can rise between the two (its forked encoders exit and
        # their share of its pages comes back to it) and the tree's peak fall below a worker's.
        now = {pid: memory_kb(pid) for pid in tree(proc.pid)}
        for pid in workers(proc.pid):
            old = peaks.get(pid, (0, 0, 0))
            peaks[pid] = tuple(max(a, b) for a, b in zip(old, now.get(pid, (0, 0, 0))))
        tree_pss = max(tree_pss, sum(pss for _, pss, _ in now.values()))
        # Reading smaps walks the page tables: every 0.1 s took 40% of a core from the run.
        time.sleep(0.5)
    reader.join()
    if proc.returncode != 0 and not stopped.is_set():
        tail = "".join(line for _, line in seen[-20:])
        raise RuntimeError(f"{' '.join(command)} failed:\n{tail}")
    stages = stage_seconds(seen)
    return {
        "seconds_to_first_update": sum(stages.values()),
        "stages": stages,
        "ranks": [
            {"peak_rss_gb": r / 2**20, "peak_pss_gb": p / 2**20, "peak_anon_pss_gb": a / 2**20}
            for r, p, a in sorted(peaks.values(), reverse=True)
            if r
        ],
        "tree_peak_pss_gb": tree_pss / 2**20,
    }


def stage_seconds(seen: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds of each stage: from the end of the one before to its own line's arrival."""
    out, last = {}, 0.0
    for name, pattern in STAGES:
        at = next((t for t, line in seen if re.search(pattern, line)), None)
        if at is None or at < last:
            continue
        out[name], last = at - last, at
    return out


def run(pairs_list=(28_045, 1_000_000, 10_000_000), out: Path = OUT, config: str = "small") -> dict:
    """For each size: a first start, a cached start, a cached start of 2 torchrun ranks."""
    results = {}
    for pairs in pairs_list:
        prefix = numbered_corpus(pairs, out)
        cache = out / f"corpus-cache-{pairs}"
        shutil.rmtree(cache, ignore_errors=True)
        env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1"}
        run_dir, ranks_dir = out / f"corpus-run-{pairs}", out / f"corpus-ranks-{pairs}"
        sets = [f"data.train={prefix}", "train.max_steps=1", "train.log_every=1"]
        # No validation to wait for after the update (the last one decodes a single sentence).
        sets += ["train.eval_every=0", "train.save_every=0", "train.eval_bleu_sentences=1"]
        tf = [sys.executable, "-m", "cli.main"]
        first = tf + ["train", config, "--out", str(run_dir), "--force", *flags(sets)]
        first = launch(first, env)
        disk = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 2**30
        # The cached start: the same run resumed (it was stopped before its first checkpoint).
        again = ["train", "--resume", str(run_dir), "--allow-config-change"]
        cached = launch(tf + again + flags(["train.max_steps=2"]), env)
        # Two ranks of a new run with the first run's tokenizer: the cached ids serve them.
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        torchrun += ["--nproc_per_node", "2", "-m", "cli.main", "train", config]
        ranks_sets = [*sets, f"data.tokenizer={run_dir / 'tokenizer'}"]
        ranks = launch(torchrun + ["--out", str(ranks_dir), "--force", *flags(ranks_sets)], env)
        results[pairs] = {"first": first, "cached": cached, "two_ranks": ranks, "disk_gb": disk}
        (out / "corpus.json").write_text(json.dumps(results, indent=1))  # sizes done so far
        for path in (cache, run_dir, ranks_dir):
            shutil.rmtree(path, ignore_errors=True)
    return results


def flags(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def print_results(results: dict) -> None:
    rows = [
        (
            "pairs",
            "start",
            "s to update",
            "stages (s)",
            "peak RSS / PSS (anonymous) per process (GB)",
            "tree PSS (GB)",
        )
    ]
    for pairs, r in results.items():
        for name in ("first", "cached", "two_ranks"):
            start = r[name]
            stages = ", ".join(f"{k} {v:.0f}" for k, v in start["stages"].items())
            memory = "; ".join(
                f"{m['peak_rss_gb']:.2f} / {m['peak_pss_gb']:.2f} ({m['peak_anon_pss_gb']:.2f})"
                for m in start["ranks"]
            )
            seconds = f"{start['seconds_to_first_update']:.0f}"
            tree_pss = f"{start.get('tree_peak_pss_gb', 0):.2f}"
            rows.append((f"{int(pairs):,}", name, seconds, stages, memory, tree_pss))
        rows.append((f"{int(pairs):,}", "cache on disk", f"{r['disk_gb']:.2f} GB", "", "", ""))
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[28_045, 1_000_000, 10_000_000])
    args = parser.parse_args()
    print_results(run(args.pairs))


if __name__ == "__main__":
    main()
