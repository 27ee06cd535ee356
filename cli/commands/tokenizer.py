"""`tf tokenizer train`: the SentencePiece model(s) a config asks for, on its training corpus."""

from __future__ import annotations

from pathlib import Path

from cli.config import load_config
from cli.files import check_output
from cli.training.data import joined, load_training_corpora
from cli.training.run import train_tokenizer_for


def run_tokenizer_train(config_path: str, overrides: list[str], out: Path) -> str:
    """Train into `out` (a run's tokenizer/ folder, reused by `tf train` when it matches)."""
    config = load_config(config_path, overrides)
    check_output(out / "settings.json")
    corpus = joined(load_training_corpora(config))
    tok = train_tokenizer_for(config, corpus, out)
    return (
        f"{out}: vocab {tok.src_vocab_size}/{tok.tgt_vocab_size}, "
        f"{'joint' if tok.joint else 'separate'}, trained on {len(corpus)} pairs"
    )
