"""The same trained model and sentences through every engine `tf translate` can use: PyTorch in
fp32, in bf16 autocast (what `decode.precision: auto` picks on CPUs with native bf16; CTranslate2
has no bf16 on CPUs), with dynamic int8 linear layers (`--int8`), and its CTranslate2 export in
float32 and int8. Greedy and beam 5, sentences/s, target tokens/s and BLEU, measured alternately
in one process, each engine end to end from source ids to hypotheses (as `tf translate` calls it).

    python -m benchmarks.engines_bench [--run RUN] [--sentences 1000]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import print_table
from benchmarks.decode_bench import default_run, source_sentences
from cli.device import autocast_dtype
from cli.exporters.ctranslate2 import export_ctranslate2
from cli.inference.decoding import encode_sources, translate_ids
from cli.inference.engines import quantize_int8, translate_ids_ct2
from cli.inference.scoring import score
from cli.training.checkpoint import load_for_inference
from data.corpus import load_corpus

ENGINES = ("tf_fp32", "tf_bf16", "tf_int8", "ct2_float32", "ct2_int8")


def references(n: int) -> list[str]:
    return list(load_corpus("bundled:bible-es-en/test", "es", "en")["tgt"])[:n]


def run(run_dir: Path, sentences: int = 1000, repeats: int = 2) -> dict:
    """Sentences/s, target tokens/s and BLEU of each engine, greedy and beam 5; the CTranslate2
    rows where it is installed (the `export` extra)."""
    cpu = torch.device("cpu")
    model, tokenizer, config = load_for_inference(run_dir, cpu)
    lines = source_sentences(sentences)
    refs = references(len(lines))
    src_ids = encode_sources(tokenizer, lines, model.config.max_positions, "test.es", 1)
    int8 = quantize_int8(load_for_inference(run_dir, cpu)[0], cpu)
    native = autocast_dtype("auto", cpu) == torch.bfloat16  # else no tf_bf16 row

    def engines(translators: dict, decode) -> dict:
        c = replace(config, decode=decode)
        fp32, bf16 = replace(decode, precision="fp32"), replace(decode, precision="bf16")
        return {
            "tf_fp32": lambda: translate_ids(model, tokenizer, src_ids, fp32, cpu),
            **(
                {"tf_bf16": lambda: translate_ids(model, tokenizer, src_ids, bf16, cpu)}
                if native
                else {}
            ),
            "tf_int8": lambda: translate_ids(int8, tokenizer, src_ids, fp32, cpu),
            **{
                n: (lambda t=t: translate_ids_ct2(t, tokenizer, src_ids, c))
                for n, t in translators.items()
            },
        }

    results: dict[str, float] = {"sentences": len(lines)}
    with tempfile.TemporaryDirectory(prefix="tf-engines-") as workdir:
        translators = ct2_translators(model, tokenizer, config, Path(workdir))
        for search, beam in (("greedy", 1), ("beam5", 5)):
            decode = replace(config.decode, beam_size=beam, nbest=1)
            measure(engines(translators, decode), search, repeats, tokenizer, refs, results)
    return results


def ct2_translators(model, tokenizer, config, workdir: Path) -> dict:
    """The model exported to CTranslate2 in float32 and int8, loaded; none without the package."""
    if importlib.util.find_spec("ctranslate2") is None:
        return {}
    import ctranslate2

    translators = {}
    for name, quantization in (("ct2_float32", None), ("ct2_int8", "int8")):
        export_ctranslate2(model, tokenizer, config, workdir / name, quantization)
        threads = torch.get_num_threads()
        translators[name] = ctranslate2.Translator(str(workdir / name), intra_threads=threads)
    return translators


def measure(engines: dict, search: str, repeats: int, tokenizer, refs, results: dict) -> None:
    """Time every engine `repeats` times, alternately so noise hits all alike; keep the fastest
    time, the tokens and the BLEU of each in `results`."""
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, translate in engines.items():
            started = time.perf_counter()
            hyps = translate()
            times.setdefault(name, []).append(time.perf_counter() - started)
            key = f"{name}_{search}"
            results[f"{key}_tokens"] = sum(len(h[0].tokens) + 1 for h in hyps)
            texts = tokenizer.decode_tgt([h[0].tokens for h in hyps])
            results[f"{key}_bleu"] = score(texts, refs)["bleu"]
    for name, seconds in times.items():
        key = f"{name}_{search}"
        results[f"{key}_sentences_per_s"] = len(refs) / min(seconds)
        results[f"{key}_tokens_per_s"] = results[f"{key}_tokens"] / min(seconds)


def print_results(r: dict) -> None:
    header = ("engine", "search", "sentences/s", "target tokens/s", "vs tf fp32", "vs ct2 fp32")
    rows = [(*header, "BLEU")]
    for search in ("greedy", "beam5"):
        base = r[f"tf_fp32_{search}_sentences_per_s"]
        ct2 = r.get(f"ct2_float32_{search}_sentences_per_s")  # None: CTranslate2 not installed
        for name in ENGINES:
            key = f"{name}_{search}"
            if f"{key}_sentences_per_s" not in r:
                continue  # no native bf16 here, or no CTranslate2
            rows.append(
                (
                    name,
                    search,
                    f"{r[f'{key}_sentences_per_s']:.1f}",
                    f"{r[f'{key}_tokens_per_s']:,.0f}",
                    f"{r[f'{key}_sentences_per_s'] / base:.2f}x",
                    f"{r[f'{key}_sentences_per_s'] / ct2:.2f}x" if ct2 else "-",
                    f"{r[f'{key}_bleu']:.2f}",
                )
            )
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=1000)
    args = parser.parse_args()
    print_results(run(args.run or default_run(), args.sentences))


if __name__ == "__main__":
    main()
