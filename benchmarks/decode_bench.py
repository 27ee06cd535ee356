"""Decoding throughput of a trained model: greedy and beam 5, with the KV cache and without.

Without the cache every step runs the decoder over the whole prefix again (O(t^2) per
sentence), the way a model without incremental decoding must. Cached and uncached search give
the same tokens (tests/test_search.py); here only their speed is compared, alternately, on the
same sentences, in one process.

    python -m benchmarks.decode_bench [--run RUN] [--sentences 1000] [--uncached-sentences 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import OUT, SHARED, print_table
from benchmarks.uncached import uncached_start
from cli.device import autocast_dtype
from cli.inference.decoding import cached_start, encode_sources, translate_ids
from cli.runs.models import load_for_inference
from data.corpus import load_corpus


def source_sentences(n: int) -> list[str]:
    if (SHARED / "test.es").exists():
        lines = (SHARED / "test.es").read_text(encoding="utf-8").splitlines()
    else:
        lines = list(load_corpus("bundled:bible-es-en/test", "es", "en")["src"])
    return lines[:n]


def timed(
    model, tokenizer, config, src_ids, beam: int, repeats: int, start=cached_start
) -> tuple[float, int]:
    """Median seconds of translating `src_ids` with beam `beam` (1: greedy), and the target
    tokens produced (EOS counted)."""
    decode = replace(config.decode, beam_size=beam, nbest=1)
    times, tokens = [], 0
    for _ in range(repeats):
        device = model_device(model)
        started = time.perf_counter()  # not `start`: that is the search's start function
        hyps = translate_ids(model, tokenizer, src_ids, decode, device, start=start)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
        tokens = sum(len(h[0].tokens) + 1 for h in hyps)
    return statistics.median(times), tokens


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def run(
    run_dir: Path,
    sentences: int = 1000,
    uncached_sentences: int = 200,
    repeats: int = 1,
    device_name: str = "cpu",
) -> dict:
    model, tokenizer, config = load_for_inference(run_dir, torch.device(device_name))
    lines = source_sentences(sentences)
    src_ids = encode_sources(tokenizer, lines, model.config.max_positions, "test.es", 1)
    results: dict[str, float] = {"sentences": len(lines), "threads": torch.get_num_threads()}
    fp32 = autocast_dtype(config.decode.precision, model_device(model), "decode.precision") is None
    # Warm-up: CUDA context and kernels, the allocator, autocast caches; not timed.
    for beam in (1, 5):
        timed(model, tokenizer, config, src_ids[:16], beam, 1)
    for name, beam in (("greedy", 1), ("beam5", 5)):
        seconds, tokens = timed(model, tokenizer, config, src_ids, beam, repeats)
        results[f"{name}_sentences_per_s"] = len(src_ids) / seconds
        results[f"{name}_tokens_per_s"] = tokens / seconds
        # The same subset with and without the cache, one after the other.
        subset = src_ids[:uncached_sentences]
        cached_s, cached_tokens = timed(model, tokenizer, config, subset, beam, repeats)
        uncached_s, uncached_tokens = timed(
            model, tokenizer, config, subset, beam, repeats, start=uncached_start
        )
        # In fp32 both do the same arithmetic: the same translations. Under bf16 autocast the
        # cached step's attention runs over one query, the recomputation's over all of them,
        # and rounding may part the two on a close call: their token counts are kept.
        if fp32:
            assert cached_tokens == uncached_tokens, "cached and uncached search disagree"
        results[f"{name}_cached_tokens"] = cached_tokens
        results[f"{name}_uncached_tokens"] = uncached_tokens
        results[f"{name}_uncached_tokens_per_s"] = uncached_tokens / uncached_s
        results[f"{name}_speedup_vs_uncached"] = uncached_s / cached_s
    return results


# The `small` decoded when there is no trained one: 3 minutes of training, checkpoint at the end.
SMALL_TRAINING = ("train.max_time=180", "train.eval_every=0", "train.save_every=0")


def default_run(
    out: Path = OUT, config_name: str = "small", sets: tuple[str, ...] = SMALL_TRAINING
) -> Path:
    """A trained run of `config_name`: runs/NAME if there is one of that config's model (`make
    demo` on a CPU without bf16 trains demo-fp32's narrower model into runs/demo), else OUT/NAME,
    trained once with the overrides `sets` through `tf train`'s own function."""
    from cli.commands.train import run_train
    from cli.config import load_config

    config = load_config(config_name, list(sets))
    for candidate in (Path("runs") / config_name, out / config_name):
        if (candidate / "checkpoints" / "last.pt").exists():
            if load_config(candidate / "config.yaml").model == config.model:
                return candidate

    print(f"training `{config_name}` ({', '.join(sets)}) into {out / config_name} (once)")
    run_train(config, out / config_name, resume=False, force=True)
    return out / config_name


def print_results(r: dict) -> None:
    rows = [("search", "sentences/s", "target tokens/s", "uncached tokens/s", "cache speed-up")]
    for name in ("greedy", "beam5"):
        rows.append(
            (
                name,
                f"{r[f'{name}_sentences_per_s']:.1f}",
                f"{r[f'{name}_tokens_per_s']:,.0f}",
                f"{r[f'{name}_uncached_tokens_per_s']:,.0f}",
                f"{r[f'{name}_speedup_vs_uncached']:.2f}x",
            )
        )
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--uncached-sentences", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    run_dir = args.run or default_run()
    print_results(run(run_dir, args.sentences, args.uncached_sentences, 1, args.device))


if __name__ == "__main__":
    main()
