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
from cli.training.checkpoint import FORMAT, save_atomic
from cli.training.run import RunDir
from data.config import LANGUAGE_CODE, DataConfig
from data.errors import InputError
from data.files import check_output_dir, read_json_object
from data.marian import TOKENIZER_CONFIG, MarianTokenizer
from data.tokenizer import Tokenizer
from model.marian import tf_weights
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
PICKLED = "pytorch_model.bin"
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
    check_output_dir(out, force, "-o", Path(source) if Path(source).exists() else None)
    directory, origin = locate(source)
    hf = read_hf_config(directory)
    if (directory / TF_CONFIG).is_file():  # a `tf export`: the run it came from, exactly
        config, tokenizer = exported_run(directory)
    else:
        tokenizer = MarianTokenizer(directory)
        config = run_config(model_config_of(hf, directory), directory, source)
    check_vocabulary(hf, tokenizer, directory)
    weights, weights_file = read_weights(directory)
    model = Transformer(
        config.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id
    )
    load_marian(model, weights, weights_file)
    origin = {"source": origin, **weights_file_record(weights_file)}
    write_run(model, tokenizer, config, out, origin)
    return report(out, model, tokenizer, config)


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
            directory = Path(snapshot_download(name, allow_patterns=FILES + [PICKLED]))
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
    if hf["decoder_start_token_id"] != hf["pad_token_id"]:
        raise InputError(
            f"{where}: decoder_start_token_id {hf['decoder_start_token_id']} is not the "
            f"pad token ({hf['pad_token_id']}), where Marian's decoders start"
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
    for key, value in (("pad_token_id", tokenizer.pad_id), ("eos_token_id", tokenizer.eos_id)):
        if hf.get(key) != value:
            raise InputError(
                f"{where}: {key} {hf.get(key)} is not the tokenizer's ({value}, "
                f"{tokenizer.tgt_pieces([value])[0]})"
            )


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The state dict of `directory` (safetensors, sharded or not, else pytorch_model.bin read
    with weights_only=True), in float32 under MarianMTModel's names."""
    index = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    pickled = directory / PICKLED
    if index.is_file():
        shards = index_shards(index)
        weights = {}
        for shard in shards:
            weights.update(_safetensors(directory / shard))
        found = index
    elif single.is_file():
        weights, found = _safetensors(single), single
    elif pickled.is_file():
        try:
            with warnings.catch_warnings():  # torch's notes on the pickle's protocol: noise
                warnings.simplefilter("ignore")
                weights = torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as e:  # an unpickling error, a truncated file, ...
            reason = " ".join(str(e).split())[:160]
            raise InputError(f"{pickled}: not loadable as plain weights ({reason})") from None
        found = pickled
    else:
        raise InputError(f"{directory}: no model.safetensors or pytorch_model.bin")
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise InputError(f"{found}: not a state dict of tensors")
    if not any(k.startswith("model.") for k in weights):  # a MarianModel: no head of its own
        weights = {f"model.{k}": v for k, v in weights.items()}
    return {k: v.float() for k, v in weights.items()}, found


def index_shards(index: Path) -> list[str]:
    """The shard files a model.safetensors.index.json names, each once, sorted."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(shard, str) and shard and Path(shard).name == shard
        for shard in weight_map.values()
    ):
        raise InputError(f"{index}: weight_map must map tensor names to shard file names")
    return sorted(set(weight_map.values()))


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError) as e:
        raise InputError(f"{path}: not a readable safetensors file ({e})") from None


def load_marian(model: Transformer, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Marian's weights into `model`, checked: every tensor there, of the right shape, and the
    positions (where a file keeps them) the sinusoids `model.positions: halves` computes."""
    if "lm_head.weight" not in weights and model.config.tie_embeddings == "none":
        raise InputError(f"{source}: no lm_head.weight for an untied output layer")
    if "final_logits_bias" not in weights:  # transformers' own default when a file has none
        weights["final_logits_bias"] = torch.zeros(1, model.generator.out_features)
    try:
        ours = tf_weights(weights, model.config)
        model.load_state_dict(ours, strict=True)
    except KeyError as e:
        raise InputError(f"{source}: no tensor {e} (the weights do not fit config.json)") from None
    except RuntimeError as e:
        first = " ".join(str(e).split())[:200]
        raise InputError(f"{source}: the weights do not fit config.json ({first})") from None
    for stack in ("encoder", "decoder"):
        table = weights.get(f"model.{stack}.embed_positions.weight")
        if table is None:
            continue
        expected = sinusoidal_positions(table.size(0), table.size(1), "halves")
        if table.shape != expected.shape or not torch.allclose(table, expected, atol=1e-4):
            raise InputError(
                f"{source}: model.{stack}.embed_positions are not Marian's sinusoids "
                "(learned positions?); tf computes them"
            )


def exported_run(directory: Path) -> tuple[Config, Tokenizer]:
    """The config and tokenizer of the run a `tf export --to huggingface` came from."""
    try:
        config = load_config(directory / TF_CONFIG)
    except ConfigError as e:
        raise InputError(str(e)) from None
    return config, Tokenizer.load(directory)


def run_config(model_config: ModelConfig, directory: Path, source: str) -> Config:
    """The imported run's config: the model, its languages (tokenizer_config.json's, else the
    name's `opus-mt-SRC-TGT`), the generation config's beam."""
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
    generation = directory / "generation_config.json"
    beam = read_json_object(generation).get("num_beams") if generation.is_file() else None
    decode = DecodeConfig(beam_size=beam) if isinstance(beam, int) and 0 < beam <= 32 else None
    config = Config(data=data, model=model_config, decode=decode or DecodeConfig())
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


def report(out: Path, model: Transformer, tokenizer: Tokenizer, config: Config) -> str:
    c, d = model.config, config.data
    vocab = f"{tokenizer.src_vocab_size}" + (
        "" if tokenizer.joint else f"/{tokenizer.tgt_vocab_size}"
    )
    lines = [
        f"{out}: {d.src_lang}->{d.tgt_lang}, {model.num_parameters() / 1e6:.1f}M parameters "
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
