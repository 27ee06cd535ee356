"""LoRA runs (issue 58, item 1): `tf train --init RUN --set train.lora.rank=R` trains adapters
over frozen weights kept once in RUN/base.pt, checkpoints hold what trains, a resume continues
exactly, and every command that reads weights gets the adapters merged: an ordinary model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.runs.checkpoint import load_checkpoint
from cli.runs.models import load_for_inference
from data.text import read_file_lines

CPU = torch.device("cpu")


def lora_sets(tiny_prefix: str, *extra: str) -> list[str]:
    settings = [
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.lora.rank=4",
        "train.lr=0.01",
        "train.save_every=2",
        "train.eval_every=2",
        "train.eval_bleu_sentences=4",
        "train.deterministic=true",
        "train.precision=fp32",
        *extra,
    ]
    return [a for s in settings for a in ("--set", s)]


def adapt(init: Path, out: Path, tiny_prefix: str, *extra: str):
    return tf("train", "tiny", "--init", init, "--out", out, *lora_sets(tiny_prefix, *extra))


@pytest.fixture(scope="module")
def adapted(trained, tiny_prefix, tmp_path_factory) -> Path:
    """The tiny trained run, adapted for 4 updates (LoRA rank 4 on q, k, v, o)."""
    out = tmp_path_factory.mktemp("lora") / "run"
    result = adapt(trained, out, tiny_prefix, "train.max_steps=4")
    assert result.exit_code == 0, result.output
    return out


def test_checkpoints_hold_the_adapters_and_the_base_is_kept_once(adapted, trained):
    ckpt = load_checkpoint(adapted / "checkpoints" / "last.pt")
    names = set(ckpt["model"])
    assert names and all(".lora" in name for name in names), sorted(names)[:5]
    init = load_checkpoint(trained / "checkpoints" / "best.pt")["model"]
    base = load_checkpoint(adapted / "base.pt")["model"]
    assert base.keys() == init.keys() and all(torch.equal(base[k], init[k]) for k in init)
    assert ckpt["base"]["file"] == "base.pt" and len(ckpt["base"]["sha256"]) == 64
    # The optimizer holds the adapters alone: its moments are as many as the tensors kept.
    assert len(ckpt["optimizer"]["state"]) == len(names)
    full = (trained / "checkpoints" / "last.pt").stat().st_size
    assert (adapted / "checkpoints" / "last.pt").stat().st_size < full / 2


def test_the_frozen_weights_stay_and_the_merged_model_moved(adapted, trained):
    """What inference reads: the base with the adapters merged. Untargeted weights (the
    embeddings, norms, FFN) are the init's exactly; attention's moved, by a low-rank step."""
    merged, _, _ = load_for_inference(adapted, CPU)
    init = load_checkpoint(trained / "checkpoints" / "best.pt")["model"]
    state = merged.state_dict()
    assert state.keys() == init.keys()  # an ordinary model
    for name in ("src_embed.token.weight", "encoder.layers.0.linear1.weight"):
        assert torch.equal(state[name], init[name]), name
    norm = "decoder.layers.1.norm2.weight"
    assert torch.equal(state[norm], init[norm])
    name = "encoder.layers.0.self_attn.out_proj.weight"
    step = state[name] - init[name]
    assert step.abs().max() > 0
    assert torch.linalg.matrix_rank(step.double(), atol=1e-6) <= 4  # the adapters' rank


def test_a_resume_continues_exactly(trained, tiny_prefix, tmp_path):
    straight = tmp_path / "straight"
    assert adapt(trained, straight, tiny_prefix, "train.max_steps=4").exit_code == 0
    stopped = tmp_path / "stopped"
    assert adapt(trained, stopped, tiny_prefix, "train.max_steps=2").exit_code == 0
    again = tf("train", "--resume", stopped, "--set", "train.max_steps=4", "--allow-config-change")
    assert again.exit_code == 0, again.output
    a = load_checkpoint(straight / "checkpoints" / "last.pt")
    b = load_checkpoint(stopped / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 4 and a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_every_command_reads_the_merged_model(adapted, tiny_prefix, tmp_path):
    """translate, average, export (both formats) and distill take an adapted run; what they
    write is an ordinary model."""
    lines = "\n".join(read_file_lines(Path(f"{tiny_prefix}-dev.es"))[:5]) + "\n"
    out = tf("translate", adapted, "--greedy", "--set", "decode.precision=fp32", input=lines)
    assert out.exit_code == 0, out.output
    averaged = tmp_path / "averaged.pt"
    steps = sorted((adapted / "checkpoints").glob("step_*.pt"))
    assert tf("average", *steps, "-o", averaged).exit_code == 0
    plain = load_checkpoint(averaged)
    assert "base" not in plain and "src_embed.token.weight" in plain["model"]
    hf = tmp_path / "hf"
    assert tf("export", adapted, "--to", "huggingface", "-o", hf).exit_code == 0
    ct2 = tmp_path / "ct2"
    assert tf("export", adapted, "--to", "ctranslate2", "-o", ct2).exit_code == 0
    theirs = tf("translate", ct2, "--greedy", "--set", "decode.precision=fp32", input=lines)
    assert theirs.stdout == out.stdout
    # A new run from the adapted one starts from its merged weights.
    again = tf(
        "train", "finetune", "--init", adapted, "--out", tmp_path / "next",
        "--set", f"data.train={tiny_prefix}", "--set", f"data.dev={tiny_prefix}-dev",
        "--set", "train.max_steps=1", "--set", "train.eval_bleu_sentences=2",
    )  # fmt: skip
    assert again.exit_code == 0, again.output


def test_an_import_is_linked_not_copied(tiny_prefix, tmp_path):
    """The base of a run adapted from an import is the import's checkpoint itself, hard
    linked (its step 0 holds weights alone)."""
    from test_import import imported, small_standin

    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    out = tmp_path / "lora"
    result = tf(
        "train", "finetune", "--init", run, "--out", out,
        *lora_sets(tiny_prefix, "train.max_steps=1", "train.eval_on_start=false"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert os.stat(out / "base.pt").st_ino == os.stat(run / "checkpoints" / "last.pt").st_ino


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "setting, message",
    [
        ("train.lora.rank=-1", "train.lora"),
        ("train.lora.rank=100", "train.lora"),
        ("train.lora.targets=[q, qq]", "'qq'"),
        ("train.lora.alpha=0", "train.lora"),
        ("train.trainable=[norm]", "'norm'"),
    ],
)
def test_settings_that_make_no_sense_are_one_line(trained, tiny_prefix, tmp_path, setting, message):
    out = tmp_path / "run"
    assert_user_error(adapt(trained, out, tiny_prefix, setting), message)
    assert not out.exists()


def test_lora_needs_a_model_to_adapt_and_trainable_needs_lora(tiny_prefix, tmp_path):
    sets = ["--set", f"data.train={tiny_prefix}", "--set", "train.lora.rank=2"]
    assert_user_error(tf("train", "tiny", "--out", tmp_path / "a", *sets), "train.init")
    plain = ["--set", f"data.train={tiny_prefix}", "--set", "train.trainable=[norms]"]
    assert_user_error(tf("train", "tiny", "--out", tmp_path / "b", *plain), "train.lora.rank")


def test_a_resume_cannot_start_or_change_lora(trained, adapted, tmp_path):
    full = shutil.copytree(trained, tmp_path / "full")
    result = tf(
        "train", "--resume", full, "--allow-config-change",
        "--set", "train.lora.rank=4", "--set", f"train.init={trained}",
    )  # fmt: skip
    assert_user_error(result, "trained without LoRA")
    copy = shutil.copytree(adapted, tmp_path / "adapted")
    result = tf("train", "--resume", copy, "--allow-config-change", "--set", "train.lora.rank=8")
    assert_user_error(result, "train.lora")


def test_a_changed_base_is_refused_at_load_naming_the_file(adapted, tmp_path):
    copy = shutil.copytree(adapted, tmp_path / "adapted")
    base = load_checkpoint(copy / "base.pt")
    first = next(iter(base["model"]))
    base["model"][first] = base["model"][first] + 1
    torch.save(base, copy / "base.pt")
    result = tf("translate", copy, "--greedy", input="Hola\n")
    assert_user_error(result, str(copy / "base.pt"), "changed")
    (copy / "base.pt").unlink()
    assert_user_error(tf("translate", copy, "--greedy", input="Hola\n"), "base.pt", "missing")


def test_frozen_matrices_held_in_bf16_give_the_same_numbers():
    """`hold_frozen`: under bf16 autocast the frozen matrices were cast to bf16 for every
    matmul; held in bf16 the loss and the adapters' gradients are the same, bit for bit,
    and the layers' matrices take half the memory."""
    from cli.training.lora import hold_frozen
    from model.lora import LoraConfig, add_lora, freeze_for_lora
    from model.loss import label_smoothed_cross_entropy
    from model.transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2)
    model = Transformer(config, 50, 50, 0)
    add_lora(model, LoraConfig(rank=4, targets=["q", "v", "o", "ffn"]), torch.Generator())
    freeze_for_lora(model, ["norms"])
    for name, p in model.named_parameters():
        if name.endswith(".B"):
            torch.nn.init.normal_(p)  # adapters that change the outputs
    src, tgt = torch.randint(1, 50, (3, 7)), torch.randint(1, 50, (3, 6))

    def loss_and_grads():
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(src, tgt[:, :-1], src == 0, tgt[:, :-1] == 0)
        loss, _ = label_smoothed_cross_entropy(
            logits.float().flatten(0, 1), tgt[:, 1:].flatten(), 0.1
        )
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    before, grads = loss_and_grads()
    count, names = model.num_parameters(), model.state_dict().keys()
    hold_frozen(model, torch.bfloat16)
    assert model.num_parameters() == count  # the bf16 copy is no second parameter
    assert model.state_dict().keys() == names
    after, grads_after = loss_and_grads()
    assert torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_after))
    layer = model.encoder.layers[0]
    assert layer.self_attn.in_proj_weight.dtype == torch.bfloat16
    assert layer.linear1.weight.dtype == torch.bfloat16  # frozen under its adapter
    assert layer.norm1.weight.dtype == torch.float32  # trained: norms
    # The output layer: a bf16 copy of its own, the embeddings' lookup float32 as before.
    assert model.generator.weight.dtype == torch.bfloat16
    assert model.tgt_embed.token.weight.dtype == torch.float32


def test_an_unchanged_base_is_not_hashed_again_and_a_copied_one_is(adapted, tmp_path, monkeypatch):
    """Its size, inode and change time as recorded: loading skips hashing gigabytes. A copy
    (another inode) is hashed, and loads when the bytes are the same."""
    from cli.runs import adapted as base_store

    hashed = []
    real = base_store.file_sha256
    monkeypatch.setattr(base_store, "file_sha256", lambda path: hashed.append(path) or real(path))
    load_for_inference(adapted, CPU)
    assert hashed == []
    copy = shutil.copytree(adapted, tmp_path / "copy")
    load_for_inference(copy, CPU)
    assert hashed == [copy / "base.pt"]


def test_validation_decodes_the_merged_model_every_command_decodes(
    trained, tiny_prefix, tmp_path, monkeypatch, caplog
):
    """A bf16 run (its frozen matrices held in bf16): each validation decodes the model that
    `load_for_inference` builds from the checkpoint written with it, the base merged with the
    adapters in float32, bit for bit (it decoded the adapted model, whose numbers differ:
    dev BLEU 0.52 where `tf eval` gave 0.53); and the parameters counted at the start are the
    model's and its adapters', the output layer's bf16 copy not counted twice."""
    import logging

    from cli.training.trainer import Trainer
    from model.lora import LoraConfig, add_lora

    validated = []
    real = Trainer.validate

    def validate(self, model=None):
        validated.append((model if model is not None else self.weights.of_record).state_dict())
        return real(self, model)

    monkeypatch.setattr(Trainer, "validate", validate)
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="cli"):
        result = adapt(trained, out, tiny_prefix, "train.max_steps=2", "train.precision=bf16")
    assert result.exit_code == 0, result.output
    merged, _, config = load_for_inference(out / "checkpoints" / "last.pt", CPU)
    assert len(validated) == 1 and validated[0].keys() == merged.state_dict().keys()
    for name, value in merged.state_dict().items():
        assert torch.equal(validated[0][name], value), name
    add_lora(merged, LoraConfig(rank=4))  # q, k, v, o: the run's adapters
    counted = [r.getMessage() for r in caplog.records if "M parameters" in r.getMessage()]
    assert counted and f"{merged.num_parameters() / 1e6:.2f}M parameters" in counted[0]


def test_validation_merges_into_one_copy_and_reads_base_pt_once(
    trained, tiny_prefix, tmp_path, monkeypatch
):
    """Two validations build one plain copy and read RUN/base.pt once (each built a second
    model and read base.pt again); each decodes, bit for bit, what `load_for_inference` merges
    from the checkpoint written with it (the copy, merged into before, is merged into again)."""
    from cli.runs import adapted as base_store
    from cli.training import state
    from cli.training.trainer import Trainer

    calls, validated = [], []
    for owner, name in ((state, "plain_model"), (base_store, "base_weights")):
        real = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, lambda *a, real=real, name=name: calls.append(name) or real(*a)
        )
    real_validate = Trainer.validate

    def validate(self, model=None):
        weights = (model or self.weights.of_record).state_dict()
        validated.append((self.progress.step, {k: v.clone() for k, v in weights.items()}))
        return real_validate(self, model)

    monkeypatch.setattr(Trainer, "validate", validate)
    out = tmp_path / "run"
    sets = ("train.max_steps=2", "train.eval_every=1", "train.save_every=1")
    result = adapt(trained, out, tiny_prefix, *sets)
    assert result.exit_code == 0, result.output
    assert sorted(calls) == ["base_weights", "plain_model"]
    assert [step for step, _ in validated] == [1, 2]
    for step, weights in validated:
        merged = load_for_inference(out / "checkpoints" / f"step_{step}.pt", CPU)[0]
        for name, value in merged.state_dict().items():
            assert torch.equal(weights[name], value), (step, name)


def test_a_copied_base_is_hashed_once_then_its_copy_is_recorded(adapted, tmp_path, monkeypatch):
    """A copied run (another inode, another change time) hashes its base.pt at its first load
    only: the verified copy is recorded beside it (it was hashed again at every load,
    forever). A base changed after that is still refused."""
    from cli.runs import adapted as base_store

    hashed = []
    real = base_store.file_sha256
    monkeypatch.setattr(base_store, "file_sha256", lambda path: hashed.append(path) or real(path))
    copy = shutil.copytree(adapted, tmp_path / "copy")
    for _ in range(3):
        load_for_inference(copy, CPU)
    assert hashed == [copy / "base.pt"]
    base = load_checkpoint(copy / "base.pt")
    first = next(iter(base["model"]))
    base["model"][first] = base["model"][first] + 1
    torch.save(base, copy / "base.pt")
    assert_user_error(tf("translate", copy, "--greedy", input="Hola\n"), "base.pt", "changed")
