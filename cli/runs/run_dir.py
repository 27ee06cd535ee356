"""The run directory: its layout, and its config's paths recorded absolute.

    RUN/config.yaml          the resolved config
    RUN/tokenizer/           the SentencePiece model(s), and settings.json: what they were
                             trained with (`data.pipeline` chooses them)
    RUN/metrics.jsonl        one JSON object per log line / validation
    RUN/checkpoints/last.pt, best.pt, step_N.pt   (see `cli.runs.checkpoint`)
    RUN/base.pt              a LoRA run's frozen weights (see `cli.runs.adapted`)

Every path a run's config names is recorded absolute (`anchored`), so that it resumes from any
working directory. Starting, restarting and resuming a run is training's (`cli.training.run`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cli.config import Config, with_paths

BASE = "base.pt"  # a LoRA run's frozen weights, beside checkpoints/


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
    def base(self) -> Path:
        return self.path / BASE

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


def anchored(config: Config, like: Config | None = None) -> Config:
    """`config` with every setting that names files or folders (the schema marks them:
    `with_paths`) absolute, read from the working directory (corpus specs by
    `data.corpus.anchored_spec`, which leaves hub names and `bundled:` corpora as they are): a
    run records them so, and resumes from anywhere. `like`: a run's saved config, whose value
    of a setting is kept where it names the same place, as it is written (a run recorded
    before paths were anchored keeps its relative ones, which its checkpoint's corpus records
    and its tokenizer's settings name)."""
    from data.corpus import anchored_spec  # (`datasets`, which `tf translate` need not load)

    return with_paths(config, anchored_spec, like)
