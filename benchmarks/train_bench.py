"""Training-step throughput: `tf`'s model against the same step built from `torch.nn.Transformer`.

Both get the same dims, the same real batches of the corpus (token-budget bucketing), the same
label-smoothed loss and Adam; the reference computes logits for every (padded) target position,
as a straightforward implementation does, while `tf` projects only real target tokens. The two
are timed alternately in one process, so machine noise hits both alike; the ratio is the result.

    python -m benchmarks.train_bench [--config small] [--batches 6] [--repeats 3]
    python -m benchmarks.train_bench --config base --device cuda --precision bf16 --compile
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import OUT, corpus_batches, print_table, run_python
from cli.config import load_config
from cli.device import configure_device
from cli.training.optim import build_optimizer
from cli.training.trainer import batch_loss
from model.transformer import ModelConfig, Transformer, sinusoidal_positions


class Reference(nn.Module):
    """Embeddings (x sqrt(D) + sinusoidal), torch.nn.Transformer (Post-LN), tied generator.

    nn.Transformer applies its one `dropout` everywhere: residual, attention probabilities and
    after the ReLU. With `matched`, the attention and activation dropouts are set to the tf
    config's, so both models compute the same function and only the implementation differs.
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, pad_id: int, matched: bool = False
    ) -> None:
        super().__init__()
        D = config.d_model
        self.embed = nn.Embedding(vocab_size, D, padding_idx=pad_id)
        self.register_buffer(
            "positions", sinusoidal_positions(config.max_positions, D), persistent=False
        )
        self.transformer = nn.Transformer(
            D,
            config.n_heads,
            config.n_encoder_layers,
            config.n_decoder_layers,
            config.d_ff,
            config.dropout,
            batch_first=True,
            norm_first=False,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.scale = math.sqrt(D)
        if matched:
            t = self.transformer
            for layer in [*t.encoder.layers, *t.decoder.layers]:
                layer.self_attn.dropout = config.attention_dropout
                layer.dropout.p = config.activation_dropout  # the one after the ReLU
            for layer in t.decoder.layers:
                layer.multihead_attn.dropout = config.attention_dropout

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * self.scale + self.positions[: ids.size(1)])

    def forward(self, src, tgt_in, src_pad_mask, tgt_pad_mask) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=src.device, dtype=torch.bool
        )
        hidden = self.transformer(
            self.embed_tokens(src),
            self.embed_tokens(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad_mask,
            tgt_key_padding_mask=tgt_pad_mask,
            memory_key_padding_mask=src_pad_mask,
            tgt_is_causal=True,
        )
        return hidden @ self.embed.weight.T  # (B, T, V): every position, padding included


def ours_loss(model: Transformer, batch, eps: float) -> torch.Tensor:
    """As the trainer computes it: the output layer and the loss at the real positions only."""
    loss, _ = batch_loss(model, batch, eps)
    return loss / batch.n_tgt_tokens


def reference_loss(model: Reference, batch, eps: float, pad_id: int) -> torch.Tensor:
    logits = model(batch.src, batch.tgt_in, batch.src_pad_mask, batch.tgt_pad_mask)  # (B,T,V)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(),
        batch.tgt_out.flatten(),
        ignore_index=pad_id,
        label_smoothing=eps,
        reduction="sum",
    )
    return loss / batch.n_tgt_tokens


def build(which: str, config, tokenizer, device: torch.device, compile: bool = False):
    """A function doing one training step of model `which`: "tf", "reference" (torch's dropout
    everywhere) or "reference_matched" (dropout placed as in the tf config)."""
    torch.manual_seed(0)
    eps = config.train.label_smoothing
    if which == "tf":
        model = Transformer(
            config.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id
        ).to(device)
        net = torch.compile(model) if compile else model

        def loss_fn(batch):
            return ours_loss(net, batch, eps)
    else:
        matched = which == "reference_matched"
        model = Reference(config.model, tokenizer.tgt_vocab_size, tokenizer.pad_id, matched)
        model = model.to(device)

        def loss_fn(batch):
            return reference_loss(model, batch, eps, tokenizer.pad_id)

    optimizer, _ = build_optimizer(model.parameters(), config.train, config.model.d_model, device)
    model.train()

    def step(batch, dtype) -> None:
        with torch.autocast(device.type, dtype=dtype) if dtype else nullcontext():
            loss = loss_fn(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def time_pass(step, batches, dtype, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for b in batches:
        step(b, dtype)
    synchronize(device)
    return time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def peak_rss_mb(which: str, config_name: str, precision: str, batches, tokenizer) -> float:
    """Peak resident memory of a fresh process that only loads the batches and trains `which`
    on them (loading the corpus would otherwise set the peak)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batches.pt"
        torch.save(batches, path)
        vocab = (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id)
        code = (
            "from benchmarks.train_bench import memory_probe; "
            f"memory_probe({which!r}, {config_name!r}, {precision!r}, {str(path)!r}, {vocab})"
        )
        stdout = run_python("-c", code)
    return float(stdout.strip().splitlines()[-1])


def memory_probe(
    which: str, config_name: str, precision: str, path: str, vocab: tuple[int, int, int]
) -> None:
    config = load_config(config_name)
    batches = torch.load(path, weights_only=False)  # our own file, just written
    tokenizer = SimpleNamespace(src_vocab_size=vocab[0], tgt_vocab_size=vocab[1], pad_id=vocab[2])
    cpu = torch.device("cpu")
    configure_device(cpu)
    time_pass(build(which, config, tokenizer, cpu), batches, DTYPES[precision], cpu)
    print(peak_resident_mb())


def peak_resident_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM belongs to the address space, which
    exec replaces; ru_maxrss would still carry the forking parent's peak."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cuda_peak_mb(name: str, config, tokenizer, batches, dtype, device) -> float:
    """Peak GPU memory of one model's training passes alone: weights, optimiser state and
    activations of a freshly built `name`, not the other models resident beside it."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step = build(name.removesuffix("_compiled"), config, tokenizer, device)
    time_pass(step, batches[:2], dtype, device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del step
    torch.cuda.empty_cache()
    return peak / 2**20


# Dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets, for
# model FLOPs utilisation (MFU); the first name contained in torch.cuda.get_device_name wins.
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
    "V100": 125.0,
    "T4": 65.0,
    "4090": 165.0,
}


def gpu_peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def training_flops(model: ModelConfig, vocab_size: int, batches) -> float:
    """Matmul FLOPs of forward + backward (3x forward) over the batches, counted on real tokens
    (the attention products over the batch's padded lengths), as MFU is usually reckoned."""
    D, F, L_enc, L_dec = model.d_model, model.d_ff, model.n_encoder_layers, model.n_decoder_layers
    total = 0.0
    for b in batches:
        src, tgt = b.n_src_tokens, b.n_tgt_tokens
        S, T = b.src.size(1), b.tgt_in.size(1)
        enc = src * L_enc * (8 * D * D + 4 * D * F + 4 * S * D)
        dec = tgt * L_dec * (12 * D * D + 4 * D * F + 4 * T * D + 4 * S * D)
        dec += src * L_dec * 4 * D * D  # cross-attention keys and values of the source
        total += 3 * (enc + dec + tgt * 2 * D * vocab_size)
    return total


def run(
    config_name: str = "small",
    n_batches: int = 6,
    repeats: int = 3,
    device_name: str = "cpu",
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    compile: bool = False,
    memory: bool = True,
    pairs: int | None = None,
    out: Path = OUT,
) -> dict:
    """Tokens/s of each model and precision (medians of alternating repeats), ratios, memory;
    on the corpus's first batches (of its first `pairs` pairs), tokenizer kept in `out`."""
    device = torch.device(device_name)
    configure_device(device)  # as `tf train` does; process-wide, so for both models alike
    config = load_config(config_name)
    tokenizer, batches = corpus_batches(config, n_batches, pairs=pairs, out=out)
    batches = [b.to(device) for b in batches]
    tokens = sum(b.n_tgt_tokens for b in batches)
    names = ("tf", "reference", "reference_matched")
    steps = {name: build(name, config, tokenizer, device) for name in names}
    if compile:
        steps["tf_compiled"] = build("tf", config, tokenizer, device, compile=True)
    flops = training_flops(config.model, tokenizer.tgt_vocab_size, batches)
    peak_tflops = gpu_peak_tflops(device)
    results: dict[str, float] = {"target_tokens_per_pass": tokens, "batches": len(batches)}
    for precision in precisions:
        dtype = DTYPES[precision]
        for step in steps.values():  # warm-up: allocator, autocast caches, compilation
            time_pass(step, batches[:2], dtype, device)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(repeats):
            for name, step in steps.items():  # alternate, so noise hits both alike
                times[name].append(time_pass(step, batches, dtype, device))
        for name in steps:
            seconds = statistics.median(times[name])
            results[f"{name}_{precision}_tokens_per_s"] = tokens / seconds
            results[f"{name}_{precision}_tflops"] = flops / seconds / 1e12
            if peak_tflops:
                results[f"{name}_{precision}_mfu"] = flops / seconds / 1e12 / peak_tflops
            if memory and device.type == "cuda":
                results[f"{name}_{precision}_peak_mb"] = cuda_peak_mb(
                    name, config, tokenizer, batches, dtype, device
                )
            elif memory and name != "tf_compiled":
                results[f"{name}_{precision}_peak_mb"] = peak_rss_mb(
                    name, config_name, precision, batches[:2], tokenizer
                )
    ref = results[f"reference_{precisions[0]}_tokens_per_s"]
    for key in [k for k in results if k.endswith("_tokens_per_s")]:
        results[key.replace("_tokens_per_s", f"_vs_reference_{precisions[0]}")] = results[key] / ref
    return results


def print_results(r: dict, precisions: tuple[str, ...]) -> None:
    base = precisions[0]
    rows = [
        (
            "model",
            "precision",
            "target tokens/s",
            f"vs reference {base}",
            "TFLOP/s",
            "MFU",
            "peak MB",
        )
    ]
    for name in ("tf", "tf_compiled", "reference", "reference_matched"):
        for precision in precisions:
            key = f"{name}_{precision}"
            if f"{key}_tokens_per_s" not in r:
                continue
            rows.append(
                (
                    name,
                    precision,
                    f"{r[f'{key}_tokens_per_s']:,.0f}",
                    f"{r[f'{key}_vs_reference_{base}']:.2f}x",
                    f"{r[f'{key}_tflops']:.2f}",
                    f"{r[f'{key}_mfu']:.1%}" if f"{key}_mfu" in r else "-",
                    f"{r[f'{key}_peak_mb']:,.0f}" if f"{key}_peak_mb" in r else "-",
                )
            )
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    precisions = tuple(args.precision)
    r = run(args.config, args.batches, args.repeats, args.device, precisions, args.compile)
    print_results(r, precisions)


if __name__ == "__main__":
    main()
