"""`tf tokenizer train`: the SentencePiece model(s) a config asks for, on its training corpus."""

from __future__ import annotations

import sys
from pathlib import Path

from cli.config import load_config
from cli.training.data import progress_bar
from data.errors import counted
from data.files import check_output
from data.pipeline import joined, load_training_corpora, train_tokenizer_for
from data.tokenizer import TOKENIZER_SETTINGS


def run_tokenizer_train(config_path: str, overrides: list[str], out: Path) -> str:
    """Train into `out` (a run's tokenizer/ folder, reused by `tf train` when it matches)."""
    config = load_config(config_path, overrides)
    check_output(out / TOKENIZER_SETTINGS)
    corpus = joined(load_training_corpora(config.data, sys.stderr.isatty()))
    tok = train_tokenizer_for(config.data, corpus, out, config.train.seed, progress_bar)
    return (
        f"{out}: vocab {tok.src_vocab_size}/{tok.tgt_vocab_size}, "
        f"{'joint' if tok.joint else 'separate'}, trained on {counted(len(corpus), 'pair')}"
    )
