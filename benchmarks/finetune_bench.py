"""Fine-tuning a pretrained model: `tf`'s loop against the loop a `transformers` user writes,
on the same model, batches and precision, on the same CPU.

The models, random weights imported with `tf import`:
- "opus": the stand-in for Helsinki-NLP/opus-mt-es-en (`benchmarks.marian_standin`: its
  published shape, 6+6 layers of 512, FFN 2,048, swish, and a vocabulary filled to its 65,001
  pieces, whose output layer is a third of the work);
- "nllb": an NLLB-200-shaped stand-in (`benchmarks.fairseq_standin`: its layout, Pre-LN,
  fairseq's positions, ReLU, and its vocabulary, 256,206 rows over a tokenizer of 256,204 ids)
  at half facebook/nllb-200-distilled-600M's width and depth (6+6 layers of 512, FFN 2,048),
  so that its loops fit the bench's time; the corpus's languages named with NLLB's codes
  (spa_Latn -> eng_Latn), the target's code forced first as `tf` and `transformers` both do.

- tf: `tf train configs/finetune.yaml --init RUN` as launched (validation and checkpoints
  off), its tokens/s read from the run's metrics.jsonl, the first log window left out.
- transformers: `AutoModelForSeq2SeqLM.from_pretrained` (`MarianMTModel`,
  `M2M100ForConditionalGeneration`), `torch.optim.AdamW`, `model(**batch).loss`,
  `backward`, `clip_grad_norm_`, `step`, under `torch.autocast` when the precision is bf16:
  what its documentation and examples show. It gets tf's own batches (the same pairs, the same
  token budget, pad-masked labels), so both see the same tokens.

Each runs in a process of its own, which reports its peak resident memory.

    python -m benchmarks.finetune_bench [--updates 30] [--precision auto]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks import fairseq_standin
from benchmarks.common import OUT, corpus_head, cpu_name, print_table, run_python
from benchmarks.marian_standin import OPUS_MT_ES_EN, TINY, bundled_lines, make_standin
from cli.device import autocast_dtype

if TYPE_CHECKING:
    from cli.config import Config

VOCABULARY = 65_001  # opus-mt-es-en's


# The stand-ins: opus-mt-es-en's size (the measurement), half of it (the quick bench), a tiny
# one (does the section run?): (shape, SentencePiece pieces per side, vocabulary filled to).
STANDINS = {
    "opus": (OPUS_MT_ES_EN, 8000, VOCABULARY),
    "half": (
        dict(OPUS_MT_ES_EN, d_model=256, encoder_layers=3, decoder_layers=3, encoder_ffn_dim=1024,
             decoder_ffn_dim=1024, encoder_attention_heads=4, decoder_attention_heads=4),
        4000,
        0,
    ),
    "tiny": (TINY, 500, 0),
    "nllb": (
        dict(fairseq_standin.PUBLISHED["nllb"], d_model=512, encoder_layers=6, decoder_layers=6,
             encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
             decoder_ffn_dim=2048),
        8000,
        fairseq_standin.NLLB_IDS,
    ),
    "nllb-tiny": (fairseq_standin.TINY["nllb"], 500, 0),
    "nllb-600m": (fairseq_standin.PUBLISHED["nllb"], 8000, fairseq_standin.NLLB_IDS),
}  # fmt: skip
# The languages of each stand-in's corpus, as its tokenizer names them (NLLB-200: its codes).
LANGUAGES = {"opus": ("es", "en"), "nllb": ("spa_Latn", "eng_Latn")}


def languages(size: str) -> tuple[str, str]:
    return LANGUAGES[size.split("-")[0] if size.startswith("nllb") else "opus"]


def standin_run(out: Path, size: str = "opus") -> tuple[Path, Path]:
    """The stand-in of `size` (made once) and its `tf import`, under `out`."""
    if size.startswith("nllb"):
        name = f"{size}-standin"
    else:
        name = "opus-mt-standin" + ("" if size == "opus" else f"-{size}")
    directory, run = out / name, out / f"{name}-run"
    if not (directory / "model.safetensors").is_file():
        shape, pieces, vocabulary = STANDINS[size]
        src, tgt = bundled_lines(2000 if size.endswith("tiny") else 28_045)
        if size.startswith("nllb"):
            make_nllb_standin(directory, src + tgt, shape, pieces, vocabulary)
        else:
            make_standin(directory, src, tgt, shape, vocab_size=pieces, vocabulary=vocabulary)
    if not (run / "checkpoints" / "last.pt").is_file():
        run_python("-m", "cli.main", "import", str(directory), "-o", str(run), "--force")
    return directory, run


def make_nllb_standin(directory: Path, lines: list[str], shape: dict, pieces: int, ids: int):
    """An NLLB-200 stand-in of `shape` in `directory`: a BPE SentencePiece model of `pieces`
    trained on `lines`, NLLB's tokenizer over it filled to `ids` ids, transformers' own
    initialisation of the model."""
    work = directory.with_name(f".{directory.name}.work")
    spm = fairseq_standin.train_spm(lines, work / "spm", pieces, "bpe")
    tokenizer = fairseq_standin.nllb_tokenizer(work / "tokenizer", spm, ids=ids)
    fairseq_standin.make_model_standin(directory, "nllb", tokenizer, shape, telling=False)
    shutil.rmtree(work)


def named_corpus(prefix: str, size: str) -> str:
    """`prefix` (PREFIX.es, PREFIX.en) under the names of the stand-in's languages: links."""
    src, tgt = languages(size)
    if (src, tgt) == ("es", "en"):
        return prefix
    for lang, name in (("es", src), ("en", tgt)):
        link = Path(f"{prefix}.{name}")
        if not link.exists():
            link.symlink_to(Path(f"{prefix}.{lang}").resolve())
    return prefix


def tf_settings(
    updates: int, precision: str, train: str, dev: str, log_every: int, size: str = "opus"
) -> list:
    src, tgt = languages(size)
    return [
        f"data.train={named_corpus(train, size)}",
        f"data.dev={named_corpus(dev, size)}",
        f"data.src_lang={src}",
        f"data.tgt_lang={tgt}",
        f"train.max_steps={updates}",
        f"train.precision={precision}",
        "train.eval_every=0",
        "train.eval_on_start=false",
        "train.eval_bleu_sentences=4",  # the one validation at the end: kept short
        "train.save_every=0",
        f"train.log_every={log_every}",
    ]


def child_tf(run: Path, out: Path, sets: list[str]) -> dict:
    """`tf train configs/finetune.yaml --init RUN`, in this process; its tokens/s and peak."""
    from typer.testing import CliRunner

    from cli.main import app

    args = ["train", "configs/finetune.yaml", "--init", str(run), "--out", str(out), "--force"]
    result = CliRunner().invoke(app, args + [a for s in sets for a in ("--set", s)])
    if result.exit_code != 0:
        raise RuntimeError(result.output[-2000:])
    windows = [
        record["tokens_per_s"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "tokens_per_s" in (record := json.loads(line))
    ]
    last = out / "checkpoints" / "last.pt"
    return {
        "tokens_per_s": statistics.mean(windows[1:]),
        "peak_rss_gb": peak_rss_gb(),
        "checkpoint_mb": last.stat().st_size / 1e6,
    }


# peft's names for the attention projections of M2M100's and Marian's layers: tf's q, k, v, o
PEFT_ATTENTION = ["q_proj", "k_proj", "v_proj", "out_proj"]


def child_transformers(
    directory: Path, run: Path, sets: list[str], updates: int, lora_rank: int = 0
) -> dict:
    """The transformers user's loop over tf's batches of the same settings (see the module
    docstring), timed after two warm-up updates; with `lora_rank`, through peft's LoRA on the
    attention projections (alpha 16, as tf's default), AdamW over the adapters."""
    from cli.config import load_config
    from cli.training.data import batching
    from cli.training.distributed import Dist
    from cli.training.init import with_init
    from data.pipeline import prepare_training_data

    overrides = sets + [f"train.init={run}"]
    config = with_init(load_config("configs/finetune.yaml", overrides))
    data = prepare_training_data(config.data, batching(config, Dist()), out_dir(run), False)
    update = transformers_update(directory, config, lora_rank)
    tokens, seconds = 0, 0.0
    batches = iter(data.train)
    for step in range(updates):
        batch = next(batches)
        start = time.perf_counter()
        update([batch])
        if step >= 2:
            tokens, seconds = tokens + batch.n_tgt_tokens, seconds + time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "peak_rss_gb": peak_rss_gb()}


def transformers_update(
    directory: Path, config: Config, lora_rank: int = 0
) -> Callable[[list], None]:
    """The transformers user's update (`model(**batch).loss`, backward, clipping, AdamW) of
    the model in `directory`, as a function of tf's batches; with `lora_rank`, peft's LoRA."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(directory)
    if lora_rank:
        import peft

        adapters = peft.LoraConfig(r=lora_rank, lora_alpha=16, target_modules=PEFT_ATTENTION)
        model = peft.get_peft_model(model, adapters)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.train.lr)
    dtype = autocast_dtype(config.train.precision, torch.device("cpu"))

    def update(batches: list) -> None:
        for batch in batches:
            labels = batch.tgt_out.masked_fill(batch.tgt_pad_mask, -100)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = model(
                    input_ids=batch.src, attention_mask=~batch.src_pad_mask, labels=labels
                ).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, config.train.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def out_dir(run: Path) -> Path:
    """A tokenizer folder for the transformers loop's batches (tf's pipeline copies it)."""
    return run.parent / "finetune-bench-tokenizer"


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def run(
    updates: int = 30,
    precisions: tuple[str, ...] = ("auto",),
    out: Path = OUT,
    log_every: int = 5,
    size: str = "opus",
) -> dict:
    """Both loops at each precision, in fresh processes, on the bundled corpus, with the
    stand-in of `size` (STANDINS: "tiny" on 2,000 pairs shows the benchmark runs; its numbers
    mean nothing)."""
    directory, imported = standin_run(out, size)
    # Files of the whole corpus where the stand-in's languages need names of their own.
    whole = None if languages(size) == ("es", "en") else 28_045
    train = corpus_head("train", 2000 if size.endswith("tiny") else whole, out)
    dev = corpus_head("dev", 40, out)
    vocabulary = json.loads((directory / "config.json").read_text())["vocab_size"]
    results: dict = {"cpu": cpu_name(), "updates": updates, "vocabulary": vocabulary, "size": size}
    for precision in precisions:
        resolved = autocast_dtype(precision, torch.device("cpu"))
        name = "bf16" if resolved == torch.bfloat16 else "fp32"
        sets = tf_settings(updates, name, train, dev, log_every, size)
        common = [str(directory), str(imported), json.dumps(sets), str(updates)]
        tf = json.loads(run_python("-m", "benchmarks.finetune_bench", "child-tf", *common))
        hf = json.loads(run_python("-m", "benchmarks.finetune_bench", "child-hf", *common))
        results[name] = {
            "tf": tf,
            "transformers": hf,
            "ratio": tf["tokens_per_s"] / hf["tokens_per_s"],
        }
    return results


def print_results(r: dict) -> None:
    print(
        f"CPU: {r['cpu']}; the {r['size']} stand-in, vocabulary {r['vocabulary']:,}; "
        f"{r['updates']} updates each"
    )
    rows = [("precision", "loop", "target tokens/s", "peak RSS (GB)", "tf / transformers")]
    for name in ("fp32", "bf16"):
        if name not in r:
            continue
        for loop in ("tf", "transformers"):
            m = r[name][loop]
            ratio = f"{r[name]['ratio']:.2f}x" if loop == "tf" else ""
            rows.append((name, loop, f"{m['tokens_per_s']:,.0f}", f"{m['peak_rss_gb']:.2f}", ratio))
    print_table(rows)


def child(argv: list[str]) -> None:
    kind, directory, imported, sets, updates, *lora = argv
    sets, updates = json.loads(sets), int(updates)
    if kind == "child-tf":
        result = child_tf(Path(imported), Path(imported).parent / "finetune-bench-tf", sets)
    else:
        rank = int(lora[0]) if lora else 0
        result = child_transformers(Path(directory), Path(imported), sets, updates, rank)
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("child-"):
        child(sys.argv[1:])
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--updates", type=int, default=30)
        parser.add_argument("--precision", nargs="+", default=["auto"])
        parser.add_argument("--size", choices=list(STANDINS), default="opus")
        args = parser.parse_args()
        print_results(run(args.updates, tuple(args.precision), size=args.size))
