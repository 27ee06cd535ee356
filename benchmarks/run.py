"""`make bench`: every benchmark in one run, printed as tables and written as JSON.

    python -m benchmarks.run [--quick]

Data pipeline (tokenizer, encoding, batching, padding efficiency); training throughput of
`small` against the torch.nn.Transformer reference (alternating, fp32 and CPU bf16), for one
isolated step and for the `tf train` loop as launched; one attention's forward and backward
per kernel; decoding throughput of greedy and beam 5 against uncached decoding and against
CTranslate2 on the same model. Results: bench-out/bench.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import datasets
import torch

from benchmarks import (
    attention_bench,
    data_bench,
    decode_bench,
    engines_bench,
    loop_bench,
    scaling_bench,
    train_bench,
)
from benchmarks.common import OUT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and sentences")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    torch.manual_seed(0)
    started = time.perf_counter()
    results: dict = {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine(),
        }
    }

    print("\n== data pipeline (28k-pair corpus, vocab 8000, max_tokens 4096)")
    results["data"] = data_bench.run()

    print("\n== training step of `small`: tf vs torch.nn.Transformer, same batches and loss")
    n_batches, repeats = (3, 2) if args.quick else (6, 3)
    results["train"] = train_bench.run("small", n_batches, repeats)
    train_bench.print_results(results["train"], ("fp32", "bf16"))

    print("\n== the `tf train` loop as launched, vs the torch.nn.Transformer fp32 reference step")
    results["loop"] = loop_bench.run("small", 60 if args.quick else 150)
    loop_bench.print_results(results["loop"])

    print("\n== one attention, forward + backward, CPU (64 x 4 heads x 36 positions)")
    results["attention"] = attention_bench.run()
    attention_bench.print_results(results["attention"])

    print("\n== decoding test.es with a trained `small`: KV cache vs full recomputation")
    sentences, uncached = (300, 60) if args.quick else (1000, 200)
    run_dir = decode_bench.default_run()
    results["decode"] = decode_bench.run(run_dir, sentences, uncached)
    results["decode"]["run"] = str(run_dir)
    decode_bench.print_results(results["decode"])

    print("\n== the same model and sentences through each engine: tf fp32/int8, CTranslate2")
    results["engines"] = engines_bench.run(run_dir, sentences)
    engines_bench.print_results(results["engines"])

    print("\n== cost as work grows: training tiny -> small -> base; decoding by source length")
    results["scaling"] = {
        "train": scaling_bench.training(),
        "decode": scaling_bench.decoding(run_dir, 20 if args.quick else 40),
    }
    scaling_bench.print_results(results["scaling"]["train"], results["scaling"]["decode"])

    results["seconds"] = time.perf_counter() - started
    OUT.mkdir(exist_ok=True)
    (OUT / "bench.json").write_text(json.dumps(results, indent=2))
    print(f"\n{results['seconds']:.0f} s in all; results in {OUT / 'bench.json'}")


if __name__ == "__main__":
    main()
