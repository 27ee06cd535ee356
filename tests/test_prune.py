"""Structured pruning: a smaller dense model, exact when what it removes did nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.commands.prune import prune
from cli.config import ConfigError, load_config
from cli.runs.checkpoint import load_checkpoint, save_atomic
from cli.runs.models import load_for_inference
from cli.training.init import with_init
from data.tokenizer import Tokenizer, train_tokenizer
from model.transformer import count_parameters


def zero_some_heads_and_units(model) -> None:
    """Zero head 1 of every attention module and the first 40% of every FFN's units: their
    contribution to every output is then exactly nothing."""
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "in_proj_weight"):
                H, dh = module.n_heads, module.d_head
                module.in_proj_weight.view(3, H, dh, -1)[:, 1] = 0
                module.in_proj_bias.view(3, H, dh)[:, 1] = 0
                module.out_proj.weight.view(-1, H, dh)[:, 1] = 0
            if hasattr(module, "linear1"):
                n = round(0.4 * module.linear1.out_features)  # what --ffn 0.4 removes
                module.linear1.weight[:n] = 0
                module.linear1.bias[:n] = 0
                module.linear2.weight[:, :n] = 0


def test_pruning_what_was_zero_leaves_the_output_unchanged(trained):
    model, tokenizer, config = load_for_inference(trained, torch.device("cpu"))
    zero_some_heads_and_units(model)
    pruned, new_config = prune(model, tokenizer, config, heads=1, ffn=0.4)
    assert new_config.model.n_heads == config.model.n_heads - 1
    assert new_config.model.d_ff < config.model.d_ff
    V = tokenizer.tgt_vocab_size
    assert pruned.num_parameters() == count_parameters(new_config.model, V, V)
    assert pruned.num_parameters() < model.num_parameters()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, V, (3, 7), generator=g)
    tgt = torch.randint(4, V, (3, 5), generator=g)
    src_pad = torch.arange(7)[None] >= torch.tensor([7, 4, 2])[:, None]
    with torch.no_grad():
        model, pruned = model.double(), pruned.double()
        expected = model(src, tgt, src_pad, None)
        got = pruned(src, tgt, src_pad, None)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_prune_command_then_translate_and_fine_tune(trained, tiny_prefix, tmp_path):
    out = tmp_path / "pruned" / "model.pt"
    result = tf("prune", trained, "-o", out, "--heads", "2", "--ffn", "0.5")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(out)["config"]["model"]["n_heads"] == 2
    assert (tmp_path / "pruned" / "tokenizer").is_dir()
    translated = tf("translate", out, "--greedy", input="Y dijo Dios.\n")
    assert translated.exit_code == 0, translated.output
    run = tmp_path / "tuned"
    sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.max_steps=2"]
    args = ["train", "tiny", "--init", str(out), "--out", str(run)]
    tuned = tf(*args, *[a for s in sets for a in ("--set", s)], "--set", "train.eval_every=0")
    assert tuned.exit_code == 0, tuned.output
    model = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert model["encoder.layers.0.linear1.weight"].shape[0] == 32  # tiny's 64 halved
    assert_user_error(tf("prune", trained, "-o", tmp_path / "x.pt", "--heads", "4"), "--heads 4")
    assert_user_error(tf("prune", trained, "-o", tmp_path / "x.pt", "--ffn", "1.0"), "--ffn")


# --- train.init: the checkpoint's shapes and tokenizer, the config's every other setting ---------


def other_tokenizer(tiny_prefix: str, out: Path) -> Path:
    """A tokenizer of another vocabulary than the `trained` run's, in `out`."""
    src = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text(encoding="utf-8").splitlines()
    train_tokenizer(src, tgt, out, vocab_size=90, seed=0)
    return out


def checkpoint_beside_tokenizer(trained: Path, folder: Path, **model: object) -> Path:
    """The `trained` run's best.pt copied into `folder` (with its config's model section
    changed by `model`), with the run's tokenizer beside it."""
    ckpt = load_checkpoint(trained / "checkpoints" / "best.pt")
    ckpt["config"]["model"].update(model)
    shutil.copytree(trained / "tokenizer", folder / "tokenizer")
    save_atomic(ckpt, folder / "model.pt")
    return folder / "model.pt"


def test_init_takes_shapes_and_tokenizer_and_keeps_every_other_setting(trained, tmp_path):
    init = checkpoint_beside_tokenizer(trained, tmp_path / "init", max_positions=40)
    sets = [f"train.init={init}", "model.dropout=0.3", "model.attention_dropout=0.2"]
    wide = ["model.d_model=64", "model.n_heads=8", "model.d_ff=128", "model.tie_embeddings=none"]
    config = with_init(load_config("tiny", sets + wide))
    saved = load_checkpoint(init)["config"]["model"]
    for shape in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "tie_embeddings"):
        assert getattr(config.model, shape) == saved[shape], shape
    assert (config.model.dropout, config.model.attention_dropout) == (0.3, 0.2)
    # Positions are a computed sinusoidal table, no weights: the config's limit holds (the
    # checkpoint's 40 is below tiny's data.max_len 64, and training died at position 62).
    assert config.model.max_positions == 256
    assert Path(config.data.tokenizer) == tmp_path / "init" / "tokenizer"


def test_init_checks_the_merged_config(trained, tmp_path):
    """A hand-edited checkpoint config: 3 heads do not divide d_model 32."""
    init = checkpoint_beside_tokenizer(trained, tmp_path / "init", n_heads=3)
    with pytest.raises(ConfigError, match="model.d_model 32 is not divisible by model.n_heads 3"):
        with_init(load_config("tiny", [f"train.init={init}"]))


def test_init_refuses_a_tokenizer_its_checkpoint_was_not_trained_with(
    trained, tiny_prefix, tmp_path
):
    init = checkpoint_beside_tokenizer(trained, tmp_path / "init")
    other = other_tokenizer(tiny_prefix, tmp_path / "other")
    sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.max_steps=1"]
    args = ["train", "tiny", "--init", init, *[a for s in sets for a in ("--set", s)]]
    named = tf(*args, "--out", tmp_path / "a", "--set", f"data.tokenizer={other}")
    assert_user_error(named, f"{init}: was trained with another tokenizer than", str(other))
    shutil.rmtree(tmp_path / "init" / "tokenizer")
    shutil.copytree(other, tmp_path / "init" / "tokenizer")  # what `tf prune` used to leave
    beside = tf(*args, "--out", tmp_path / "b")
    assert_user_error(beside, f"{init}: was trained with another tokenizer than")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_prune_into_a_folder_with_another_tokenizer_is_refused(trained, tiny_prefix, tmp_path):
    other = other_tokenizer(tiny_prefix, tmp_path / "elsewhere" / "tokenizer")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    out = tmp_path / "elsewhere" / "model.pt"
    result = tf("prune", trained, "-o", out, "--heads", "1")
    assert_user_error(result, str(other), "another tokenizer")
    assert not out.exists()
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    # An empty folder of that name is filled, whole.
    (tmp_path / "empty" / "tokenizer").mkdir(parents=True)
    result = tf("prune", trained, "-o", tmp_path / "empty" / "model.pt", "--heads", "1")
    assert result.exit_code == 0, result.output
    digest = Tokenizer.load(tmp_path / "empty" / "tokenizer").digest()
    assert digest == load_checkpoint(tmp_path / "empty" / "model.pt")["tokenizer_digest"]
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["model.pt", "tokenizer"]
