"""`tf export`: a trained model for CTranslate2 or Hugging Face `transformers` (a directory
that `AutoModelForSeq2SeqLM` and `AutoTokenizer` load, with a model card to upload as it is):
a `MarianMTModel`, or the class of an NLLB-200, M2M100 or mBART-50 layout, whichever family's
switches the model's are (`cli.families.registry.exporting_family`)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import torch

from cli.config import Config
from cli.exporters.ctranslate2 import export_ctranslate2
from cli.exporters.model_card import Exported, model_card, run_scores
from cli.families.family import Family
from cli.families.registry import exporting_family
from cli.runs.checkpoint import load_checkpoint
from cli.runs.model_dirs import resolve_checkpoint
from cli.runs.models import load_for_inference
from data.errors import InputError
from data.files import check_output_dir
from data.tokenizer_base import BaseTokenizer
from model.transformer import Transformer

ENGINES = {"ctranslate2": "ctranslate2", "huggingface": "transformers"}
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16")
QUANTIZATIONS += ("bfloat16", "float32")


def export_inputs(run: str) -> list[Path]:
    """What exporting RUN reads, which its output must neither replace nor lie inside: the
    checkpoint and its tokenizer, and the whole run when it is one (RUN, RUN/checkpoints/X.pt;
    a checkpoint kept beside a tokenizer/ folder leaves the folder holding them free)."""
    checkpoint, run_dir = resolve_checkpoint(run)
    inputs = [checkpoint, run_dir.tokenizer]
    return inputs + [run_dir.path] if checkpoint.parent == run_dir.checkpoints else inputs


def export_huggingface(
    model: Transformer, tokenizer: BaseTokenizer, config: Config, out: Path
) -> Family:
    """The Hugging Face class that runs the model, into `out`: M2M100's or mBART's for their
    layouts (Pre-LN, fairseq or learned positions), else Marian's; what none runs is refused
    in one line (`exporting_family`, each family's `check_exportable`). Returns the family."""
    family = exporting_family(model.config)
    family.export(model, tokenizer, config, out)
    return family


def run_export(run: str, to: str, out: Path, quantization: str | None, force: bool = False) -> str:
    """Export RUN (a run directory or checkpoint) into the new directory `out`."""
    if to not in ENGINES:
        raise InputError(f"--to {to}: expected one of {', '.join(ENGINES)}")
    if importlib.util.find_spec(ENGINES[to]) is None:
        raise InputError(f"--to {to} needs {ENGINES[to]}: pip install 'tf[export]'")
    if quantization is not None and to != "ctranslate2":
        raise InputError(f"--quantization {quantization}: only --to ctranslate2 quantizes")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InputError(
            f"--quantization {quantization}: CTranslate2 takes {', '.join(QUANTIZATIONS)}"
        )
    check_output_dir(out, force, "-o", export_inputs(run))
    model, tokenizer, config = load_for_inference(run, torch.device("cpu"))
    # Written beside `out` and renamed at the end: an error leaves no half-exported directory.
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    changed = []
    exported: Exported | None = None  # what the card says of a Hugging Face export's class
    try:
        if to == "ctranslate2":
            changed = export_ctranslate2(model, tokenizer, config, staging, quantization)
        else:
            staging.mkdir(parents=True)
            family = export_huggingface(model, tokenizer, config, staging)
            exported = family.exported(model, tokenizer)
            ckpt = load_checkpoint(resolve_checkpoint(run)[0])
            step, imported = ckpt.get("step"), ckpt.get("imported")
            card = model_card(model, tokenizer, config, exported, step, run_scores(run), imported)
            (staging / "README.md").write_text(card, encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    done = f"{out}: {to} model ({model.num_parameters() / 1e6:.2f}M parameters)"
    if changed:  # an imported model's transformers rules, which CTranslate2 has not
        done += f"\nnote: decoding as CTranslate2 searches: {'; '.join(changed)}"
    problem = exported.problem if exported is not None else None
    if problem:  # said where a user converting it looks first, and in the model card
        done += f"\nnote: ct2-transformers-converter would not convert it exactly: {problem}; "
        done += "tf export --to ctranslate2 does"
    return done
