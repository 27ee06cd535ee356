"""A Hugging Face Marian model (OPUS-MT's `Helsinki-NLP/opus-mt-*`, any `MarianMTModel`) as a
`tf` run: config.yaml, the model's own tokenizer, and its weights as a checkpoint at step 0.

The source is a local directory or a hub name, fetched as `transformers` fetches any model
(`huggingface_hub.snapshot_download`, through its cache). Everything is read and checked before
anything is written: the configuration (a Post-LN Marian with sinusoidal positions and scaled
embeddings, which is `tf`'s model with the switches of `ModelConfig`), the tokenizer files, the
vocabulary against the weights, the weights loaded safely (safetensors, or `torch.load` with
`weights_only=True`: a pickle that would run code is refused). The run is written beside its
place and renamed into it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from cli.config import (
    TF_CONFIG,
    Config,
    ConfigError,
    DecodeConfig,
    check_config,
    load_config,
    save_config,
)
from cli.exporters.hf_tokenizer import exported_order
from cli.importers.generation import read_generation
from cli.training.checkpoint import FORMAT, save_atomic
from cli.training.run import RunDir
from data.config import LANGUAGE_CODE, DataConfig, direction_of, with_directions
from data.errors import InputError
from data.files import check_output_dir, read_json_object
from data.marian import TOKENIZER_CONFIG, MarianTokenizer
from data.tokenizer import Tokenizer
from model.marian import marian_weights, reorder_vocabulary, tf_weights
from model.transformer import ModelConfig, Transformer, sinusoidal_positions

# What a hub download fetches: the model's configuration and tokenizer, then its weights in
# safetensors, or (only where there are none) in pytorch_model.bin; nothing else.
FILES = [
    "config.json",
    "generation_config.json",
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    TOKENIZER_CONFIG,
    TF_CONFIG,  # a `tf export`'s run config and SentencePiece model(s)
    "joint.model",
    "src.model",
    "tgt.model",
    "*.safetensors",
    "model.safetensors.index.json",
]
PICKLED = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
HF_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}  # -> ours
HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")
# Keys of older Marian configurations that describe another network than tf's (and than the
# one transformers runs): each with the value tf's model has.
VARIANTS = {
    "normalize_before": False,  # Pre-LN
    "normalize_embedding": False,  # a LayerNorm after the embeddings
    "add_final_layer_norm": False,
    "static_position_embeddings": True,  # learned positions otherwise
    "scale_embedding": True,  # embeddings x sqrt(D)
}


def import_marian(source: str, out: Path, force: bool = False) -> str:
    """Import SOURCE (a directory or a hub name) as the run `out`; returns a report for the
    user: the model, its vocabulary and its target-language tokens."""
    check_output_dir(out, force, "-o", [Path(source)] if Path(source).exists() else [])
    directory, origin = locate(source)
    hf = read_hf_config(directory)
    generation = None
    order = None  # a `tf export`'s id i is its run's order[i] (OPUS-MT's layout, pad last)
    if (directory / TF_CONFIG).is_file():  # a `tf export`: the run it came from, exactly
        config, tokenizer = exported_run(directory)
        order = exported_order(directory, tokenizer)
        hf |= {key: order[hf[key]] for key in IDS if hf[key] < len(order)}
    else:
        tokenizer = MarianTokenizer(directory)
        start = tokenizer.decoder_start_id("pad")
        generation = read_generation(
            directory, tokenizer.eos_id, start, tokenizer.tgt_pieces([start])[0]
        )
        config = run_config(
            model_config_of(hf, directory), directory, source, generation.decode, tokenizer.tags
        )
    check_vocabulary(hf, tokenizer, directory)
    weights, weights_file = read_weights(directory)
    if order is not None:
        weights = reorder_vocabulary(weights, torch.argsort(torch.tensor(order)))
    model = Transformer(
        config.model,
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        tokenizer.src_pad_id,
    )
    load_marian(model, weights, weights_file)
    origin = {"source": origin, **weights_file_record(weights_file)}
    if generation is not None:
        origin["generation"] = generation.record()
    write_run(model, tokenizer, config, out, origin)
    settings = generation.report() if generation else []
    return "\n".join([report(out, model, tokenizer, config), *settings])


def locate(source: str) -> tuple[Path, str]:
    """(the directory holding the model, where it came from): a local directory, or a hub
    name downloaded through the Hugging Face cache."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{source}: is a file; tf import takes a Marian model's directory")
        return path, str(path.resolve())
    if not HUB_NAME.fullmatch(source):
        raise InputError(f"{source}: no such directory")
    return download(source), f"hf:{source}"


def download(name: str) -> Path:
    """The hub model `name`, as `transformers` fetches it (its files land in the HF cache)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise InputError(
            f"{name}: no such directory; a hub name needs huggingface_hub (pip install "
            "'tf[export]')"
        ) from None
    try:
        directory = Path(snapshot_download(name, allow_patterns=FILES))
        if not any(directory.glob("*.safetensors")):
            directory = Path(snapshot_download(name, allow_patterns=FILES + PICKLED))
        return directory
    except LocalEntryNotFoundError:
        raise InputError(
            f"{name}: no such directory, and the Hugging Face hub cannot be reached from here "
            f"(no network, or HF_HUB_OFFLINE); on a machine with one, run `hf download {name} "
            f"--local-dir DIR`, then `tf import DIR`"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        reason = " ".join(str(e).split())[:160]
        raise InputError(f"{name}: no such directory, nor a model on the hub ({reason})") from None


# config.json's values that tf takes, each checked for its kind (`read_hf_config`): shapes are
# positive integers,
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
IDS = ("pad_token_id", "eos_token_id", "decoder_start_token_id")  # non-negative integers
RATES = ("dropout", "attention_dropout", "activation_dropout")  # numbers in [0, 1)
FLAGS = ("share_encoder_decoder_embeddings", "tie_word_embeddings")  # booleans


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json, a Marian model's, with MarianConfig's defaults where it is silent (as
    transformers reads it: an absent `scale_embedding` is false, say), its shapes checked."""
    where = directory / "config.json"
    if not where.is_file():
        raise InputError(
            f"{where}: missing; tf import takes a Hugging Face Marian directory (config.json, "
            "weights, source.spm, target.spm, vocab.json) or a hub name"
        )
    hf = read_json_object(where)
    kind = hf.get("model_type")
    if kind != "marian":
        named = ", ".join(map(str, hf.get("architectures") or [])) or "no architecture"
        raise InputError(
            f"{where}: a {kind or 'unknown'} model ({named}); tf import takes Marian "
            "translation models (MarianMTModel, OPUS-MT's Helsinki-NLP/opus-mt-*)"
        )
    try:
        from transformers import MarianConfig
    except ImportError:
        raise InputError("tf import needs transformers: pip install 'tf[export]'") from None
    hf = {**MarianConfig().to_dict(), **hf}
    for key in SHAPES:
        value = hf.get(key)
        if not (_is_int(value) and value > 0):
            raise InputError(f"{where}: {key} must be a positive integer, got {value!r}")
    for key in IDS:
        if not (_is_int(hf.get(key)) and hf[key] >= 0):
            raise InputError(f"{where}: {key} must be a token id, got {hf.get(key)!r}")
    for key in RATES:
        value = hf.get(key)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
            raise InputError(f"{where}: {key} must be a number in [0, 1), got {value!r}")
    for key in FLAGS:
        if not isinstance(hf.get(key), bool):
            raise InputError(f"{where}: {key} must be true or false, got {hf.get(key)!r}")
    if not isinstance(hf.get("activation_function"), str):
        raise InputError(
            f"{where}: activation_function must be a name, got {hf.get('activation_function')!r}"
        )
    return hf


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def model_config_of(hf: dict[str, Any], directory: Path) -> ModelConfig:
    """tf's ModelConfig of a MarianConfig (`read_hf_config`), or a one-line InputError saying
    why the model is not one `tf` runs."""
    where = directory / "config.json"
    for key, value in VARIANTS.items():
        if key in hf and hf[key] != value:
            raise InputError(
                f"{where}: {key}: {json.dumps(hf[key])} is a Marian variant tf's Post-LN model "
                f"does not run (it takes {json.dumps(value)})"
            )
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
    return ModelConfig(
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        dropout=float(hf["dropout"]),
        attention_dropout=float(hf["attention_dropout"]),
        activation_dropout=float(hf["activation_dropout"]),
        tie_embeddings=tying(hf, where),
        max_positions=hf["max_position_embeddings"],
        activation=HF_ACTIVATIONS[activation],
        output_bias=True,
        decoder_start="pad",
        norm_eps=1e-5,  # transformers' Marian: nn.LayerNorm's default
        positions="halves",
    )


def tying(hf: dict[str, Any], where: Path) -> str:
    """tie_embeddings from Marian's two flags."""
    shared, tied = hf["share_encoder_decoder_embeddings"], hf["tie_word_embeddings"]
    if shared and not tied:
        raise InputError(
            f"{where}: shared embeddings with an untied output layer; tf ties the output "
            "layer to the target embeddings whenever the embeddings are shared"
        )
    return "all" if shared else "decoder" if tied else "none"


def check_vocabulary(hf: dict[str, Any], tokenizer: Tokenizer, directory: Path) -> None:
    """The tokenizer against config.json: vocabulary sizes and special ids."""
    where = directory / "config.json"
    shared = hf["share_encoder_decoder_embeddings"]
    if shared and not tokenizer.joint:
        raise InputError(f"{where}: shared embeddings, but two vocabularies (separate_vocabs)")
    sizes = [("vocab_size", tokenizer.src_vocab_size, "source")]
    if not shared:
        sizes.append(("decoder_vocab_size", tokenizer.tgt_vocab_size, "target"))
    for key, size, side in sizes:
        if hf.get(key) != size:
            raise InputError(
                f"{tokenizer.directory}: the {side} vocabulary has {size} pieces, but "
                f"config.json's {key} is {hf.get(key)}"
            )
    # transformers pads both embeddings with pad_token_id: two vocabularies whose <pad> ids
    # differ name one of them (the one both hold); the decoder starts from the target's.
    pads = {tokenizer.pad_id, tokenizer.src_pad_id}
    if hf["pad_token_id"] not in pads:
        raise InputError(
            f"{where}: pad_token_id {hf['pad_token_id']} is not the tokenizer's <pad> "
            f"({' or '.join(map(str, sorted(pads)))})"
        )
    if hf["eos_token_id"] != tokenizer.eos_id:
        raise InputError(
            f"{where}: eos_token_id {hf['eos_token_id']} is not the tokenizer's ({tokenizer.eos_id}"
            f", {tokenizer.tgt_pieces([tokenizer.eos_id])[0]})"
        )
    start = hf["decoder_start_token_id"]
    if isinstance(tokenizer, MarianTokenizer) and start != tokenizer.pad_id:
        raise InputError(
            f"{where}: decoder_start_token_id {start} is not the target vocabulary's <pad> "
            f"({tokenizer.pad_id}), where Marian's decoders start"
        )


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The state dict of `directory` under MarianMTModel's names, in the dtypes it is stored
    in, and the file it came from: safetensors (sharded or not) where there are, else
    pytorch_model.bin (sharded or not), each file read safely (`_pickled`)."""
    for index_name, single_name, read in WEIGHT_FILES:
        index, single = directory / index_name, directory / single_name
        if index.is_file():
            weights, found = {}, index
            for shard in index_shards(index):
                if not (directory / shard).is_file():
                    raise InputError(f"{index}: names the shard {shard}, which is missing")
                weights.update(read(directory / shard))
            break
        if single.is_file():
            weights, found = read(single), single
            break
    else:
        raise InputError(
            f"{directory}: no model.safetensors or pytorch_model.bin (nor a sharded index of "
            "either)"
        )
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise InputError(f"{found}: not a state dict of tensors")
    if not any(k.startswith("model.") for k in weights):  # a MarianModel: no head of its own
        weights = {f"model.{k}": v for k, v in weights.items()}
    return weights, found


def index_shards(index: Path) -> list[str]:
    """The shard files a sharded model's index (`*.index.json`) names, each once, sorted."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(shard, str) and shard and Path(shard).name == shard
        for shard in weight_map.values()
    ):
        raise InputError(f"{index}: weight_map must map tensor names to shard file names")
    return sorted(set(weight_map.values()))


def _pickled(path: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model*.bin read with weights_only=True: a pickle that would run code (or
    hold anything but tensors and plain containers) is refused."""
    try:
        with warnings.catch_warnings():  # torch's notes on the pickle's protocol: noise
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling error, a truncated file, ...
        reason = " ".join(str(e).split())[:160]
        raise InputError(f"{path}: not loadable as plain weights ({reason})") from None


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    """A *.safetensors file: plain tensors, no code."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError) as e:
        raise InputError(f"{path}: not a readable safetensors file ({e})") from None


# (sharded index, single file, reader), safetensors first, as transformers prefers them.
WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors", _safetensors),
    ("pytorch_model.bin.index.json", "pytorch_model.bin", _pickled),
)


def load_marian(model: Transformer, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Marian's weights into `model`, checked: every tensor there, of the shape config.json
    gives it, none that the model would leave unused, and the positions (where a file keeps
    them) the sinusoids `model.positions: halves` computes."""
    if "lm_head.weight" not in weights and model.config.tie_embeddings == "none":
        raise InputError(f"{source}: no lm_head.weight for an untied output layer")
    if "final_logits_bias" not in weights:  # transformers' own default when a file has none
        weights["final_logits_bias"] = torch.zeros(1, model.generator.out_features)
    check_tensors(model, weights, source)
    check_positions(weights, source)
    try:
        ours = tf_weights({k: v.float() for k, v in weights.items()}, model.config)
        model.load_state_dict(ours, strict=True)
    except KeyError as e:
        raise InputError(f"{source}: no tensor {e} (the weights do not fit config.json)") from None
    except RuntimeError as e:
        first = " ".join(str(e).split())[:200]
        raise InputError(f"{source}: the weights do not fit config.json ({first})") from None


def check_tensors(model: Transformer, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Every tensor of the file against the model config.json describes (Marian's names and
    shapes of `model`'s weights): one of another shape, or one the model has no place for
    (a layer more than config.json counts, say, which transformers too would drop with a
    warning), is a one-line InputError naming it."""
    expected = {name: tuple(t.shape) for name, t in marian_weights(model).items()}
    for name, tensor in weights.items():
        if name in expected and tuple(tensor.shape) != expected[name]:
            raise InputError(
                f"{source}: {name} has the shape {list(tensor.shape)}, where config.json's "
                f"model has {list(expected[name])} (d_model, heads, FFN or vocabulary differ)"
            )
    unused = [name for name in weights if name not in expected and name not in POSITIONS]
    if unused:
        shown = ", ".join(unused[:3]) + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
        raise InputError(
            f"{source}: {len(unused)} tensor(s) that config.json's model does not use: {shown}"
            f"{layers_hint(unused, model.config)}"
        )


POSITIONS = tuple(f"model.{stack}.embed_positions.weight" for stack in ("encoder", "decoder"))


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


def check_positions(weights: dict[str, torch.Tensor], source: Path) -> None:
    """The position tables a file keeps (older exports do) must be Marian's sinusoids, as
    stored in their dtype: learned positions would change every logit without a word."""
    for name in POSITIONS:
        table = weights.get(name)
        if table is not None and not is_sinusoid_table(table):
            raise InputError(
                f"{source}: {name.removesuffix('.weight')} are not Marian's sinusoids "
                "(learned positions?); tf computes them"
            )


def is_sinusoid_table(table: torch.Tensor) -> bool:
    """Whether `table` (P, D) holds Marian's sinusoids as its dtype stores them: rounded to
    that dtype, within its machine epsilon (fp16 9.8e-4, bf16 7.8e-3, where rounding moves a
    value near 1 by up to 2.4e-4 and 2e-3; float32 tables computed in another order differ by
    ~1e-5, under the 1e-4 kept for them)."""
    if table.dim() != 2 or not table.is_floating_point():
        return False
    expected = sinusoidal_positions(table.size(0), table.size(1), "halves").to(table.dtype)
    tolerance = max(1e-4, torch.finfo(table.dtype).eps)
    return torch.allclose(table.float(), expected.float(), rtol=0, atol=tolerance)


def exported_run(directory: Path) -> tuple[Config, Tokenizer]:
    """The config and tokenizer of the run a `tf export --to huggingface` came from."""
    try:
        config = load_config(directory / TF_CONFIG)
    except ConfigError as e:
        raise InputError(str(e)) from None
    return config, Tokenizer.load(directory)


def run_config(
    model_config: ModelConfig,
    directory: Path,
    source: str,
    decode: DecodeConfig,
    tags: Iterable[str] = (),
) -> Config:
    """The imported run's config: the model, its languages (tokenizer_config.json's, else the
    name's `opus-mt-SRC-TGT`; a multilingual model's directions into its `>>xxx<<` tokens'
    languages, `tags`), and `decode`, its generation settings (`read_generation`)."""
    tokenizer_config = directory / TOKENIZER_CONFIG
    langs = read_json_object(tokenizer_config) if tokenizer_config.is_file() else {}
    src_lang, tgt_lang = langs.get("source_lang"), langs.get("target_lang")
    for key, lang in (("source_lang", src_lang), ("target_lang", tgt_lang)):
        if lang not in (None, "") and not (isinstance(lang, str) and LANGUAGE_CODE.fullmatch(lang)):
            raise InputError(
                f"{tokenizer_config}: {key} must be a language code (letters, digits, _ or -), "
                f"got {lang!r}"
            )
    named = re.search(r"opus-mt-([a-z_]+)-([a-z_]+)$", source.rstrip("/"), re.IGNORECASE)
    if not (src_lang and tgt_lang) and named:
        src_lang, tgt_lang = named.groups()
    data = DataConfig(  # a model alone: no corpus of tf's trained it (fine-tuning names some)
        train=[],
        dev="",
        test="",
        src_lang=src_lang or "src",
        tgt_lang=tgt_lang or "tgt",
        max_len=min(DataConfig.max_len, model_config.max_positions - 1),
    )
    data = with_directions(data, tags)
    config = Config(data=data, model=model_config, decode=decode)
    try:
        return check_config(config, str(directory / "config.json"))
    except ConfigError as e:
        raise InputError(str(e)) from None


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


def write_run(
    model: Transformer, tokenizer: Tokenizer, config: Config, out: Path, origin: dict
) -> None:
    """RUN/config.yaml, RUN/tokenizer/ (the model's files, and a tokenizer_config.json saying
    what tf needs of it), RUN/checkpoints/last.pt at step 0, RUN/import.json (where from)."""
    staging = out.with_name(f".{out.name}.importing")
    shutil.rmtree(staging, ignore_errors=True)
    run = RunDir(staging)
    try:
        run.tokenizer.mkdir(parents=True)
        for path in tokenizer.model_paths():
            if path.name != TOKENIZER_CONFIG:
                shutil.copyfile(path, run.tokenizer / path.name)
        if isinstance(tokenizer, MarianTokenizer):  # what tf reads of transformers' settings
            settings = {"separate_vocabs": tokenizer.separate}
            settings |= {"source_lang": config.data.src_lang, "target_lang": config.data.tgt_lang}
            (run.tokenizer / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=1) + "\n")
        imported = Tokenizer.load(run.tokenizer)
        save_config(config, run.config)
        checkpoint = {
            "format": FORMAT,
            "model": model.state_dict(),
            "step": 0,
            "config": config.to_dict(),
            "tokenizer_digest": imported.digest(),
            "imported": origin,
        }
        save_atomic(checkpoint, run.checkpoints / "last.pt")
        (staging / "import.json").write_text(json.dumps(origin, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def named_direction(d: DataConfig) -> str:
    """A one-way model's direction (a `tf` export's: its corpora's); a multilingual one's as its
    card names it ("gem->gem", "en->mul")."""
    ways = d.translates()
    return direction_of(*ways[0]) if len(ways) == 1 else direction_of(d.src_lang, d.tgt_lang)


def report(out: Path, model: Transformer, tokenizer: Tokenizer, config: Config) -> str:
    c, d = model.config, config.data
    vocab = f"{tokenizer.src_vocab_size}" + (
        "" if tokenizer.joint else f"/{tokenizer.tgt_vocab_size}"
    )
    lines = [
        f"{out}: {named_direction(d)}, {model.num_parameters() / 1e6:.1f}M parameters "
        f"(d_model {c.d_model}, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
        f"{c.n_heads} heads, FFN {c.d_ff} {c.activation}), vocabulary {vocab}"
    ]
    if tokenizer.tags and isinstance(tokenizer, MarianTokenizer):
        lines.append(
            f"target-language tokens ({len(tokenizer.tags)}): {' '.join(tokenizer.tags)}; "
            "start a source with one to choose the output language"
        )
    elif tokenizer.tags:
        lines.append(f"tags: {' '.join(tokenizer.tags)}")
    return "\n".join(lines)
