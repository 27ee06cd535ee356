"""Shared test setup: no network, a private `datasets` cache, a 200-pair fixture, a tokenizer."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
_CACHE_DIR: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module imports `datasets` (which reads these once, at import)."""
    global _CACHE_DIR
    # No test may reach the hub: unknown names fail at once instead of retrying for seconds.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    # A cache of our own: tests leave ~/.cache alone and never see stale entries.
    _CACHE_DIR = tempfile.mkdtemp(prefix="tf-tests-hf-")
    os.environ["HF_DATASETS_CACHE"] = _CACHE_DIR
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    # Under pytest-xdist each worker gets its share of the cores for torch, in it and in the `tf`
    # processes it starts (which read OMP_NUM_THREADS): N workers of N threads each would thrash.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)  # the cores xdist counted
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_DIR:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_prefix() -> str:
    """Path prefix of 200 Spanish-English pairs (the head of bible-es-en dev): PREFIX.es/.en."""
    return str(FIXTURES / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory, tiny_prefix: str):
    """A joint BPE tokenizer of 100 pieces trained on the fixture (well under a second)."""
    from data.tokenizer import train_tokenizer

    src = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text(encoding="utf-8").splitlines()
    return train_tokenizer(src, tgt, tmp_path_factory.mktemp("tokenizer"), vocab_size=100, seed=0)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_prefix: str) -> Path:
    """A tiny run trained for 6 steps through `tf train` (tokenizer trained inside): validations
    at steps 3 and 6, step checkpoints every 2 (tiny.yaml keeps the last 2)."""
    from typer.testing import CliRunner

    from cli.main import app

    run = tmp_path_factory.mktemp("trained") / "run"
    sets = [
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.max_steps=6",
        "train.save_every=2",
        "train.eval_every=3",
    ]
    args = ["train", "tiny", "--out", str(run)] + [a for s in sets for a in ("--set", s)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return run
