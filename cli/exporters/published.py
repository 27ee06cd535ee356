"""What an export publishes of its run: the run's config and tokenizer files, with nothing of
the machine that trained it.

A run records its paths absolute (`cli.runs.run_dir.anchored`: corpora, tokenizer, init), so
that it resumes from anywhere; SentencePiece records the folder it was trained into. An export
is made to be shared: every exporter writes its `tf_config.yaml` through `save_published_config`
and its tokenizer models through `copy_tokenizer_models`, and the model card reads the same
`published_config`, so that they name those settings by their names alone (`shown_spec`), as
`/health` names a served model.
"""

from __future__ import annotations

from pathlib import Path

from cli.config import TF_CONFIG, Config, save_config, with_paths
from data.files import shown_spec
from data.tokenizer_base import BaseTokenizer


def published_config(config: Config) -> Config:
    """`config` with every setting that names files or folders (the schema marks them:
    `with_paths`) by its name alone (`shown_spec`): a local path or corpus by its last
    component, hub names and `bundled:` corpora as they are."""
    return with_paths(config, shown_spec)


def save_published_config(config: Config, out: Path) -> None:
    """`out/tf_config.yaml`: the run's config as `tf translate DIR` and `tf import DIR` read it,
    its paths by their names (`published_config`)."""
    save_config(published_config(config), out / TF_CONFIG)


def copy_tokenizer_models(tokenizer: BaseTokenizer, out: Path) -> None:
    """The tokenizer's files (`model_paths`) into `out`, as `digest` hashes them (`content`):
    its SentencePiece models (tf's, an imported model's) less where and on how many threads
    they were trained, which changes none of their pieces; its other files as they are."""
    for path in tokenizer.model_paths():
        (out / path.name).write_bytes(tokenizer.content(path))
