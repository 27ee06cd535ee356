"""`tf prune`: structured pruning into a genuinely smaller dense model.

In every attention module the `heads` heads with the smallest norm go (all of W_q, W_k, W_v
rows and W_o columns of the head), and in every feed-forward block the fraction `ffn` of units
with the smallest norm (a row of W_1 with its bias, a column of W_2). What is left is copied
into a model built for the new shapes (`n_heads` fewer, `d_head` kept, `d_ff` smaller), so every
matmul is smaller. Unstructured, element-wise pruning would save nothing on dense kernels.

A short fine-tune usually wins back what pruning costs: `tf train CONFIG --init CKPT`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from cli.config import Config
from cli.runs.checkpoint import checkpoint_dict, save_atomic
from cli.runs.model_dirs import resolve_checkpoint
from cli.runs.models import build_model, load_for_inference
from data.errors import InputError
from data.files import check_output
from data.tokenizer import Tokenizer
from model.attention import MultiheadAttention
from model.transformer import DecoderLayer, EncoderLayer, Transformer


def run_prune(run: str, out: Path, heads: int, ffn: float) -> str:
    """Prune RUN's model into the checkpoint OUT, with its tokenizer beside it."""
    check_output(out)
    model, tokenizer, config = load_for_inference(run, torch.device("cpu"))
    beside = (out.parent.parent if out.parent.name == "checkpoints" else out.parent) / "tokenizer"
    copy = tokenizer_to_place(tokenizer, beside)  # checked before any work
    pruned, new_config = prune(model, tokenizer, config, heads, ffn)
    source, _ = resolve_checkpoint(run)
    if copy:  # first: `tf translate OUT` finds the tokenizer next to it
        copy_tokenizer(tokenizer, beside)
    ckpt = checkpoint_dict(
        pruned.state_dict(), new_config.to_dict(), tokenizer.digest(), pruned_from=str(source)
    )
    save_atomic(ckpt, out)
    before, after = model.num_parameters(), pruned.num_parameters()
    return f"{out}: {after / 1e6:.2f}M parameters (from {before / 1e6:.2f}M)"


def tokenizer_to_place(tokenizer: Tokenizer, beside: Path) -> bool:
    """Whether `tokenizer` must still be copied into `beside`, where the pruned checkpoint's
    readers look for it. Another tokenizer there is refused, not replaced: it belongs to the
    checkpoints already beside it, which replacing it would break."""
    if Tokenizer.found_in(beside):
        if Tokenizer.load(beside).digest() != tokenizer.digest():
            raise InputError(
                f"{beside}: holds another tokenizer than {tokenizer.directory}, the pruned "
                "model's; write the pruned checkpoint into another folder"
            )
        return False
    if beside.exists() and not (beside.is_dir() and not any(beside.iterdir())):
        raise InputError(
            f"{beside}: exists and is no tokenizer folder; write the pruned checkpoint elsewhere"
        )
    return True


def copy_tokenizer(tokenizer: Tokenizer, beside: Path) -> None:
    """Copy the tokenizer's folder to `beside` whole or not at all: into a temporary folder
    next to it, renamed into place (over an empty folder, or none)."""
    tmp = beside.with_name(f".{beside.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed earlier copy
    try:
        shutil.copytree(tokenizer.directory, tmp)
        os.replace(tmp, beside)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prune(
    model: Transformer, tokenizer: Tokenizer, config: Config, heads: int, ffn: float
) -> tuple[Transformer, Config]:
    """The pruned model and its config: `heads` fewer heads per attention module, the fraction
    `ffn` of feed-forward units removed in every layer."""
    c = config.model
    if not 0 <= heads < c.n_heads:
        raise InputError(f"--heads {heads}: the model has {c.n_heads} heads per attention")
    if not 0 <= ffn < 1:
        raise InputError(f"--ffn {ffn}: a fraction of the feed-forward units in [0, 1)")
    d_head = c.d_head or c.d_model // c.n_heads
    d_ff = max(1, c.d_ff - round(c.d_ff * ffn))
    new_model_config = replace(c, n_heads=c.n_heads - heads, d_head=d_head, d_ff=d_ff)
    new_config = replace(config, model=new_model_config)
    pruned = build_model(new_config, tokenizer)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name, module in model.named_modules():
        if isinstance(module, MultiheadAttention):
            _keep_heads(weights, name, module, c.n_heads - heads)
        elif isinstance(module, (EncoderLayer, DecoderLayer)):
            _keep_units(weights, name, module, d_ff)
    pruned.load_state_dict(weights)
    return pruned.eval(), new_config


def _keep_heads(weights: dict, name: str, module: MultiheadAttention, keep: int) -> None:
    """The `keep` heads of largest norm, in their order, into `weights`."""
    H, dh = module.n_heads, module.d_head
    w = module.in_proj_weight.detach().view(3, H, dh, -1)  # (q/k/v, H, d_head, D)
    o = module.out_proj.weight.detach().view(-1, H, dh)  # (D, H, d_head)
    norms = w.pow(2).sum(dim=(0, 2, 3)) + o.pow(2).sum(dim=(0, 2))  # (H,)
    kept = norms.topk(keep).indices.sort().values  # (keep,)
    weights[f"{name}.in_proj_weight"] = w[:, kept].reshape(3 * keep * dh, -1).clone()
    bias = module.in_proj_bias.detach().view(3, H, dh)
    weights[f"{name}.in_proj_bias"] = bias[:, kept].reshape(-1).clone()
    weights[f"{name}.out_proj.weight"] = o[:, kept].reshape(o.size(0), -1).clone()


def _keep_units(weights: dict, name: str, layer: EncoderLayer | DecoderLayer, keep: int) -> None:
    """The `keep` feed-forward units of largest norm, in their order, into `weights`."""
    w1, b1 = layer.linear1.weight.detach(), layer.linear1.bias.detach()  # (F, D), (F,)
    w2 = layer.linear2.weight.detach()  # (D, F)
    norms = w1.pow(2).sum(1) + b1.pow(2) + w2.pow(2).sum(0)  # (F,)
    kept = norms.topk(keep).indices.sort().values
    weights[f"{name}.linear1.weight"] = w1[kept].clone()
    weights[f"{name}.linear1.bias"] = b1[kept].clone()
    weights[f"{name}.linear2.weight"] = w2[:, kept].clone()
