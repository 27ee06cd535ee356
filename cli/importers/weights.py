"""A Hugging Face model's weights, read once and safely, into `tf`'s Transformer.

The files: model.safetensors (or its shards and model.safetensors.index.json) where there are
any, as transformers prefers them, else pytorch_model.bin (or its shards). Nothing runs code:
a safetensors file is a JSON header and bytes; a pickle is read with `weights_only=True`, and
one that would run code, or holds anything but tensors, is refused.

Memory: a 600M-parameter model is 2.4 GB in fp32, and a reader that holds every tensor (or
maps the file, whose pages stay resident once read) beside the model's own parameters needs
twice that. Here a safetensors tensor is read with a plain read at the offset its header
gives, when it is needed and not before; a pickle is mapped, and each tensor's pages are handed
back to the kernel once copied. `load_weights` walks the model part by part (a layer's
attention, its feed-forward, a norm: `model.bart_family`'s table), copying each part into its
parameters and dropping it, and copies the vocabulary's matrices a block of rows at a time: the
peak is the model and one part.

Before any tensor is read, every name and shape is checked against the model config.json
describes (`check_tensors`): one of another shape, one the model has no place for, or one it
needs and the files lack is a one-line error naming it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from data.errors import InputError
from data.files import read_json_object
from data.tokenizer_base import BaseTokenizer
from model.bart_family import IN, all_parts, half_split_permutation
from model.transformer import Embedding, ModelConfig, Transformer

SAFETENSORS = ("model.safetensors.index.json", "model.safetensors")
PICKLES = ("pytorch_model.bin.index.json", "pytorch_model.bin")
# safetensors' dtype names (its format's documentation).
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
BLOCK_BYTES = 64 << 20  # a vocabulary matrix is copied this much at a time


@dataclass(frozen=True)
class Stored:
    """Where one tensor lies: its file, its dtype and shape, and either the byte offset of its
    data (safetensors) or the mapped tensor itself (a pickle)."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int = 0
    mapped: torch.Tensor | None = None


class WeightFiles(Mapping[str, torch.Tensor]):
    """A model's weights by name, each read from its file when it is asked for and never kept
    (a Mapping: `model.bart_family`'s functions read it as a state dict).

    Attributes:
        found: the file the weights came from (a sharded model's index).
    """

    def __init__(self, stored: dict[str, Stored], found: Path) -> None:
        self._stored = stored
        self.found = found
        self._open: dict[Path, BinaryIO] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        shape = self.shape(name)
        return self.rows(name, 0, shape[0] if shape else 0)

    def __contains__(self, name: object) -> bool:
        return name in self._stored

    def __iter__(self) -> Iterator[str]:
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._stored[name].shape

    def dtype(self, name: str) -> torch.dtype:
        return self._stored[name].dtype

    def renamed(self, rename: Callable[[str], str]) -> WeightFiles:
        """The same files under other names (a `MarianModel`'s, without the `model.` prefix)."""
        renamed = WeightFiles({rename(k): v for k, v in self._stored.items()}, self.found)
        renamed._open = self._open
        return renamed

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start .. stop - 1 of tensor `name` (all of a 0-d one), a new tensor of its
        dtype: read from the file now (safetensors), or copied out of the mapping, whose
        pages are then released (a pickle)."""
        stored = self._stored[name]
        if stored.mapped is not None:
            part = stored.mapped if not stored.shape else stored.mapped[start:stop]
            out = part.clone()
            _release(part)
            return out
        shape = (stop - start, *stored.shape[1:]) if stored.shape else ()
        out = torch.empty(shape, dtype=stored.dtype)
        row_bytes = torch.Size(stored.shape[1:]).numel() * out.element_size()
        f = self._file(stored.path)
        f.seek(stored.offset + start * row_bytes)
        buffer = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        if f.readinto(buffer) != len(buffer):
            raise InputError(f"{stored.path}: ends inside {name} (a truncated file)")
        return out

    def _file(self, path: Path) -> BinaryIO:
        if path not in self._open:
            self._open[path] = open(path, "rb")  # noqa: SIM115 (closed by `close`)
        return self._open[path]

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


@contextlib.contextmanager
def open_weights(directory: Path) -> Iterator[WeightFiles]:
    """The weights of the model in `directory` (see the module docstring), their files closed
    after use.

    Raises:
        InputError: no weights, a shard missing, a file that is not what it says it is.
    """
    for index_name, single_name in (SAFETENSORS, PICKLES):
        index, single = directory / index_name, directory / single_name
        read = _safetensors if single_name.endswith(".safetensors") else _pickled
        if index.is_file():
            paths, found = [directory / shard for shard in index_shards(index)], index
        elif single.is_file():
            paths, found = [single], single
        else:
            continue
        stored: dict[str, Stored] = {}
        for path in paths:
            if not path.is_file():
                raise InputError(f"{index}: names the shard {path.name}, which is missing")
            for name, entry in read(path).items():
                if name in stored:
                    raise InputError(f"{path}: holds {name}, which {stored[name].path} holds")
                stored[name] = entry
        files = WeightFiles(stored, found)
        try:
            yield files
        finally:
            files.close()
        return
    raise InputError(
        f"{directory}: no model.safetensors or pytorch_model.bin (nor a sharded index of either)"
    )


def index_shards(index: Path) -> list[str]:
    """The shard files a sharded model's index (`*.index.json`) names, each once, sorted."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(shard, str) and shard and Path(shard).name == shard
        for shard in weight_map.values()
    ):
        raise InputError(f"{index}: weight_map must map tensor names to shard file names")
    return sorted(set(weight_map.values()))


def _safetensors(path: Path) -> dict[str, Stored]:
    """The tensors of a safetensors file, from its header alone: 8 bytes giving the header's
    length, the header (JSON: each tensor's dtype, shape and data offsets), then the data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= size - 8:
            raise InputError(f"{path}: not a readable safetensors file (no header)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError):
            raise InputError(f"{path}: not a readable safetensors file (its header)") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a readable safetensors file (its header)")
    header.pop("__metadata__", None)
    return {name: _entry(path, name, value, 8 + length, size) for name, value in header.items()}


def _entry(path: Path, name: str, value: Any, start: int, size: int) -> Stored:
    """One tensor of a safetensors header, checked: its dtype known, its bytes in the file
    and as many as its shape holds."""
    ok = isinstance(value, dict) and value.get("dtype") in DTYPES
    shape, offsets = (value.get("shape"), value.get("data_offsets")) if ok else (None, None)
    ok = ok and isinstance(shape, list) and all(_natural(n) for n in shape)
    ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(map(_natural, offsets))
    if ok:
        dtype = DTYPES[value["dtype"]]
        begin, end = offsets
        needed = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        ok = end - begin == needed and start + end <= size
    if not ok:
        raise InputError(f"{path}: not a readable safetensors file ({name}: {str(value)[:80]})")
    return Stored(path, dtype, tuple(shape), start + begin)


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pickled(path: Path) -> dict[str, Stored]:
    """A pytorch_model*.bin read with weights_only=True (a pickle that would run code, or
    hold anything but tensors and plain containers, is refused), mapped where torch can map
    it (the zip format every torch.save since 1.6 writes)."""
    with warnings.catch_warnings():  # torch's notes on the pickle's protocol: noise
        warnings.simplefilter("ignore")
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # else an older format: read whole, as torch must
                loaded = _unreadable(path, e)
            else:
                loaded = _load_whole(path)
        except Exception as e:  # an unpickling error, a truncated file, ...
            loaded = _unreadable(path, e)
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise InputError(f"{path}: not a state dict of tensors")
    return {k: Stored(path, v.dtype, tuple(v.shape), mapped=v) for k, v in loaded.items()}


def _load_whole(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        return _unreadable(path, e)


def _unreadable(path: Path, e: Exception) -> Any:
    reason = " ".join(str(e).split())[:160]
    raise InputError(f"{path}: not loadable as plain weights ({reason})") from None


def _release(tensor: torch.Tensor) -> None:
    """Hand the pages under a mapped tensor back to the kernel (Linux's madvise DONTNEED):
    a mapped file's pages, once read, would count in the process's memory until the whole
    mapping goes. Read again, they come back from the file (they were never written)."""
    if not sys.platform.startswith("linux") or tensor.numel() == 0:
        return
    page = 4096
    begin = tensor.data_ptr()
    end = begin + tensor.numel() * tensor.element_size()
    first, last = -(-begin // page) * page, end // page * page  # the pages wholly inside
    if last > first:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # DONTNEED


def weights_file_record(path: Path) -> dict[str, str]:
    """The weights' file name and the sha256 of their bytes (every shard's, in order)."""
    files = [path]
    if path.name.endswith(".index.json"):
        files = [path.parent / shard for shard in index_shards(path)]
    sha = hashlib.sha256()
    for file in files:
        with open(file, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                sha.update(block)
    return {"weights": path.name, "sha256": sha.hexdigest()}


# --------------------------------------------------------------------------------- the checks


def expected_shapes(
    config: ModelConfig,
    vocab: tuple[int, int],
    pad_ids: tuple[int, int],
    names: Callable[[Transformer], dict[str, torch.Tensor]],
) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every tensor the family's files hold for a model of `config` with
    vocabularies of `vocab` (source, target) rows: the family's own table (`names`, from
    `model/`) run on a model of fake tensors, which have shapes and no data (a real one of
    600M parameters would cost its size twice over, once built and once renamed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = Transformer(config, vocab[0], vocab[1], pad_ids[1], pad_ids[0])
        return {name: tuple(t.shape) for name, t in names(model).items()}


def check_tensors(
    files: WeightFiles,
    expected: dict[str, tuple[int, ...]],
    config: ModelConfig,
    computed: tuple[str, ...] = (),
) -> None:
    """Every tensor of the files against the model config.json describes (`expected`): one
    of another shape, one the model has no place for (a layer more than config.json counts,
    say, which transformers too would drop with a warning; `computed`: tables tf computes,
    checked elsewhere), one it needs and the files lack, or one not of floating point, is a
    one-line InputError naming it."""
    source = files.found
    for name in sorted(files):
        if name in expected and files.shape(name) != expected[name]:
            raise InputError(
                f"{source}: {name} has the shape {list(files.shape(name))}, where config.json's "
                f"model has {list(expected[name])} (d_model, heads, FFN or vocabulary differ)"
            )
        if not files.dtype(name).is_floating_point:
            raise InputError(f"{source}: {name} is {files.dtype(name)}, not floating point")
    unused = [name for name in sorted(files) if name not in expected and name not in computed]
    if unused:
        shown = ", ".join(unused[:3]) + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
        raise InputError(
            f"{source}: {len(unused)} tensor(s) that config.json's model does not use: {shown}"
            f"{layers_hint(unused, config)}"
        )
    missing = [n for n in expected if n not in files and not _optional(n, files, config)]
    if missing:
        raise InputError(
            f"{source}: no tensor {missing[0]} (of {len(missing)} missing: the weights do not "
            "fit config.json)"
        )


def _optional(name: str, files: WeightFiles, config: ModelConfig) -> bool:
    """Whether a file may lack `name`, as transformers lets it: a tied matrix saved once, a
    zero bias on the logits (transformers' own default)."""
    embeddings = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
    if name in embeddings:
        return "model.shared.weight" in files
    if name == "model.shared.weight":
        return all(e in files for e in embeddings)
    if name == "lm_head.weight":
        return config.tie_embeddings != "none"
    return name == "final_logits_bias"


def layers_hint(unused: list[str], c: ModelConfig) -> str:
    """What unused layers say: the weights hold more layers than config.json counts."""
    hints = []
    for stack, n in (("encoder", c.n_encoder_layers), ("decoder", c.n_decoder_layers)):
        found = [re.match(rf"model\.{stack}\.layers\.(\d+)\.", name) for name in unused]
        layers = [int(m.group(1)) for m in found if m]
        if layers and min(layers) >= n:
            hints.append(
                f"the weights hold {max(layers) + 1} {stack} layers, config.json's "
                f"{stack}_layers is {n}"
            )
    return "".join(f"; {hint}" for hint in hints)


# ------------------------------------------------------------------------------ the loading


def empty_model(config: ModelConfig, tokenizer: BaseTokenizer) -> Transformer:
    """The model the weights are read into (`load_weights`), each parameter allocated once (a
    tied one once) and left unwritten. Built as a model is for training, it would initialise
    a tied output layer's own matrix, as large as the embeddings, before tying it: 1 GB of
    NLLB-200's 2.5, resident at the import's peak. So it is built on the meta device (shapes,
    no data), its parameters then made real, and the tables `Embedding` computes rather than
    stores (the sinusoids) taken from a real embedding of one row."""
    with torch.device("meta"):
        model = Transformer(
            config,
            tokenizer.src_vocab_size,
            tokenizer.tgt_vocab_size,
            tokenizer.pad_id,
            tokenizer.src_pad_id,
        )
    real: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in real:
                    real[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype))
                module._parameters[name] = real[id(p)]
    computed = Embedding(config, 1, 0)
    for embedding in (model.src_embed, model.tgt_embed):
        embedding._buffers.update(computed._buffers)
    if any(b.is_meta for b in model.buffers()):  # a table this does not know how to compute
        raise RuntimeError("empty_model: a buffer of the model is left on the meta device")
    return model


def load_weights(model: Transformer, files: WeightFiles, index: torch.Tensor | None = None) -> None:
    """The family's tensors (checked by `check_tensors`) into `model`'s parameters, in place:
    part by part through `model.bart_family`'s table, then the vocabulary's matrices, a block
    of rows at a time, their first rows where config.json's vocabulary has more than the
    tokenizer's ids (rows no id names). `index`: our id i is the file's index[i] (a `tf`
    export's order of the vocabulary); None: the same ids."""
    c = model.config
    inv = _inverse_permutation(c)
    params = dict(model.named_parameters(remove_duplicate=False))
    written = set()
    with torch.no_grad():
        for kind, ours, theirs in all_parts(c):
            part: dict[str, torch.Tensor] = {}
            IN[kind](part, files, theirs, ours, inv)
            for name, tensor in part.items():
                params[name].copy_(tensor)
                written.add(id(params[name]))
        written |= _load_vocabulary(model, files, inv, index)
    left = [name for name, p in params.items() if id(p) not in written]
    if left:  # (`empty_model` leaves them unwritten: never a model of garbage)
        raise RuntimeError(f"load_weights: no tensor of the files was read into {left[:3]}")


def _inverse_permutation(c: ModelConfig) -> torch.Tensor:
    """Our model dimension i is their inv[i]: `tf` exports a run of interleaved positions
    with the dimension permuted into the family's halves (`model.bart_family`)."""
    if c.positions == "interleaved":
        return torch.argsort(half_split_permutation(c.d_model))
    return torch.arange(c.d_model)


def _load_vocabulary(
    model: Transformer, files: WeightFiles, inv: torch.Tensor, index: torch.Tensor | None
) -> set[int]:
    """The embeddings, the output layer and its bias, as `model.bart_family.tf_weights` takes
    them: tied matrices from where transformers ties them, each parameter filled once; returns
    the ids of the parameters filled."""
    c = model.config
    shared = "model.shared.weight" in files
    sources = [
        (model.src_embed.token.weight, "model.shared.weight" if shared else "model.encoder."),
        (model.tgt_embed.token.weight, "model.shared.weight" if shared else "model.decoder."),
        (model.generator.weight, "lm_head.weight"),
    ]
    done: set[int] = set()
    for param, name in sources:
        if id(param) in done:
            continue  # tied: filled already
        done.add(id(param))
        name = name if name.endswith(".weight") else f"{name}embed_tokens.weight"
        _copy_rows(param, files, name, inv, index)
    if c.output_bias:
        bias = model.generator.bias
        if "final_logits_bias" not in files:  # transformers' own default
            bias.zero_()
        else:
            row = files["final_logits_bias"][0]  # (V,)
            bias.copy_(row[index] if index is not None else row[: bias.size(0)])
        done.add(id(bias))
    return done


def _copy_rows(
    param: torch.Tensor,
    files: WeightFiles,
    name: str,
    inv: torch.Tensor,
    index: torch.Tensor | None,
) -> None:
    """`param` (V, D) from the file's (V' >= V, D) matrix `name`, a block of rows at a time."""
    if index is not None:  # a `tf` export (small): read whole, its rows in our order
        param.copy_(files[name][index][:, inv])
        return
    identity = bool(torch.equal(inv, torch.arange(len(inv))))
    rows = param.size(0)
    step = max(1, BLOCK_BYTES // max(1, param[0].numel() * param.element_size()))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = files.rows(name, start, stop)
        param[start:stop].copy_(block if identity else block[:, inv])
