"""`make bench`: every benchmark in one run, printed as tables and written as JSON.

    python -m benchmarks.run [--quick | --smoke] [--out bench-out]

Data pipeline (tokenizer, encoding, batching, padding efficiency); training throughput of
`small` against the torch.nn.Transformer reference (alternating, fp32 and CPU bf16), for one
isolated step and for the `tf train` loop as launched; one attention's forward and backward
per kernel, and dropout's against torch's; decoding throughput of greedy and beam 5 against
uncached decoding and against CTranslate2 on the same model; how cost grows with the model
and the sentence; fine-tuning an OPUS-MT-sized model against the loop a `transformers` user
writes. Results: OUT/bench.json. `--quick` measures `demo` on fewer batches and sentences;
`--smoke` runs every section on `tiny` with a handful of batches and sentences, to show the
suite still runs (tests/test_benchmarks.py): its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import datasets
import torch

from benchmarks import (
    attention_bench,
    corpus_bench,
    data_bench,
    decode_bench,
    dropout_bench,
    engines_bench,
    finetune_bench,
    loop_bench,
    lora_bench,
    memory_bench,
    scaling_bench,
    serve_bench,
    train_bench,
)
from benchmarks.common import OUT, corpus_head, cpu_name
from cli.config import load_config
from cli.device import autocast_dtype


@dataclass(frozen=True)
class Size:
    """How much work each section does. The model config also gives the data and scaling
    sections their vocabulary and batch budget (`small`: 8,000 pieces, 4,096 tokens)."""

    name: str
    config: str  # the model timed, trained and decoded
    pairs: int | None  # training pairs read, from the top (None: the whole 28k corpus)
    dev_pairs: int | None  # dev pairs the runs trained here validate on (None: all 1,000)
    batches: int  # train: real batches in each timed pass ...
    repeats: int  # ... and alternating passes per model, the median kept ...
    train_memory: bool  # ... and each model's peak memory, in a fresh process each (seconds)
    loop_precisions: tuple[str, ...]  # loop: a `tf train` launched for each ...
    loop_updates: int  # ... its updates ...
    loop_log_every: int  # ... and its log windows (the first one is left out as warm-up)
    attention_sentences: int  # attention: B of the (B, 4 heads, 36 positions, 64) shape ...
    attention_repeats: int  # ... and timed passes per kernel
    decode_training: tuple[str, ...]  # decode: `--set`s of the model trained when none exists
    sentences: int  # decode, engines: test.es sentences translated
    uncached_sentences: int  # decode: those of them decoded again without the KV cache
    engine_repeats: int  # engines: alternating passes, the fastest kept
    scaling_configs: tuple[str, ...]  # scaling: models trained on the same batches ...
    scaling_batches: int  # ... how many of them ...
    per_bucket: int  # ... and sentences decoded per source-length bucket
    serve_sentences: int  # serve: test.es sentences sent to `tf serve` ...
    serve_clients: tuple[int, ...]  # ... by this many concurrent clients, in turn ...
    serve_precisions: tuple[str, ...]  # ... in each (bf16 where native), tf and its CT2 export
    memory_config: str  # memory: `tf train` of this config, RSS sampled, for ...
    memory_updates: int  # ... updates at each pad_multiple ...
    memory_lines: int  # ... then `tf translate` of this many lines (the test set repeated)
    corpus_pairs: tuple[int, ...]  # corpus: numbered copies of the pairs, `tf train` started
    finetune_updates: int  # finetune: updates of each loop ...
    finetune_standins: tuple[str, ...]  # ... on these stand-ins (finetune_bench.STANDINS)
    lora_standin: str  # lora: full fine-tuning, LoRA and peft's LoRA on this stand-in ...
    lora_updates: int  # ... for this many updates each
    estimate_s: dict[str, float]  # seconds per section on a 2-core CPU (rounded, by hand)


FULL = Size(
    name="full",
    config="small",
    pairs=None,
    dev_pairs=None,
    batches=6,
    repeats=3,
    train_memory=True,
    loop_precisions=("fp32", "bf16"),
    loop_updates=150,
    loop_log_every=25,
    attention_sentences=64,
    attention_repeats=20,
    decode_training=decode_bench.SMALL_TRAINING,
    sentences=1000,
    uncached_sentences=200,
    engine_repeats=2,
    scaling_configs=scaling_bench.CONFIGS,
    scaling_batches=3,
    per_bucket=40,
    serve_sentences=300,
    serve_clients=(1, 8, 32, 64),
    serve_precisions=("fp32", "bf16"),
    memory_config="demo",
    memory_updates=1000,
    memory_lines=10_000,
    corpus_pairs=(28_045, 1_000_000, 10_000_000),
    finetune_updates=30,
    finetune_standins=("opus", "nllb"),
    lora_standin="nllb-600m",
    lora_updates=8,
    # The first four: 11 minutes in all, as a user timed them (data and attention timed
    # here); decode, engines and scaling reckoned from 100-sentence runs of `small` on 2 cores
    # and its 3 minutes of training. bench.json keeps each section's seconds: correct from it.
    estimate_s={
        "data": 10,
        "train": 180,
        "loop": 420,
        "attention": 45,
        "dropout": 120,  # the kernels, then 150 `small` updates with a tokenizer to train
        "decode": 360,
        "engines": 720,  # five engines, two searches, twice: 20,000 translations
        "scaling": 150,
        "serve": 420,  # reckoned from 120 s for fp32 at 1, 8, 32: two precisions, 64, CT2
        "memory": 660,  # two 1,000-update `demo` runs (about 4 minutes each) and 10,000 lines
        "corpus": 2400,  # 1M pairs: 6 min; 10M: half an hour (3 starts each)
        "finetune": 1200,  # OPUS-MT-sized: 10 minutes; NLLB-shaped (256,206 rows): 9
        "lora": 640,  # the 600M stand-in made and imported, three loops of 8 updates, paired
    },
)
# About 6 minutes on the 2-core AMD EPYC (5m27s measured, its decode model already trained);
# `sized_for` keeps it near that on slower CPUs. The `demo` model, not `small`: its steps are
# cheaper, and 400 updates (70 s here) teach it to translate (`small` after 90 s wrote to the
# length limit, which made decoding and serving take minutes).
QUICK = replace(
    FULL,
    name="quick",
    config="demo",
    batches=3,
    repeats=1,
    train_memory=False,  # six processes to start; the full size measures it
    loop_updates=30,
    loop_log_every=10,
    attention_repeats=5,
    # by updates, not time: a slower CPU trains as long as it needs for the same model
    decode_training=(
        "train.max_steps=400",
        "train.max_time=0",
        "train.eval_every=0",
        "train.save_every=0",
    ),
    sentences=100,
    uncached_sentences=20,
    engine_repeats=1,
    scaling_configs=("tiny", "small"),
    scaling_batches=2,
    per_bucket=10,
    serve_sentences=200,
    serve_clients=(1, 8, 32),
    memory_updates=250,
    memory_lines=2000,
    corpus_pairs=(28_045,),
    finetune_updates=8,
    finetune_standins=("half", "nllb-tiny"),
    lora_standin="nllb",
    lora_updates=6,
    estimate_s={
        "data": 5,
        "train": 15,
        "loop": 50,  # two `tf train` processes
        "attention": 2,
        "dropout": 30,
        "decode": 95,  # training `demo` for 400 updates included
        "engines": 20,
        "scaling": 5,
        "serve": 200,  # reckoned as the full size's
        "memory": 160,
        "corpus": 25,
        "finetune": 50,
        "lora": 300,  # and the paired loop
    },
)
SMOKE = Size(
    name="smoke",
    config="tiny",
    pairs=2000,
    dev_pairs=40,  # each run's one validation, at its end, reads all (1,000 took `tiny` 13 s)
    batches=2,
    repeats=1,
    train_memory=False,  # six processes starting torch: most of the section's time
    loop_precisions=("bf16",),  # the same code as fp32, and a process less to start
    loop_updates=9,
    loop_log_every=3,
    attention_sentences=8,
    attention_repeats=2,
    decode_training=(
        "train.max_steps=10",
        "train.eval_every=0",
        "train.save_every=0",
        "train.eval_bleu_sentences=4",
        # Ten updates teach no EOS: without a short limit every output runs to src_len + 10.
        "decode.max_len_a=0",
        "decode.max_len_b=12",
    ),
    sentences=16,
    uncached_sentences=4,
    engine_repeats=1,
    scaling_configs=("tiny", "small"),
    scaling_batches=2,
    per_bucket=2,
    serve_sentences=8,
    serve_clients=(1, 4),
    serve_precisions=("fp32",),  # bf16 runs the same code: a server (or two) less to start
    memory_config="tiny",
    memory_updates=12,
    memory_lines=40,
    corpus_pairs=(3000,),
    finetune_updates=6,
    finetune_standins=("tiny", "nllb-tiny"),
    lora_standin="nllb-tiny",
    lora_updates=4,
    estimate_s={
        "data": 1,
        "train": 2,
        "loop": 12,  # a `tf train` process starting
        "attention": 1,
        "dropout": 10,  # a `tiny` Trainer's start
        "decode": 3,  # training `tiny` included
        "engines": 1,
        "scaling": 1,
        "serve": 25,  # the export, two servers and the CT2 precision check starting
        "memory": 25,  # two `tf train` and a `tf translate` process
        "corpus": 40,  # three `tf train` launches, one of 2 ranks
        "finetune": 40,  # a tiny stand-in made and imported, two loops in processes
        "lora": 35,  # and the paired loop
    },
)


# The quick size was set on a 2-core AMD EPYC whose fp32 matmuls run at about this rate (a
# 1024 x 1024 product, `matmul_gflops`); a slower CPU does proportionally less work in each
# section that counts updates or sentences, so that the quick run still takes minutes.
REFERENCE_GFLOPS = 90.0


def matmul_gflops(seconds: float = 0.5) -> float:
    """This machine's fp32 matmul rate, in its threads, measured for about `seconds`."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - start) / 1e9


def sized_for(size: Size, gflops: float, native_bf16: bool = True) -> Size:
    """`size` for this CPU: the loop in bf16 only where bf16 is native (elsewhere it is
    emulated, slowly, and no user would train in it); at the quick size, the update and
    sentence counts cut in proportion to the CPU's speed when it is clearly slower than the
    reference (never below a handful). The full size keeps its counts."""
    if not native_bf16:
        size = replace(size, loop_precisions=tuple(p for p in size.loop_precisions if p != "bf16"))
    factor = gflops / REFERENCE_GFLOPS
    if size.name != "quick" or factor >= 0.8:  # a slow moment of the reference CPU is noise
        return size

    def cut(n: int, least: int) -> int:
        return max(least, round(n * factor))

    return replace(
        size,
        loop_updates=cut(size.loop_updates, 2 * size.loop_log_every),
        sentences=cut(size.sentences, 20),
        uncached_sentences=cut(size.uncached_sentences, 5),
        per_bucket=cut(size.per_bucket, 3),
        serve_sentences=cut(size.serve_sentences, 20),
        memory_updates=cut(size.memory_updates, 100),
        memory_lines=cut(size.memory_lines, 500),
        finetune_updates=cut(size.finetune_updates, 4),
        estimate_s={name: s / max(factor, 0.5) for name, s in size.estimate_s.items()},
    )


def budget(size: Size) -> tuple[int, int]:
    """The vocabulary size and batch token budget of the size's model config."""
    config = load_config(size.config)
    return config.data.vocab_size, config.train.max_tokens


def trained_run(size: Size, out: Path) -> Path:
    """The run decoded: a user's runs/CONFIG, else one trained once into OUT/CONFIG."""
    train, dev = corpus_head("train", size.pairs, out), corpus_head("dev", size.dev_pairs, out)
    sets = (f"data.train={train}", f"data.dev={dev}", *size.decode_training)
    return decode_bench.default_run(out, size.config, sets)


# A section prints its heading, measures at `size` (keeping files in `out`), prints its table
# and returns what it measured.


def data_section(size: Size, out: Path) -> dict:
    vocab_size, max_tokens = budget(size)
    corpus = "28k-pair corpus" if size.pairs is None else f"first {size.pairs:,} pairs"
    print(f"\n== data pipeline ({corpus}, vocab {vocab_size}, max_tokens {max_tokens})")
    r = data_bench.run(data_bench.SPEC, vocab_size, max_tokens, size.pairs)
    data_bench.print_results(r)
    return r


def train_section(size: Size, out: Path) -> dict:
    print(
        f"\n== training step of `{size.config}`: tf vs torch.nn.Transformer, same batches and loss"
    )
    r = train_bench.run(
        size.config,
        size.batches,
        size.repeats,
        memory=size.train_memory,
        pairs=size.pairs,
        out=out,
    )
    train_bench.print_results(r, ("fp32", "bf16"))
    return r


def loop_section(size: Size, out: Path) -> dict:
    print("\n== the `tf train` loop as launched, vs the torch.nn.Transformer fp32 reference step")
    r = loop_bench.run(
        size.config,
        size.loop_updates,
        size.loop_precisions,
        pairs=size.pairs,
        out=out,
        log_every=size.loop_log_every,
        dev_pairs=size.dev_pairs,
    )
    loop_bench.print_results(r)
    return r


def attention_section(size: Size, out: Path) -> dict:
    B = size.attention_sentences
    print(f"\n== one attention, forward + backward, CPU ({B} x 4 heads x 36 positions)")
    r = attention_bench.run(B, size.attention_repeats)
    attention_bench.print_results(r)
    return r


def dropout_section(size: Size, out: Path) -> dict:
    # A residual stream of 128 positions for each 8 sentences of the attention's batch: NLLB's
    # width (1,024) at 1,024 tokens for the full size, a small tensor for the smoke run.
    shape = (max(1, size.attention_sentences // 8), 128, 1024)
    print(f"\n== dropout, forward + backward, CPU {shape}; then `{size.config}` training with it")
    r = dropout_bench.run(size.attention_repeats, shape)
    r["loop"] = dropout_bench.loop(size.config, size.loop_updates, size.pairs, size.dev_pairs, out)
    dropout_bench.print_results(r)
    return r


def decode_section(size: Size, out: Path) -> dict:
    print(f"\n== decoding test.es with a trained `{size.config}`: KV cache vs full recomputation")
    run_dir = trained_run(size, out)
    r = decode_bench.run(run_dir, size.sentences, size.uncached_sentences)
    r["run"] = str(run_dir)
    decode_bench.print_results(r)
    return r


def engines_section(size: Size, out: Path) -> dict:
    print("\n== the same model and sentences through each engine: tf fp32/int8, CTranslate2")
    r = engines_bench.run(trained_run(size, out), size.sentences, size.engine_repeats)
    engines_bench.print_results(r)
    return r


def scaling_section(size: Size, out: Path) -> dict:
    growth = " -> ".join(size.scaling_configs)
    print(f"\n== cost as work grows: training {growth}; decoding by source length")
    vocab_size, max_tokens = budget(size)
    r = scaling_bench.run(
        trained_run(size, out),
        size.scaling_configs,
        size.scaling_batches,
        size.per_bucket,
        vocab_size,
        max_tokens,
        size.pairs,
        out,
    )
    scaling_bench.print_results(r)
    return r


def serve_section(size: Size, out: Path) -> dict:
    print(
        f"\n== `tf serve` on loopback, {size.serve_clients} clients, "
        f"{'/'.join(size.serve_precisions)}, its CTranslate2 export too, vs `tf translate`"
    )
    sentences = decode_bench.source_sentences(size.serve_sentences)
    run_dir = trained_run(size, out)
    clients, precisions = size.serve_clients, size.serve_precisions
    r = serve_bench.run(run_dir, sentences, clients, precisions=precisions, out=out)
    serve_bench.print_results(r)
    return r


def memory_section(size: Size, out: Path) -> dict:
    print(
        f"\n== RSS over `tf train {size.memory_config}` ({size.memory_updates} updates, by "
        f"data.pad_multiple) and `tf translate` ({size.memory_lines:,} lines)"
    )
    r = memory_bench.run(
        size.memory_config,
        size.memory_updates,
        size.memory_lines,
        trained_run(size, out),
        pairs=size.pairs,
        out=out,
    )
    memory_bench.print_results(r)
    return r


def corpus_section(size: Size, out: Path) -> dict:
    pairs = ", ".join(f"{n:,}" for n in size.corpus_pairs)
    print(f"\n== `tf train {size.config}` to its first update on {pairs} numbered pairs")
    r = corpus_bench.run(size.corpus_pairs, out, size.config)
    corpus_bench.print_results(r)
    return r


FINETUNE_MODELS = {"opus": "an OPUS-MT-sized model", "nllb": "an NLLB-200-shaped model"}


def finetune_section(size: Size, out: Path) -> dict:
    """Each stand-in's two loops, by its name in finetune_bench.STANDINS."""
    results = {}
    for standin in size.finetune_standins:
        model = FINETUNE_MODELS.get(standin, f"a small stand-in ({standin})")
        print(f"\n== fine-tuning {model}: tf's loop vs a transformers user's loop")
        results[standin] = finetune_bench.run(
            size.finetune_updates, out=out, log_every=2 if size.finetune_updates < 10 else 5,
            size=standin,
        )  # fmt: skip
        finetune_bench.print_results(results[standin])
    return results


def lora_section(size: Size, out: Path) -> dict:
    print(f"\n== LoRA against full fine-tuning, tf against peft ({size.lora_standin} stand-in)")
    r = lora_bench.run(size.lora_updates, size.lora_standin, out=out)
    lora_bench.print_results(r)
    return r


SECTIONS: list[tuple[str, Callable[[Size, Path], dict]]] = [
    ("data", data_section),
    ("train", train_section),
    ("loop", loop_section),
    ("attention", attention_section),
    ("dropout", dropout_section),
    ("decode", decode_section),
    ("engines", engines_section),
    ("scaling", scaling_section),
    ("serve", serve_section),
    ("memory", memory_section),
    ("corpus", corpus_section),
    ("finetune", finetune_section),
    ("lora", lora_section),
]


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def print_estimate(size: Size) -> None:
    """What the run will cost, before it starts: `make bench` takes a while."""
    total = sum(size.estimate_s.values())
    parts = ", ".join(f"{name} {duration(s)}" for name, s in size.estimate_s.items())
    print(f"benchmarks at {size.name} size: about {duration(total)} on a 2-core CPU ({parts})")
    training = f"`{size.config}` with {size.decode_training[0]}"
    print(f"  (an estimate; decode includes training {training} when there is none)", flush=True)


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "--quick", action="store_true", help="`demo`, fewer batches and sentences (5 minutes)"
    )
    sizes.add_argument("--smoke", action="store_true", help="tiny: does every section run?")
    parser.add_argument("--out", type=Path, default=OUT, help=f"results folder ({OUT.name})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run every section at the size asked for, print each table and the time it took; write
    and return the results."""
    args = parse_args(argv)
    gflops = matmul_gflops()
    native = autocast_dtype("auto", torch.device("cpu")) == torch.bfloat16
    size = sized_for(SMOKE if args.smoke else QUICK if args.quick else FULL, gflops, native)
    datasets.disable_progress_bars()
    torch.manual_seed(0)
    print(
        f"CPU: {cpu_name()}, fp32 matmul {gflops:.0f} GFLOPS; precision: auto is "
        f"{'bf16 (native)' if native else 'fp32 (no native bf16)'}"
    )
    print_estimate(size)
    results: dict = {
        "machine": {**machine(), "cpu": cpu_name(), "fp32_gflops": gflops},
        "size": size.name,
        "size_settings": asdict(size),  # as cut for this CPU
        "section_seconds": {},
    }
    started = time.perf_counter()
    for name, section in SECTIONS:
        section_started = time.perf_counter()
        results[name] = section(size, args.out)
        seconds = time.perf_counter() - section_started
        results["section_seconds"][name] = seconds
        print(f"section {name}: {seconds:.0f} s", flush=True)
    results["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(results, indent=2))
    print(f"\n{results['seconds']:.0f} s in all; results in {args.out / 'bench.json'}")
    return results


if __name__ == "__main__":
    main()
