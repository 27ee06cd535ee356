"""What every family's import shares once the family has read its files: the `Plan` it makes
of them (the run's config, the tokenizer, the names of the weights, the generation settings,
checked before any weight is read), and the run written from it (`import_plan`): the weights
checked against config.json's model and loaded (`cli.importers.weights`), the run written
beside its place and renamed into it, import.json and the report.

A family (the records of `cli.families`: Marian's, NLLB-200's and M2M100's, mBART-50's) says
only what differs: which files to download, and how its config.json, tokenizer and languages
make a `Plan`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cli.config import TF_CONFIG, Config, ConfigError, check_config, load_config, save_config
from cli.exporters.hf_tokenizer import exported_order
from cli.importers.generation import Generation
from cli.importers.source import IDS
from cli.importers.weights import (
    WeightFiles,
    check_tensors,
    empty_model,
    expected_shapes,
    load_weights,
    open_weights,
    weights_file_record,
)
from cli.runs.checkpoint import checkpoint_dict, save_atomic
from cli.runs.run_dir import RunDir
from data.config import direction_of
from data.errors import InputError
from data.tokenizer import Tokenizer
from data.tokenizer_base import BaseTokenizer
from model.transformer import Transformer


@dataclass
class Plan:
    """A model's files as a `tf` run, everything but the weights read and checked.

    Attributes:
        config: the run's config (its model: the family's switches and config.json's values).
        tokenizer: the model's own, which the run keeps.
        names: the family's weight-name table (`model/`: `marian_weights`, `m2m100_weights`,
            `mbart_weights`): the tensors its files hold for a model.
        vocab_rows: (source, target) rows of the files' vocabulary matrices, config.json's
            (the tokenizer's ids may be fewer: the rows past them are never read).
        computed: tables a file may keep that tf computes (`check_weights` checks them).
        check_weights: the family's own checks of the files (None: none).
        index: our id i is the file's index[i] (a `tf` export's vocabulary order); None: same.
        generation: the generation settings read (None: a `tf` export's run config has them).
        notes: the family's lines for the report (its languages, rows left out).
        record: what import.json keeps of the family's reading, besides the source and weights.
    """

    config: Config
    tokenizer: BaseTokenizer
    names: Callable[[Transformer], dict[str, torch.Tensor]]
    vocab_rows: tuple[int, int]
    computed: tuple[str, ...] = ()
    check_weights: Callable[[WeightFiles], None] | None = None
    index: torch.Tensor | None = None
    generation: Generation | None = None
    notes: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


def import_plan(plan: Plan, directory: Path, out: Path, origin: str) -> str:
    """The weights of `directory` read into the plan's model and the run written to `out`;
    returns the report for the user."""
    tok = plan.tokenizer
    with open_weights(directory) as files:
        if not any(name.startswith("model.") for name in files):  # a MarianModel: no head
            files = files.renamed(lambda name: f"model.{name}")
        pads = (tok.src_pad_id, tok.pad_id)
        expected = expected_shapes(plan.config.model, plan.vocab_rows, pads, plan.names)
        check_tensors(files, expected, plan.config.model, plan.computed)
        if plan.check_weights is not None:
            plan.check_weights(files)
        model = empty_model(plan.config.model, tok)
        load_weights(model, files, plan.index)
        found = files.found
    record = {"source": origin, **weights_file_record(found), **plan.record}
    if plan.generation is not None:
        record["generation"] = plan.generation.record()
    write_run(model, tok, plan.config, out, record)
    settings = plan.generation.report() if plan.generation else []
    return "\n".join([report(out, model, tok, plan.config), *plan.notes, *settings])


def exported_run(
    directory: Path, hf: dict[str, Any]
) -> tuple[Config, BaseTokenizer, list[int], dict[str, Any]]:
    """The config and tokenizer of the run a `tf export --to huggingface` came from (its
    config beside the weights), how its ids map onto the export's (the export's id i is the
    run's order[i]: `exported_order`), and config.json's token ids in the run's own."""
    try:
        config = load_config(directory / TF_CONFIG)
    except ConfigError as e:
        raise InputError(str(e)) from None
    tokenizer = Tokenizer.load(directory)
    order = exported_order(directory, tokenizer)
    hf = hf | {key: order[hf[key]] for key in IDS if _is_id(hf.get(key), len(order))}
    return config, tokenizer, order, hf


def index_of(order: list[int]) -> torch.Tensor | None:
    """`Plan.index` of an export's order (`exported_run`: its id i is the run's order[i]):
    None where the export kept the run's ids, as an imported kind's own files do, whose two
    vocabularies may differ in size (one index of the source's would overrun the target's)."""
    if order == list(range(len(order))):
        return None
    return torch.argsort(torch.tensor(order))


def _is_id(value: Any, size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size


def checked(config: Config, directory: Path) -> Config:
    """`config` checked as every run's is, a problem naming the model's config.json."""
    try:
        return check_config(config, str(directory / "config.json"))
    except ConfigError as e:
        raise InputError(str(e)) from None


def write_run(
    model: Transformer, tokenizer: BaseTokenizer, config: Config, out: Path, origin: dict
) -> None:
    """RUN/config.yaml, RUN/tokenizer/ (the model's files, and what tf reads of transformers'
    settings: `BaseTokenizer.save_settings`), RUN/checkpoints/last.pt at step 0, RUN/import.json
    (where from); written beside `out`, then renamed into it."""
    staging = out.with_name(f".{out.name}.importing")
    shutil.rmtree(staging, ignore_errors=True)
    run = RunDir(staging)
    try:
        run.tokenizer.mkdir(parents=True)
        for path in tokenizer.model_paths():
            shutil.copyfile(path, run.tokenizer / path.name)
        tokenizer.save_settings(run.tokenizer, config.data.src_lang, config.data.tgt_lang)
        imported = Tokenizer.load(run.tokenizer)
        save_config(config, run.config)
        checkpoint = checkpoint_dict(
            model.state_dict(), config.to_dict(), imported.digest(), step=0, imported=origin
        )
        save_atomic(checkpoint, run.checkpoints / "last.pt")
        (staging / "import.json").write_text(json.dumps(origin, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def named_direction(config: Config) -> str:
    """What the model translates, as the report names it: a many-to-many model's languages
    ("any of 202 languages into any"), a one-way model's direction (a `tf` export's: its
    corpora's), a multilingual one's as its card names it ("gem->gem", "en->mul")."""
    d = config.data
    if d.languages:
        return f"any of {len(d.languages)} languages into any"
    ways = d.translates()
    return direction_of(*ways[0]) if len(ways) == 1 else direction_of(d.src_lang, d.tgt_lang)


def report(out: Path, model: Transformer, tokenizer: BaseTokenizer, config: Config) -> str:
    c = model.config
    vocab = f"{tokenizer.src_vocab_size}" + (
        "" if tokenizer.joint else f"/{tokenizer.tgt_vocab_size}"
    )
    lines = [
        f"{out}: {named_direction(config)}, {model.num_parameters() / 1e6:.1f}M parameters "
        f"(d_model {c.d_model}, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
        f"{c.n_heads} heads, FFN {c.d_ff} {c.activation}), vocabulary {vocab}"
    ]
    if tokenizer.tags and tokenizer.lang_token is not None:  # its tags are that form's
        lines.append(
            f"target-language tokens ({len(tokenizer.tags)}): {' '.join(tokenizer.tags)}; "
            "start a source with one to choose the output language"
        )
    elif tokenizer.tags and not tokenizer.languages:
        lines.append(f"tags: {' '.join(tokenizer.tags)}")
    return "\n".join(lines)


def few(items: Sequence[str], n: int = 8) -> str:
    """`items` joined, the first n and the last where there are more ("a, b, ..., z")."""
    if len(items) <= n + 1:
        return ", ".join(items)
    return f"{', '.join(items[:n])}, ..., {items[-1]}"
