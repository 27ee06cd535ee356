"""The CUDA and NCCL code paths, proven as far as a CPU can: faked device capabilities, faked
visible-device counts, a scaler that skips, and host synchronisations counted."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cli import device as device_module
from cli.config import load_config
from cli.device import autocast_dtype
from cli.training import distributed
from cli.training.run import rng_state, set_rng_state, start_run
from cli.training.trainer import Trainer
from data.errors import InputError
from model.search import SearchSettings, beam_search, greedy_search, kernels

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_precision_asks_for_native_bf16(monkeypatch, native, expected):
    """A V100 or T4 answers is_bf16_supported() with True (emulation counts by default)."""

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return native or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert autocast_dtype("auto", CUDA) is expected


class FakeCuda:
    """Per-device CUDA generator states on a machine whose visible devices we choose."""

    def __init__(self, monkeypatch, count: int) -> None:
        self.states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(count)}
        self.count = count
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states.values()))

    def get(self, device="cuda") -> torch.Tensor:
        return self.states[torch.device(device).index or 0].clone()

    def set(self, state: torch.Tensor, device="cuda") -> None:
        index = torch.device(device).index or 0
        if index >= self.count:
            raise RuntimeError(f"invalid device ordinal {index}")
        self.states[index] = state.clone()


def test_each_rank_saves_and_restores_its_own_cuda_generator(monkeypatch):
    saved_on_eight = FakeCuda(monkeypatch, count=8)
    state = rng_state(torch.device("cuda", 3))  # rank 3 of a run on 8 GPUs
    assert torch.equal(state["cuda"], saved_on_eight.states[3])  # its own device only
    # Resumed where each process sees one GPU (CUDA_VISIBLE_DEVICES per rank): device 0.
    resumed_on_one = FakeCuda(monkeypatch, count=1)
    set_rng_state(state, torch.device("cuda", 0))
    assert torch.equal(resumed_on_one.states[0], saved_on_eight.states[3])


def tiny_trainer(tmp_path, prefix: str, *overrides: str) -> Trainer:
    config = load_config(
        "tiny",
        [f"data.train={prefix}", f"data.dev={prefix}-dev", "train.eval_every=0", *overrides],
    )
    run = start_run(config, tmp_path / "run", force=True)
    return Trainer(config, run, distributed.Dist(), torch.device("cpu"))


def test_a_run_without_a_loss_scale_resumes_as_fp16(tmp_path, tiny_prefix):
    """bf16 and fp32 runs save an empty GradScaler state; an fp16 resume must start a fresh
    scale from it instead of failing to load it."""
    first = tiny_trainer(tmp_path, tiny_prefix, "train.max_steps=2", "train.precision=fp32")
    first.fit()
    again = Trainer(first.config, first.run, distributed.Dist(), torch.device("cpu"))
    again.scaler = torch.amp.GradScaler("cpu", enabled=True)  # what fp16 builds on CUDA
    again.restore(first.run.checkpoints / "last.pt")
    assert again.scaler.is_enabled() and again.progress.step == 2


def test_the_process_group_gets_the_configured_timeout(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend, timeout: seen.update(t=timeout)
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    distributed.init("cpu", timeout=5400.0)
    assert seen["t"].total_seconds() == 5400.0
    assert load_config("tiny").train.dist_timeout >= 3600  # generous by default


class HostSyncs(TorchDispatchMode):
    """Counts the operations that make the host wait for the device: `.item()` and friends
    (`_local_scalar_dense`), `nonzero`, boolean-mask indexing, and `.tolist()` and `.numpy()`
    (which do not dispatch, so they are counted by wrapping them)."""

    def __init__(self, monkeypatch) -> None:
        super().__init__()
        self.count = 0
        for name in ("tolist", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))

    def _counted(self, real):
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return real(tensor, *args, **kwargs)

        return counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("_local_scalar_dense", "nonzero", "masked_select") or (
            name == "index"
            and any(i is not None and i.dtype == torch.bool for i in args[1] if hasattr(i, "dtype"))
        ):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_one_host_sync_per_training_update(tmp_path, tiny_prefix, monkeypatch):
    trainer = tiny_trainer(tmp_path, tiny_prefix, "train.clip_norm=1.0", "train.precision=fp32")
    batches = trainer.next_batches()  # collated on the host, before the count
    counter = HostSyncs(monkeypatch)
    with counter:
        result = trainer.update(batches)
    assert "loss" in result
    assert counter.count == 1


def hand_step(vocab: int = 6, eos: int = 1):
    """A step function that never prefers EOS, so no hypothesis finishes for a while."""

    def step(tokens: torch.Tensor, state):
        logits = torch.arange(vocab, dtype=torch.float).repeat(tokens.size(0), 1)  # (N, V)
        logits[:, eos] = -5.0
        return torch.log_softmax(logits, dim=-1), state

    return step


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_one_host_sync_per_search_step(monkeypatch, search):
    per_step: list[int] = []
    counter = HostSyncs(monkeypatch)
    step = hand_step()

    def counting_step(tokens, state):
        per_step.append(counter.count)
        return step(tokens, state)

    max_lens = torch.tensor([6, 6, 6])
    with counter:
        if search == "beam":
            settings = SearchSettings(2, 1, beam_size=4, length_penalty=0.6, patience=2.0)
            beam_search(counting_step, None, lambda s, i, g: s, settings, max_lens)
        else:
            greedy_search(counting_step, None, lambda s, i, g: s, SearchSettings(2, 1), max_lens)
    between = [b - a for a, b in zip(per_step, per_step[1:])]
    assert between[1:-1] and set(between[1:-1]) == {1}, between  # steps where nothing ends


def test_the_lowest_columns_of_a_tie_leave_the_host_unwaited_on_a_gpu(monkeypatch):
    """`row_best` on a GPU puts the lowest columns of a tie at the n-th value in without a
    wait (`row_best`'s CPU path asks the host which rows are tied, which costs nothing there)."""
    x = torch.zeros(4, 300)
    x[:, [7, 100, 200]] = 1.0  # three tied at the top of every row
    top, columns = x.topk(3, dim=1)
    tied = top[:, 1] == top[:, 2]
    counter = HostSyncs(monkeypatch)
    with counter:
        columns = kernels.lowest_columns(x, top[:, :2], columns[:, :2], tied)
    assert counter.count == 0
    assert columns.sort(dim=1).values.tolist() == [[7, 100]] * 4


def test_decoding_on_cuda_autocasts_and_allows_tf32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        with warnings.catch_warnings():  # "CUDA is not available": the context is not entered
            warnings.simplefilter("ignore")
            context = device_module.inference_autocast(CUDA)
        assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert not isinstance(device_module.inference_autocast(CUDA, "fp32"), torch.autocast)


@pytest.mark.parametrize("native", [True, False])
def test_decoding_on_cpu_autocasts_to_bf16_only_where_native(monkeypatch, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cpu = torch.device("cpu")
    context = device_module.inference_autocast(cpu)
    assert isinstance(context, torch.autocast) == native
    if native:
        assert context.fast_dtype == torch.bfloat16
    assert not isinstance(device_module.inference_autocast(cpu, "fp32"), torch.autocast)
    with pytest.raises(InputError, match="decode.precision: fp16 needs a CUDA device"):
        device_module.inference_autocast(cpu, "fp16")


def test_rank_zero_alone_logs_below_errors(monkeypatch):
    import logging

    from cli.main import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()  # basicConfig configures only a root without handlers
    try:
        monkeypatch.setenv("RANK", "1")
        setup_logging()
        assert root.level == logging.ERROR
        assert "[rank 1]" in root.handlers[0].formatter._fmt
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_prefetched_batches_and_resume_states_equal_those_made_in_line(tmp_path, tiny_prefix):
    from cli.training.prefetch import Prefetcher, endless

    trainer = tiny_trainer(tmp_path, tiny_prefix)
    it = trainer.data.train
    n = len(it) + 3  # into the second epoch
    start = it.state_dict()
    inline = [next(s) for s in [endless(it)] for _ in range(n)]
    it.load_state_dict(start)
    ahead = Prefetcher(it, depth=2, pin=False)  # pinning needs a GPU
    threaded = [next(ahead) for _ in range(n)]
    ahead.close()
    for a, b in zip(inline, threaded):
        assert a.state == b.state and a.epochs == b.epochs
        assert torch.equal(a.batch.src, b.batch.src) and torch.equal(
            a.batch.tgt_out, b.batch.tgt_out
        )
    assert threaded[-1].state["epoch"] == 1


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_translation_computes_in_decode_precision(trained, precision, dtype):
    from dataclasses import replace

    from cli.inference.decoding import encode_sources, translate_ids
    from cli.runs.models import load_for_inference

    cpu = torch.device("cpu")
    model, tok, config = load_for_inference(trained, cpu)
    seen = []
    model.generator.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    ids = encode_sources(tok, ["hola", "y dijo"], model.config.max_positions, "test", 1)
    decode = replace(config.decode, precision=precision)
    hyps = translate_ids(model, tok, ids, decode, cpu)
    assert seen and set(seen) == {dtype}
    assert all(h[0].log_prob <= 0 for h in hyps)  # log-probabilities are taken in fp32


def prefetch_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "tf-prefetch"]


@pytest.mark.parametrize("fails", [False, True])
def test_the_prefetch_thread_ends_with_the_training(tmp_path, tiny_prefix, monkeypatch, fails):
    """On a GPU a thread collates batches ahead and holds the iterator (its Arrow tables) and
    pinned batches: it must stop and let go when training ends, or fails, not outlive it."""
    import gc

    import cli.training.trainer as trainer_module
    from cli.commands.train import run_train
    from cli.training.prefetch import Prefetcher
    from cli.training.run import TrainingError

    # The GPU's path on a CPU: prefetched by a thread, without pinning (which needs CUDA).
    monkeypatch.setattr(
        trainer_module, "training_batches", lambda it, prefetch: Prefetcher(it, pin=False)
    )
    if fails:
        monkeypatch.setattr(
            Trainer, "optimizer_step", lambda *a: (_ for _ in ()).throw(TrainingError("boom"))
        )
    assert not prefetch_threads()
    config = load_config(
        "tiny",
        [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.eval_every=0"]
        + ["train.max_steps=2", "train.precision=fp32"],
    )
    if fails:
        with pytest.raises(TrainingError, match="boom"):
            run_train(config, tmp_path / "run", resume=False)
    else:
        run_train(config, tmp_path / "run", resume=False)
    assert not prefetch_threads()
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Prefetcher]


def test_restarting_the_batches_stops_the_previous_prefetch_thread(tmp_path, tiny_prefix):
    from cli.training.prefetch import Prefetcher

    trainer = tiny_trainer(tmp_path, tiny_prefix)
    it = trainer.data.train
    first = Prefetcher(it, depth=2, pin=False)
    next(first)
    first.close()
    assert not prefetch_threads()
    second = Prefetcher(it, depth=1, pin=False)
    assert len(prefetch_threads()) == 1
    second.close()
    second.close()  # twice is harmless
    assert not prefetch_threads()


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    with pytest.raises(InputError, match="train.precision: bf16 is not supported by this GPU"):
        autocast_dtype("bf16", CUDA)
    assert autocast_dtype("bf16", torch.device("cpu")) is torch.bfloat16  # emulated, but right


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_without_a_kernel_compiler_is_refused_up_front(monkeypatch, device):
    import torch._inductor.cpp_builder
    import torch.utils._triton

    from cli.training.preflight import check_settings

    def no_compiler() -> str:
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(torch._inductor.cpp_builder, "get_cpp_compiler", no_compiler)
    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    config = load_config("tiny", ["train.compile=true"])
    needed = r"C\+\+ compiler" if device == "cpu" else "Triton"
    with pytest.raises(
        InputError, match=f"train.compile: torch.compile on {device} needs .*{needed}"
    ):
        check_settings(config, torch.device(device))
    check_settings(load_config("tiny", ["train.compile=false"]), torch.device(device))


def test_more_torchrun_processes_than_gpus_is_one_line(monkeypatch):
    """Refused on every rank alike (torchrun's LOCAL_WORLD_SIZE), rank 0 too: a rank that
    stopped alone would leave the others waiting for it in the process group."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    for name, value in {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    for rank in ("0", "3"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        with pytest.raises(InputError, match="4 processes on this machine, which has 2 CUDA dev"):
            distributed.init("cuda")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.init("cuda")[1] == torch.device("cuda", 1)


def test_deterministic_training_on_cuda_gets_a_fixed_cublas_workspace(monkeypatch):
    """Without CUBLAS_WORKSPACE_CONFIG, torch.use_deterministic_algorithms makes the first
    CUDA matmul raise: a run with train.deterministic would die at its first forward pass."""
    seen = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", seen.append)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    device_module.make_deterministic(torch.device("cpu"))
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    device_module.make_deterministic(CUDA)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and seen == [True, True]
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    device_module.make_deterministic(CUDA)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's is kept
