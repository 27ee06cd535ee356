"""The run directory: its layout, its tokenizer, its metrics file, the RNG state a checkpoint
carries, and the policy for starting, forcing and resuming a run.

    RUN/config.yaml          the resolved config
    RUN/tokenizer/           the SentencePiece model(s), and settings.json: what they were
                             trained with (a run reuses them only for the same settings)
    RUN/metrics.jsonl        one JSON object per log line / validation
    RUN/checkpoints/last.pt, best.pt, step_N.pt   (see `cli.training.checkpoint`)
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from cli.config import Config, config_diff, load_config, save_config
from cli.files import atomic_output, check_output
from data.tokenizer import Tokenizer, train_tokenizer

log = logging.getLogger(__name__)


class TrainingError(Exception):
    """Training cannot go on (non-finite losses, a refused resume); one line for the user."""


@dataclass
class RunDir:
    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tokenizer(self) -> Path:
        return self.path / "tokenizer"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def data_report(self) -> Path:
        return self.path / "data.json"  # per training corpus: read, removed by rule, kept

    def step_checkpoints(self) -> list[Path]:
        """`step_N.pt` files, oldest first."""
        found = [
            (int(m.group(1)), p)
            for p in self.checkpoints.glob("step_*.pt")
            if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))
        ]
        return [p for _, p in sorted(found)]


# ------------------------------------------------------------------------- a new or resumed run


def start_run(config: Config, out: Path, force: bool) -> RunDir:
    """Lay out a new run directory; never clobber an existing run unless forced."""
    run = RunDir(out)
    if out.exists() and not out.is_dir():
        raise TrainingError(f"{out}: is a file; --out needs a directory")
    check_output(run.config)
    if (run.checkpoints / "last.pt").exists() or run.metrics.exists():
        if not force:
            raise TrainingError(
                f"{out}: already holds a run; use --resume {out}, another --out, "
                "or --force to start it afresh"
            )
        shutil.rmtree(run.checkpoints, ignore_errors=True)
        run.metrics.unlink(missing_ok=True)
    run.path.mkdir(parents=True, exist_ok=True)
    save_config(config, run.config)
    return run


# What a resumed run cannot change: the checkpoint's weights have the model's shapes, its
# embeddings belong to the tokenizer, and its batch positions name batches of this data cut by
# this budget and seed. Dropout can change; so can everything in `train` not listed here.
FIXED_ON_RESUME = (
    "model.",
    "data.train",
    "data.src_lang",
    "data.tgt_lang",
    "data.vocab_size",
    "data.tokenizer_type",
    "data.joint_vocab",
    "data.character_coverage",
    "data.tokenizer",
    "data.max_len",  # and data.max_len_ratio: the filters decide which pairs the batches hold
    "data.clean",
    "data.dev",  # and data.test: cleaning drops the training pairs found in them
    "data.test",
    "train.max_tokens",
    "train.max_sentences",
    "train.seed",
)
CHANGEABLE_ON_RESUME = ("model.dropout:", "model.attention_dropout:", "model.activation_dropout:")


def resume_config(
    run: RunDir, config_path: str | None, overrides: list[str], allow_changes: bool
) -> Config:
    """The run's saved config plus any new overrides; a change is refused unless allowed, and
    a change of what the checkpoint depends on (FIXED_ON_RESUME) always."""
    if not run.path.is_dir():
        raise TrainingError(f"{run.path}: no such run directory")
    if not run.config.is_file():
        raise TrainingError(f"{run.path}: not a run directory (no config.yaml)")
    saved = load_config(run.config)
    wanted = (
        load_config(config_path, overrides) if config_path else load_config(run.config, overrides)
    )
    changes = config_diff(saved.to_dict(), wanted.to_dict())
    fixed = [
        c
        for c in changes
        if c.startswith(FIXED_ON_RESUME) and not c.startswith(CHANGEABLE_ON_RESUME)
    ]
    if fixed:
        raise TrainingError(
            f"{run.config}: cannot change when resuming ({'; '.join(fixed)}): the checkpoint's "
            "weights, tokenizer and batch positions depend on it; start a new run instead"
        )
    if changes:
        listing = "; ".join(changes)
        if not allow_changes:
            raise TrainingError(
                f"{run.config}: resuming with a changed config ({listing}); "
                "pass --allow-config-change to accept"
            )
        log.warning("resuming with a changed config: %s", listing)
    return wanted


# -------------------------------------------------------------------------- the run's tokenizer


TOKENIZER_SETTINGS = "settings.json"  # beside the model(s): what the tokenizer was trained with


def tokenizer_settings(config: Config, corpus) -> dict[str, Any]:
    """What a run's tokenizer must have been trained with to serve `config`."""
    d = config.data
    return {
        "tokenizer_type": d.tokenizer_type,
        "vocab_size": d.vocab_size,
        "joint_vocab": d.joint_vocab,
        "character_coverage": d.character_coverage,
        "corpus": d.train if isinstance(d.train, str) else [asdict(c) for c in d.corpora()],
        "corpus_fingerprint": corpus._fingerprint,  # the corpus's content, through `datasets`
        **({"tags": d.tags()} if d.tags() else {}),  # (absent for untagged runs, as before tags)
    }


def prepare_tokenizer(config: Config, run: RunDir, train_corpus, resume: bool) -> Tokenizer:
    """The run's tokenizer, (re)trained unless the one there was trained as `config` asks.

    A resumed run never retrains: its checkpoint's embeddings belong to its tokenizer, so a
    config asking for another one is an error naming both.
    """
    if config.data.tokenizer:
        return adopt_tokenizer(Path(config.data.tokenizer), run, resume)
    wanted = tokenizer_settings(config, train_corpus)
    if Tokenizer.found_in(run.tokenizer):
        found = read_tokenizer_settings(run.tokenizer)
        if found == wanted:
            return Tokenizer.load(run.tokenizer)
        if resume:
            if found is None:  # trained before settings were recorded; the digest still checks
                return Tokenizer.load(run.tokenizer)
            differ = [k for k in wanted if k != "corpus_fingerprint" and found.get(k) != wanted[k]]
            if not differ:  # the same corpus spec, touched since: resume as the checkpoint says
                return Tokenizer.load(run.tokenizer)
            listing = ", ".join(f"{k} {found.get(k)!r} (config: {wanted[k]!r})" for k in differ)
            raise TrainingError(f"{run.tokenizer}: the run's tokenizer was trained with {listing}")
        log.info("the tokenizer in %s does not match the config: retraining it", run.tokenizer)
    log.info(
        "training a %s tokenizer (vocab %d) on %d pairs",
        config.data.tokenizer_type,
        config.data.vocab_size,
        len(train_corpus),
    )
    return train_tokenizer_for(config, train_corpus, run.tokenizer)


def adopt_tokenizer(source: Path, run: RunDir, resume: bool) -> Tokenizer:
    """`data.tokenizer`: a copy of the tokenizer in `source` becomes the run's own (so the run
    directory stays self-contained); a resumed run must still have that same tokenizer."""
    wanted = Tokenizer.load(source)
    if Tokenizer.found_in(run.tokenizer):
        have = Tokenizer.load(run.tokenizer)
        if have.digest() == wanted.digest():
            return have
        if resume:
            raise TrainingError(
                f"{run.tokenizer}: is not the tokenizer in {source} (data.tokenizer)"
            )
    shutil.rmtree(run.tokenizer, ignore_errors=True)
    run.tokenizer.mkdir(parents=True)
    for path in wanted.model_paths():
        shutil.copyfile(path, run.tokenizer / path.name)
    log.info("using the tokenizer of %s", source)
    return Tokenizer.load(run.tokenizer)


def read_tokenizer_settings(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / TOKENIZER_SETTINGS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


TOKENIZER_PAIRS = 1_000_000  # SentencePiece samples 2M sentences of them (both sides, joint)


def tokenizer_sample(n: int, seed: int) -> np.ndarray | None:
    """The rows the tokenizer reads: all of a corpus up to TOKENIZER_PAIRS, else a seeded
    sample of that many in corpus order, so that its time and memory stay bounded."""
    if n <= TOKENIZER_PAIRS:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, TOKENIZER_PAIRS, replace=False))


def sentences(corpus, side: str, rows: np.ndarray | None, stage: str) -> Iterator[str]:
    """One side's sentences of `rows` (None: all), read in Arrow batches, with a bar."""
    part = corpus.select_columns([side])
    part = part if rows is None else part.select(rows)
    with tqdm(total=len(part), desc=stage, unit=" lines", leave=False, disable=None) as bar:
        for batch in part.iter(batch_size=10_000):
            bar.update(len(batch[side]))
            yield from batch[side]


def train_tokenizer_for(config: Config, corpus, out_dir: Path) -> Tokenizer:
    """Train the tokenizer `config.data` asks for into `out_dir`, recording its settings."""
    d = config.data
    rows = tokenizer_sample(len(corpus), config.train.seed)
    tokenizer = train_tokenizer(
        sentences(corpus, "src", rows, "tokenizer: reading sources"),
        sentences(corpus, "tgt", rows, "tokenizer: reading targets"),
        out_dir,
        vocab_size=d.vocab_size,
        model_type=d.tokenizer_type,
        joint=d.joint_vocab,
        character_coverage=d.character_coverage,
        seed=config.train.seed,
        tags=d.tags(),
    )
    with atomic_output(out_dir / TOKENIZER_SETTINGS) as f:
        json.dump(tokenizer_settings(config, corpus), f, indent=1)
    return tokenizer


# ------------------------------------------------------------------------ RNG state


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every RNG a training step draws from; on CUDA, this rank's device's generator only (a
    resume may see another number of visible GPUs)."""
    state = {"torch": torch.get_rng_state(), "python": python_rng_to_list(random.getstate())}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(python_rng_from_list(state["python"]))
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)


def python_rng_to_list(state: tuple) -> list:
    """random.getstate() as lists and ints, which `torch.load(weights_only=True)` accepts."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def python_rng_from_list(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
