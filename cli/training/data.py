"""A training run's data, through `data.pipeline`: the settings it takes from the run's config
and rank, and the progress bars it shows on a terminal."""

from __future__ import annotations

import sys

from tqdm import tqdm

from cli.config import Config
from cli.training import distributed
from data.pipeline import Batching, TrainingData, prepare_training_data


def progress_bar(stage: str, total: int) -> tqdm:
    """A bar for one stage of preparing a corpus (shown on a terminal only)."""
    return tqdm(total=total, desc=stage, unit=" pairs", unit_scale=True, leave=False, disable=None)


def batching(config: Config, dd: distributed.Dist) -> Batching:
    t = config.train
    return Batching(
        max_tokens=t.max_tokens,
        max_sentences=t.max_sentences,
        seed=t.seed,
        max_positions=config.model.max_positions,
        eval_bleu_sentences=t.eval_bleu_sentences,
        decoder_start=config.model.decoder_start,
        rank=dd.rank,
        world_size=dd.world_size,
        update_freq=t.update_freq,
    )


def training_data(
    config: Config, tokenizer_dir, dd: distributed.Dist, resume: bool
) -> TrainingData:
    """The tokenizer, batches and dev sets of a run (see `data.pipeline`)."""
    return prepare_training_data(
        config.data,
        batching(config, dd),
        tokenizer_dir,
        resume,
        progress=progress_bar,
        show_bars=sys.stderr.isatty(),
    )
