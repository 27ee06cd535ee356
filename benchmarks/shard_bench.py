"""Per-rank memory of `train.shard` (FSDP2) against DDP: two Gloo ranks on the CPU (issue 58).

Each mode runs in two fresh processes (torch.multiprocessing's spawn), which build the same
model as `tf train` (`build_model`, the `base`-like shape below unless told otherwise), wrap it
as the trainer does (`shard.shard_model`, or DistributedDataParallel), build the trainer's Adam
and run a few updates (forward, backward, the optimiser step) on random batches of the same
shape. Reported per rank: peak resident memory (VmHWM: weights, gradients, Adam's moments,
activations, the model as built before sharding, and what torch itself takes), the megabytes
of weights, gradients and moments the rank holds after an optimiser step (what sharding
divides), and seconds per update. On a CPU both ranks share
the machine's memory and cores: the figures are what each process holds, not a GPU's.

    python -m benchmarks.shard_bench [--d-model 512] [--layers 6] [--vocab 32000] [--updates 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from benchmarks.common import cpu_name, print_table
from benchmarks.train_bench import peak_resident_mb
from cli.config import load_config
from cli.runs.models import build_model
from cli.training import distributed, shard
from cli.training.optim import build_optimizer
from cli.training.trainer import batch_loss
from data.batching import collate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, mode: str, port: int, sizes: dict[str, int], out: str) -> None:
    """One rank: the model wrapped as `mode` says, `updates` updates; writes its figures."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)  # two ranks on a shared CPU, as torchrun's OMP_NUM_THREADS=1
    dd, device = distributed.init("cpu")
    d, layers, vocab = sizes["d_model"], sizes["layers"], sizes["vocab"]
    config = load_config(
        "tiny",
        [
            f"model.d_model={d}",
            f"model.d_ff={4 * d}",
            "model.n_heads=8",
            f"model.n_encoder_layers={layers}",
            f"model.n_decoder_layers={layers}",
            "model.dropout=0.0",
            "train.precision=fp32",
        ]
        + (["train.shard=true"] if mode == "shard" else []),
    )
    vocabulary = SimpleNamespace(src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0, src_pad_id=0)
    torch.manual_seed(0)
    model = build_model(config, vocabulary)
    shard.shard_model(model, mode == "shard", dd, device)
    net = model  # wrapped as the trainer wraps it (`Trainer.training_module`)
    if mode == "ddp":
        net = DistributedDataParallel(model, broadcast_buffers=False, gradient_as_bucket_view=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, _ = build_optimizer(params, config.train, d, device)
    generator = torch.Generator().manual_seed(rank)
    took = []
    for _ in range(sizes["updates"]):
        rows = torch.randint(3, vocab, (16, 2, 32), generator=generator).tolist()
        batch = collate([r[0] for r in rows], [r[1] for r in rows], 0, 1, 2, list(range(16)))
        start = time.perf_counter()
        loss, _ = batch_loss(net, batch, 0.1)
        (loss / 1000).backward()
        optimizer.step()
        held = held_mb(params, optimizer)
        optimizer.zero_grad(set_to_none=True)
        took.append(time.perf_counter() - start)
    Path(out, f"{mode}_{rank}").write_text(f"{peak_resident_mb():.0f} {held:.0f} {min(took):.2f}")
    distributed.shutdown(dd)


def held_mb(params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> float:
    """What this rank holds of the weights, their gradients and Adam's moments: the part
    sharding divides (DDP's gradient buckets are the gradients themselves: bucket views)."""
    tensors = [*params, *(p.grad for p in params if p.grad is not None)]
    tensors += [t for s in optimizer.state.values() for t in s.values() if t.dim()]
    return sum(shard.local(t).nbytes for t in tensors) / 2**20


def run(d_model: int = 512, layers: int = 6, vocab: int = 32000, updates: int = 3) -> list:
    """Both modes, two ranks each; rows of (mode, rank, peak MB, held MB, s/update)."""
    sizes = {"d_model": d_model, "layers": layers, "vocab": vocab, "updates": updates}
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for mode in ("ddp", "shard"):
            mp.spawn(rank_main, (mode, free_port(), sizes, out), nprocs=2)
            for rank in (0, 1):
                rows.append((mode, rank, *Path(out, f"{mode}_{rank}").read_text().split()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6, help="encoder layers (as many decoder)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--updates", type=int, default=3)
    args = parser.parse_args()
    rows = run(args.d_model, args.layers, args.vocab, args.updates)
    d, n = args.d_model, args.layers
    params = args.vocab * d + n * 12 * d * d + n * 16 * d * d  # embeddings, encoder, decoder
    print(f"{cpu_name()}; fp32; d_model {d}, {n}+{n} layers, vocabulary {args.vocab} (tied):")
    print(
        f"~{params / 1e6:.0f}M parameters, ~{16 * params / 2**20:.0f} MB of weights, "
        "gradients and Adam moments"
    )
    print_table([("mode", "rank", "peak RSS MB", "held MB", "s/update (best)"), *rows])


if __name__ == "__main__":
    main()
