"""Structured pruning: a smaller dense model, exact when what it removes did nothing."""

from __future__ import annotations

import torch
from test_cli import assert_user_error, tf

from cli.commands.prune import prune
from cli.training.checkpoint import load_checkpoint, load_for_inference
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
    sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}", "train.max_steps=2"]
    args = ["train", "tiny", "--init", str(out), "--out", str(run)]
    tuned = tf(*args, *[a for s in sets for a in ("--set", s)], "--set", "train.eval_every=0")
    assert tuned.exit_code == 0, tuned.output
    model = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert model["encoder.layers.0.linear1.weight"].shape[0] == 32  # tiny's 64 halved
    assert_user_error(tf("prune", trained, "-o", tmp_path / "x.pt", "--heads", "4"), "--heads 4")
    assert_user_error(tf("prune", trained, "-o", tmp_path / "x.pt", "--ffn", "1.0"), "--ffn")
