"""`make demo`, the README's first command: its recipe fits the CPU, and the whole target runs
(at a tiny size here: the fixture's pairs, a tiny model, three updates)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from cli import device
from cli.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_recipe_fits_the_cpu(monkeypatch):
    """Native bf16: configs/demo.yaml; fp32 only: the narrower configs/demo-fp32.yaml; each
    says why, and both exist."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(device, "autocast_dtype", lambda *args: torch.bfloat16)
    config, why = device.demo_config(cpu)
    assert config == "configs/demo.yaml" and "native bf16" in why
    monkeypatch.setattr(device, "autocast_dtype", lambda *args: None)
    config, why = device.demo_config(cpu)
    assert config == "configs/demo-fp32.yaml" and "no native bf16" in why
    config, why = device.demo_config(torch.device("cuda"))  # where `tf train` would run it
    assert config == "configs/demo.yaml" and "CUDA" in why
    assert all((ROOT / c).is_file() for c in ("configs/demo.yaml", "configs/demo-fp32.yaml"))


def test_make_demo_runs_its_recipe_at_a_tiny_size(tiny_prefix, tmp_path):
    sets = [
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "data.vocab_size=100",
        "model.d_model=32",
        "model.d_ff=64",
        "train.max_time=0",
        "train.max_steps=3",
        "train.max_tokens=512",
        "train.eval_bleu_sentences=5",
        "decode.max_len_b=8",
    ]
    run = tmp_path / "demo"
    make = [
        "make",
        "-s",
        "demo",
        "-o",  # this interpreter's environment, installed already: no pip under test workers
        ".venv/.installed",
        f"BIN={Path(sys.executable).parent}",
        f"DEMO_RUN={run}",
        "DEMO_SET=" + " ".join(f"--set {s}" for s in sets),
        f"SRC={tiny_prefix}-dev.es",
        f"REF={tiny_prefix}-dev.en",
    ]
    done = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    chosen, why = device.demo_config()
    assert f"demo: {why}" in done.stderr  # which recipe, and why
    assert (run / "checkpoints" / "last.pt").is_file()
    trained = load_config(run / "config.yaml")  # the recipe chosen is the one trained
    assert trained.train.lr == load_config(ROOT / chosen).train.lr
    lines = done.stdout.rstrip("\n").split("\n")  # a tiny model's output may hold U+2028
    assert len(lines) == 5 + 3, lines  # 5 translations, then the scores and BLEU's detail
    assert lines[5].startswith("BLEU = ") and lines[6].startswith("chrF = ")
    assert "BP = " in lines[7]
