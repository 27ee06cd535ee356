"""Sharded training (`train.shard`): PyTorch's FSDP2 (`fully_shard`) in place of DDP.

Each encoder and decoder layer is one unit, the root (embeddings, generator, final norms) the
last: a rank holds 1/N of every weight, gradient and Adam moment, and gathers a unit's weights
only while it runs. Gradients are reduce-scattered as the mean over ranks, as DDP's all-reduce,
so the trainer's loss normalisation, clipping and non-finite checks read them the same way
(DTensors, whose norm is the global one). Checkpoints are ordinary: the full weights and the
plain `torch.optim` state of the full parameters, gathered to rank 0; they load at any world
size, sharded or not. Without sharding (`is_sharded` false) every helper here does what a
plain model or optimiser does.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.utils._pytree import SUPPORTED_NODES, register_dataclass

from cli.training.distributed import Dist
from model.attention import KVCache

log = logging.getLogger(__name__)

# Gathered to rank 0, on the CPU (the other ranks get {}): no device holds a full copy.
GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Every rank reads the checkpoint itself and keeps its own shard of it.
SCATTER = StateDictOptions(full_state_dict=True)


def shard_model(model: nn.Module, on: bool, dd: Dist, device: torch.device) -> None:
    """Shard `model` in place over the ranks if `on` (`train.shard`): each layer, then the
    root. Call it before the optimiser is built, which must hold the shards. In one process:
    nothing to shard."""
    if not on:
        return
    if not dd.active:
        log.info("train.shard: one process, nothing to shard; training as without it")
        return
    # FSDP2 shards what each rank holds and broadcasts nothing: rank 0's weights everywhere
    # first, as DDP does (the ranks built theirs after different work: the data, a tokenizer).
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)
    mesh = init_device_mesh(device.type, (dd.world_size,))
    if KVCache not in SUPPORTED_NODES:
        # The cross-attention's keys and values, a unit's output: FSDP2 finds the tensors of
        # an output (to gather the weights again for their backward) through pytree.
        register_dataclass(KVCache)
    # Those keys and values are views, only read by the attention: FSDP2's warning about
    # in-place ops on a view does not apply.
    warnings.filterwarnings("ignore", "FSDP2-wrapped module .FSDPCrossAttention. returned a view")
    for layer in model.decoder.layers:
        # The root projects the encoder output for every layer's cross-attention before the
        # layers run (`Decoder.project_memory`): that unit gathers its weights there too.
        fully_shard(layer.multihead_attn, mesh=mesh)
        for method in ("project_memory", "forward_with_probabilities"):
            register_fsdp_forward_method(layer.multihead_attn, method)
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def local(tensor: Tensor) -> Tensor:
    """This rank's part of a sharded tensor; a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def replicated(tensor: Tensor) -> Tensor:
    """A plain tensor of a replicated result (the global gradient norm), as DDP's would be."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@contextmanager
def no_sync(net: nn.Module, model: nn.Module) -> Iterator[None]:
    """Gradients kept on this rank, not reduced (a micro-batch before the last of an update):
    DDP's `no_sync` on `net`, or FSDP2's switch on the sharded `model`."""
    if not is_sharded(model):
        with net.no_sync():
            yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def zero_row(grad: Tensor, row: int) -> None:
    """grad[row] = 0, on whichever rank holds that row of a tensor sharded by rows."""
    if not isinstance(grad, DTensor):
        grad[row].zero_()
        return
    mine = grad.to_local()
    first = dist.get_rank() * -(-grad.size(0) // dist.get_world_size())  # torch.chunk's split
    if first <= row < first + mine.size(0):
        mine[row - first].zero_()


def model_state(model: nn.Module) -> dict[str, Tensor]:
    """The full weights (every rank takes part; rank 0 gets them, the others {})."""
    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=GATHER)


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state as a plain `torch.optim` state dict of the full parameters: what
    `optimizer.state_dict()` gives without sharding (every rank takes part; rank 0 gets it)."""
    if not is_sharded(model):
        return optimizer.state_dict()
    named = get_optimizer_state_dict(model, optimizer, options=GATHER)
    if not named:
        return {}
    index = {name: i for i, name in enumerate(parameter_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]
    return {"state": {index[n]: s for n, s in named["state"].items()}, "param_groups": groups}


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each parameter the optimiser holds, in its order: the numbers a plain state
    dict gives them (a tied weight has one, its first name)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def load_model_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Full weights into the model, each rank keeping its shard of them.

    Raises:
        RuntimeError: as `load_state_dict`'s, naming the keys missing or unexpected.
    """
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    # A tied weight is one parameter under several names, all in a state dict: FSDP loads it
    # under its first name (it refuses the others).
    aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    aliases -= {n for n, _ in model.named_parameters()}
    wanted = set(model.state_dict()) - aliases
    if wanted != set(state) - aliases:
        missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted - aliases)
        raise RuntimeError(f"loading the weights: missing {missing}, unexpected {unexpected}")
    mine = {k: v for k, v in state.items() if k not in aliases}
    set_model_state_dict(model, mine, options=StateDictOptions(full_state_dict=True, strict=False))


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """A plain `torch.optim` state dict (`optimizer_state`'s) into the optimiser, each rank
    keeping its shard of the moments."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    names = parameter_names(model, optimizer)
    named = {
        "state": {names[i]: s for i, s in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, named, options=SCATTER)


def full_copy(model: nn.Module, build: Callable[[], nn.Module]) -> nn.Module | None:
    """On rank 0, a plain model (`build()`, on the sharded one's device) holding the full
    weights; None on the others. Every rank takes part: validation's decoding runs on rank 0
    alone, outside the forward passes through which FSDP gathers a unit's weights. Not
    sharded: None everywhere (the model itself decodes)."""
    if not is_sharded(model):
        return None
    state = model_state(model)
    if not state:
        return None
    plain = build()
    plain.load_state_dict(state)
    return plain.to(local(next(model.parameters())).device)
