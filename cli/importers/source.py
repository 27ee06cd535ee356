"""Where `tf import` finds a model and what it reads of it first: a local directory, or a hub
name fetched as `transformers` fetches any model (`huggingface_hub.snapshot_download`, through
its cache), config.json first and then the files of its family alone; config.json itself, with
the defaults of its transformers config class where it is silent, each value checked for its
kind; and the settings every family reads from it alike (widths, dropouts, activation).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cli.config import TF_CONFIG
from data.errors import InputError
from data.files import read_json_object

HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")
# What every family's download fetches besides its tokenizer: the configuration, the
# generation settings, a `tf export`'s run config, the weights in safetensors; pickles only
# where there are none.
COMMON_FILES = (
    "config.json",
    "generation_config.json",
    TF_CONFIG,
    "*.safetensors",
    "model.safetensors.index.json",
)
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin")
HF_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}  # -> ours
# config.json's values each family reads, by kind (`check_values`): shapes are positive
# integers, ids non-negative ones.
SHAPES = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
    "vocab_size",
)
IDS = ("pad_token_id", "eos_token_id", "decoder_start_token_id")


def locate(source: str, files_of: Callable[[Path], Sequence[str]]) -> tuple[Path, str]:
    """(the directory holding the model, where it came from): a local directory, or a hub
    name downloaded through the Hugging Face cache, config.json first, then the files
    `files_of(directory)` names (its family's: it reads config.json)."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{source}: is a file; tf import takes a model's directory")
        return path, str(path.resolve())
    if not HUB_NAME.fullmatch(source):
        raise InputError(f"{source}: no such directory")
    with hub_errors(source):
        first = _snapshot(source, ["config.json"])
        files = [*COMMON_FILES, *files_of(first)]
        directory = _snapshot(source, files)
        if not any(directory.glob("*.safetensors")):
            directory = _snapshot(source, [*files, *PICKLED])
    return directory, f"hf:{source}"


def _snapshot(name: str, patterns: list[str]) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=patterns))


@contextmanager
def hub_errors(name: str) -> Iterator[None]:
    """The hub's failures as one line each: no huggingface_hub, no network, no such model."""
    try:
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise InputError(
            f"{name}: no such directory; a hub name needs huggingface_hub (pip install "
            "'tf[export]')"
        ) from None
    try:
        yield
    except LocalEntryNotFoundError:
        raise InputError(
            f"{name}: no such directory, and the Hugging Face hub cannot be reached from here "
            f"(no network, or HF_HUB_OFFLINE); on a machine with one, run `hf download {name} "
            f"--local-dir DIR`, then `tf import DIR`"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        reason = " ".join(str(e).split())[:160]
        raise InputError(f"{name}: no such directory, nor a model on the hub ({reason})") from None


def read_config_json(directory: Path) -> dict[str, Any]:
    """config.json, as it is (a JSON object), or a one-line InputError saying what a model's
    directory holds."""
    where = directory / "config.json"
    if not where.is_file():
        raise InputError(
            f"{where}: missing; tf import takes a Hugging Face model's directory (config.json, "
            "its weights and tokenizer files) or a hub name"
        )
    return read_json_object(where)


def with_defaults(hf: dict[str, Any], config_class: str) -> dict[str, Any]:
    """`hf` with the defaults of transformers' `config_class` where it is silent, as
    transformers reads it (an absent `scale_embedding` is Marian's false, M2M100's true)."""
    try:
        import transformers
    except ImportError:
        raise InputError("tf import needs transformers: pip install 'tf[export]'") from None
    return {**getattr(transformers, config_class)().to_dict(), **hf}


def check_values(
    hf: dict[str, Any], where: Path, rates: Sequence[str], flags: Sequence[str]
) -> None:
    """The values tf reads, each of its kind: SHAPES positive integers, IDS token ids, `rates`
    numbers in [0, 1), `flags` booleans, the activation a name; a one-line InputError naming
    the file and the key otherwise."""
    for key in SHAPES:
        value = hf.get(key)
        if not (_is_int(value) and value > 0):
            raise InputError(f"{where}: {key} must be a positive integer, got {value!r}")
    for key in IDS:
        if not (_is_int(hf.get(key)) and hf[key] >= 0):
            raise InputError(f"{where}: {key} must be a token id, got {hf.get(key)!r}")
    for key in rates:
        value = hf.get(key)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
            raise InputError(f"{where}: {key} must be a number in [0, 1), got {value!r}")
    for key in flags:
        if not isinstance(hf.get(key), bool):
            raise InputError(f"{where}: {key} must be true or false, got {hf.get(key)!r}")
    if not isinstance(hf.get("activation_function"), str):
        raise InputError(
            f"{where}: activation_function must be a name, got {hf.get('activation_function')!r}"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def model_values(hf: dict[str, Any], where: Path) -> dict[str, Any]:
    """The ModelConfig settings every family reads alike from its checked config.json: the
    widths (one for both stacks, as tf has), the layers, the dropouts, the activation."""
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf[a] != hf[b]:
            raise InputError(f"{where}: {a} {hf[a]} and {b} {hf[b]} differ; tf has one")
    activation = hf["activation_function"]
    if activation not in HF_ACTIVATIONS:
        raise InputError(
            f"{where}: activation_function {activation!r}; tf has {', '.join(HF_ACTIVATIONS)}"
        )
    return dict(
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        dropout=float(hf["dropout"]),
        attention_dropout=float(hf["attention_dropout"]),
        activation_dropout=float(hf["activation_dropout"]),
        max_positions=hf["max_position_embeddings"],
        activation=HF_ACTIVATIONS[activation],
        norm_eps=1e-5,  # nn.LayerNorm's default, which these transformers models keep
    )
