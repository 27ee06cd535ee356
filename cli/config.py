"""The one typed configuration tree: every default of `tf` lives here, in `ModelConfig`
(`model/`) and in `DataConfig` (`data/`).

A YAML file names only what differs from the defaults. Loading is strict: an unknown key or a
value of the wrong type is a `ConfigError` naming the dotted key and the nearest valid one.
`--set section.key=value` overrides are parsed with `yaml.safe_load`, then checked the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from cli.device import DEVICE_PATTERN
from data.config import DataConfig, check_data
from data.files import atomic_output
from model.lora import TRAINABLE_GROUPS, LoraConfig, check_lora
from model.transformer import ModelConfig

# The run's config beside an exported model (CTranslate2, Hugging Face): what `tf translate DIR`
# decodes with, and what `tf import` of an export restores.
TF_CONFIG = "tf_config.yaml"


class ConfigError(Exception):
    """A bad config file, key or value; `str()` is one line for the user."""


@dataclass
class TrainConfig:
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False  # torch.compile the model
    # A checkpoint whose weights start the run (fine-tuning, e.g. a `tf prune` output): its model
    # shapes and its tokenizer replace the config's.
    init: str = ""
    deterministic: bool = False  # torch.use_deterministic_algorithms, for bit-exact resume tests
    # Seconds a torchrun rank waits in a collective (NCCL's default is 10 minutes): the others
    # wait while rank 0 alone trains the tokenizer and encodes a large corpus.
    dist_timeout: float = 7200.0
    # Batches: a token budget counted with padding, accumulated over update_freq batches per update.
    max_tokens: int = 4096
    max_sentences: int = 1024
    update_freq: int = 1
    # Stopping: whichever comes first; 0 disables a limit.
    max_steps: int = 100_000
    max_epochs: int = 0
    max_time: float = 0.0  # seconds of wall time
    # Optimiser: Adam(0.9, 0.98, eps 1e-9) as in the paper, section 5.3.
    lr: float = 1.0  # noam: a multiplier of d_model^-0.5 * min(...); the others: the peak
    # linear/cosine: warm up, then decay to 0 when the nearest of max_steps, max_epochs and
    # max_time is reached (with max_time the lr follows the clock, so reruns differ slightly;
    # with none of them set it stays at the peak).
    schedule: Literal["noam", "inverse_sqrt", "linear", "cosine"] = "noam"
    warmup_steps: int = 4000
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 disables gradient clipping
    label_smoothing: float = 0.1
    # 0: off. Else the weights of record (validated, kept as best.pt, translated, exported) are
    # an exponential moving average of the trained ones with this decay (cli/training/ema.py);
    # the checkpoints keep the trained weights too, to resume from.
    ema_decay: float = 0.0
    max_bad_steps: int = 5  # stop after this many non-finite losses in a row
    # Logging, validation, checkpoints (in updates).
    log_every: int = 100
    eval_every: int = 1000  # 0: validate only at the end
    eval_on_start: bool = False  # validate at step 0 too (fine-tuning: the imported model's BLEU)
    # Dev sentences decoded greedily for BLEU/chrF, per direction (two dev sets of one direction
    # share them evenly, what a short one cannot use going to the other); 0: all.
    eval_bleu_sentences: int = 500
    early_stop_metric: Literal["bleu", "chrf", "loss"] = "bleu"
    patience: int = 0  # validations without improvement before stopping; 0 disables
    save_every: int = 1000
    keep_last: int = 5  # step_N.pt files kept
    # metrics.jsonl's scalars also as TensorBoard event files in RUN/tensorboard (when the
    # tensorboard package is installed: `make install` installs it).
    tensorboard: bool = True
    # LoRA (Hu et al., 2021): rank 0 trains every weight; a rank trains low-rank adapters on
    # the layers `targets` names (q, k, v, o: the attention projections; ffn: both FFN
    # layers) of the `train.init` model, whose weights stay frozen (`cli/training/lora.py`).
    lora: LoraConfig = field(default_factory=LoraConfig)
    # With LoRA, what trains besides the adapters: norms, output_bias, embeddings, positions.
    trainable: list[str] = field(default_factory=list)
    # Under torchrun, shard the weights, gradients and Adam's moments over the processes
    # (PyTorch's FSDP2, `cli/training/shard.py`) instead of replicating them (DDP): for a model
    # whose ~16 bytes per parameter do not fit one device. Checkpoints stay ordinary ones.
    shard: bool = False


@dataclass
class DecodeConfig:
    beam_size: int = 4  # paper, section 6.1
    length_penalty: float = 0.6  # GNMT's alpha in ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0  # output length limit: a * src_len + b (paper: src_len + 50)
    max_len_b: int = 50
    min_len: int = 0
    nbest: int = 1
    no_repeat_ngram_size: int = 0
    # Beam search: a sentence stops at its max length, once no live hypothesis can beat its
    # nbest finished ones, or once beam_size x patience of its hypotheses have finished
    # (CTranslate2's `patience`, Kasai et al. 2022; 1 is fairseq's rule). 0: only the first two.
    # On the shared test set (small, beam 5) patience 2 left 992 of 1,000 translations as the
    # exhaustive search made them, in 0.6x the time; patience 1 changed 93 and cost 0.2 BLEU.
    patience: float = 2.0
    # The rules of transformers' `generate` that an imported model brings (`tf import` sets them
    # from its generation config). length_penalty_form: "gnmt" divides a finished hypothesis's
    # log-probability by ((5 + |Y|) / 6) ** length_penalty, "power" by |Y| ** length_penalty
    # (transformers', CTranslate2's), |Y| counting the EOS.
    length_penalty_form: Literal["gnmt", "power"] = "gnmt"
    # What else stops a sentence's beam search: "bound", once no live hypothesis can beat its
    # nbest finished ones at any length it may reach; "current_length", transformers' default
    # (`early_stopping: false`), once beam_size have finished and the best live one, scored at
    # its current length, does not beat the worst of them (sooner; it may miss a longer, better
    # translation where the length penalty rewards length).
    beam_stop: Literal["bound", "current_length"] = "bound"
    # The EOS forced at the length limit counts its log-probability (true) or none, as certain
    # (false: transformers' `forced_eos_token_id`); it ranks the hypotheses cut there.
    score_forced_eos: bool = True
    # Log-probabilities normalised again after the rules forbid tokens (min_len, repeated
    # n-grams, a Marian model's pad): transformers' `renormalize_logits`.
    renormalize: bool = False
    max_tokens: int = 4096  # source tokens per translation batch, padding counted
    # auto: bf16 autocast where the device computes it natively (GPUs from Ampere on, else
    # fp16; CPUs with AVX512-BF16 or AMX), fp32 elsewhere; a loaded model on a CPU without AMX
    # decodes in fp32 on packed weights, there the faster (`cli.device.engine_precision`). On
    # the shared test set bf16 changed BLEU by under 0.1 against fp32 (issue notes); fp32
    # gives the trained model's exact numbers.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # Random sampling instead of search (back-translation: Edunov et al. 2018 sample with top-k
    # 10): 0 off, k draws from the k most probable tokens, -1 from all. beam_size samples are
    # drawn per sentence and the nbest best-scoring returned (fairseq's rule): beam_size 1 for
    # one plain sample. Reproducible: a sample depends on `seed` and its sentence only.
    sampling_topk: int = 0
    sampling_topp: float = 1.0  # then the most probable tokens whose mass reaches p (nucleus)
    sampling_temperature: float = 1.0  # log-probabilities divided by it before drawing
    seed: int = 0

    @property
    def sampling(self) -> bool:
        return self.sampling_topk != 0


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML config (None: all defaults), apply `section.key=value` overrides, check it all.

    A bare name such as `small` that is no file resolves to the config shipped with `tf`.
    """
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = resolve_config_path(path)
        source = str(path)
        raw = read_yaml(path)
    for item in overrides:
        apply_override(raw, item)
    return check_config(from_dict(Config, raw, source), source)


def with_overrides(
    config: Config, overrides: list[str], sections: tuple[str, ...] = ("decode",)
) -> Config:
    """`config` with `section.key=value` overrides applied to the given sections, checked."""
    raw = config.to_dict()
    for item in overrides:
        section = item.partition("=")[0].strip().split(".")[0]
        if section not in sections:
            allowed = ", ".join(f"{s}.KEY" for s in sections)
            raise ConfigError(f"--set {item}: only {allowed} can be set here")
        apply_override(raw, item)
    config = from_dict(Config, raw, "--set")
    dec = config.decode
    # check_config's rule, in the command line's words: `--nbest 3` over a run of beam 2 sets
    # no --set, and a run's own nbest may exceed a --beam given.
    if dec.nbest > dec.beam_size:
        raise ConfigError(
            f"--nbest {dec.nbest} needs --beam {dec.nbest} or more "
            f"(decode.nbest {dec.nbest}, decode.beam_size {dec.beam_size})"
        )
    return check_config(config, "--set")


def resolve_config_path(path: str | Path) -> Path:
    """A config file, or the shipped `configs/NAME.yaml` for a bare name like `small`."""
    p = Path(path)
    if p.is_file():
        return p
    shipped = Path(str(resources.files("configs") / f"{p.stem}.yaml"))
    if p.suffix in ("", ".yaml") and p.parent.name in ("", "configs") and shipped.is_file():
        return shipped
    raise ConfigError(f"{path}: no such config file")


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 ({e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set `a.b=c` in a nested dict; the value is parsed as YAML (`3e-4`, `true`, `[1, 2]`)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item}: expected section.key=value")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item}: {part} is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except yaml.YAMLError:
        raise ConfigError(f"--set {item}: the value is not valid YAML") from None


def from_dict(cls: type, raw: Any, source: str, prefix: str = "") -> Any:
    """Build dataclass `cls` from `raw`, rejecting unknown keys and wrongly typed values."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"{source}: unknown key '{dotted}'{suggest(key, names, prefix)}")
        hint = hints[key]
        values[key] = check_type(value, hint, dotted, source)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{source}: {prefix.rstrip('.')} needs {', '.join(missing)}")
    return cls(**values)


def suggest(key: str, names: list[str], prefix: str) -> str:
    near = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
    return f" (did you mean '{prefix}{near[0]}'?)" if near else f" (valid: {', '.join(names)})"


def check_type(value: Any, hint: Any, dotted: str, source: str) -> Any:
    """Return `value` if it fits `hint` (ints are accepted for floats), else raise ConfigError."""
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, source, f"{dotted}.")
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value in typing.get_args(hint):
            return value
        choices = ", ".join(repr(a) for a in typing.get_args(hint))
        raise ConfigError(f"{source}: {dotted} must be one of {choices}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            try:
                return check_type(value, arg, dotted, source)
            except ConfigError:
                if isinstance(value, list) and typing.get_origin(arg) is list:
                    raise  # the list's own problem says more than "the wrong type"
        raise ConfigError(f"{source}: {dotted} has the wrong type: got {value!r}")
    if origin is list:
        (item_hint,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {dotted} must be a list, got {value!r}")
        return [check_type(v, item_hint, f"{dotted}[{i}]", source) for i, v in enumerate(value)]
    if hint is type(None) and value is None:
        return None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        # PyYAML follows YAML 1.1, where `3e-4` (no dot) is a string, not a float.
        try:
            return float(value)
        except ValueError:
            pass
    if (
        isinstance(hint, type)
        and isinstance(value, hint)
        and not (isinstance(value, bool) and hint is not bool)
    ):
        return value
    name = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"{source}: {dotted} must be {name}, got {value!r}")


# Ranges the types cannot say, checked once at load so that no bad value reaches any work.
POSITIVE = (
    "data.max_len model.d_model model.n_heads model.d_ff model.n_encoder_layers "
    "model.n_decoder_layers model.norm_eps train.max_tokens train.max_sentences "
    "train.update_freq train.lr train.warmup_steps train.adam_eps train.max_bad_steps "
    "train.log_every train.dist_timeout decode.beam_size decode.nbest decode.max_tokens"
).split()  # warmup_steps 0 would divide by zero (noam) or leave the lr at 0 (inverse_sqrt)
NON_NEGATIVE = (
    "model.position_offset train.max_steps train.max_epochs train.max_time train.weight_decay "
    "train.clip_norm train.eval_every train.eval_bleu_sentences train.patience train.save_every "
    "train.keep_last decode.max_len_a decode.max_len_b decode.min_len "
    "decode.no_repeat_ngram_size decode.patience"
).split()
FRACTIONS = (  # in [0, 1)
    "model.dropout model.attention_dropout model.activation_dropout model.encoder_layerdrop "
    "model.decoder_layerdrop train.label_smoothing train.ema_decay"
).split()


def check_config(config: Config, source: str) -> Config:
    """Check values and relations between them; ConfigError naming the key, else `config`."""
    values = {f"{s}.{k}": v for s, section in config.to_dict().items() for k, v in section.items()}

    def fail(problem: str) -> None:
        raise ConfigError(f"{source}: {problem}")

    for key, value in values.items():  # inf and NaN pass every comparison below, or none
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            fail(f"{key} must be a finite number, got {value!r}")
    for key in POSITIVE:
        if values[key] <= 0:
            fail(f"{key} must be positive, got {values[key]!r}")
    for key in NON_NEGATIVE:
        if values[key] < 0:
            fail(f"{key} must be 0 or more, got {values[key]!r}")
    for key in FRACTIONS:
        if not 0 <= values[key] < 1:
            fail(f"{key} must be in [0, 1), got {values[key]!r}")
    d, m, t, dec = config.data, config.model, config.train, config.decode
    # train.init's model translates more than the corpora: known once `with_init` recorded it.
    check_data(d, fail, model_known=not t.init or bool(d.directions or d.languages))
    if (d.directions or d.languages) and d.corpora() and not t.init:
        key = "data.directions" if d.directions else "data.languages"
        fail(
            f"{key} records what a model translates besides its corpora (`tf train "
            "--init` and `tf import` write it); a run trained from scratch translates what its "
            "corpora train: remove it"
        )
    # A target of max_len pieces is max_len + 1 with BOS; a source, plus its prefix pieces
    # (a target-language token, a corpus tag).
    prefix = max([1] + [len(d.source_prefix(c)) for c in d.corpora()])
    if d.max_len + prefix > m.max_positions:
        fail(
            f"data.max_len {d.max_len} must be below model.max_positions {m.max_positions}"
            if prefix == 1
            else f"data.max_len {d.max_len} must be at most model.max_positions "
            f"{m.max_positions} less {prefix}, the pieces put before a source (a "
            "target-language token, a tag)"
        )
    if m.d_head < 0:
        fail(f"model.d_head must be 0 (d_model / n_heads) or more, got {m.d_head}")
    if not m.d_head and m.d_model % m.n_heads:
        fail(f"model.d_model {m.d_model} is not divisible by model.n_heads {m.n_heads}")
    if m.d_model % 2:
        fail(f"model.d_model {m.d_model} must be even (sine and cosine positions in pairs)")
    if m.positions == "fairseq" and m.d_model < 4:  # its frequencies divide by D/2 - 1
        fail(f"model.positions 'fairseq' needs model.d_model 4 or more, got {m.d_model}")
    if m.tie_embeddings == "all" and not d.joint_vocab:
        fail("model.tie_embeddings 'all' needs data.joint_vocab: true (one shared vocabulary)")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        fail(f"train.betas must be two numbers in [0, 1), got {t.betas!r}")
    if not DEVICE_PATTERN.fullmatch(t.device):
        fail(f"train.device {t.device!r} is unknown (expected auto, cpu, cuda or cuda:N)")
    if dec.nbest > dec.beam_size:
        fail(f"decode.nbest {dec.nbest} needs decode.beam_size {dec.nbest} or more")
    check_sampling(dec, fail)
    check_training_settings(config, fail)
    return config


def check_training_settings(config: Config, fail: Callable[[str], None]) -> None:
    """The settings of how the weights train: LoRA's, sharding's."""
    check_lora_settings(config, fail)
    check_shard_settings(config, fail)


def check_lora_settings(config: Config, fail: Callable[[str], None]) -> None:
    """train.lora and train.trainable: in range for the model, and only where they apply."""
    t = config.train
    check_new_language_settings(config, fail)
    if not t.lora.rank:
        if t.trainable:
            fail(
                "train.trainable names what trains beside LoRA's adapters; without "
                "train.lora.rank every weight trains: remove it"
            )
        return
    try:
        check_lora(t.lora, config.model)
    except ValueError as e:
        fail(f"train.lora: {e}")
    for group in t.trainable:
        if group not in TRAINABLE_GROUPS:
            fail(f"train.trainable: no group {group!r}{suggest(group, list(TRAINABLE_GROUPS), '')}")
    if not t.init:
        fail("train.lora adapts a pretrained model: it needs train.init (--init RUN)")
    if t.ema_decay:
        fail("train.ema_decay averages every weight: with train.lora set it to 0")


def check_new_language_settings(config: Config, fail: Callable[[str], None]) -> None:
    """data.new_languages grows a pretrained model; LoRA trains their rows alone where the
    optimizer's weight decay leaves the other rows of the same matrices as they are."""
    t = config.train
    if config.data.new_languages and not t.init:
        fail("data.new_languages adds languages to a pretrained model: it needs --init RUN")
    if "embeddings_of_new_languages" in t.trainable:
        if not config.data.new_languages:
            fail("train.trainable embeddings_of_new_languages: data.new_languages names none")
        if t.weight_decay:
            fail(
                "train.trainable embeddings_of_new_languages: train.weight_decay would move "
                "the frozen rows of the same matrices; set it to 0"
            )


def check_shard_settings(config: Config, fail: Callable[[str], None]) -> None:
    """train.shard: refused, in one line, beside what it does not do (yet)."""
    t = config.train
    if not t.shard:
        return
    if t.ema_decay:
        fail("train.ema_decay keeps a full copy of every weight: with train.shard set it to 0")
    if t.lora.rank:
        fail("train.lora trains megabytes of adapters, nothing to shard: set train.shard false")
    if t.precision == "fp16":
        fail("train.precision fp16: its loss scale is not sharded; use bf16 with train.shard")


def check_sampling(dec: DecodeConfig, fail: Callable[[str], None]) -> None:
    """The sampling settings: in range (the seed one every engine takes), and none given while
    sampling is off."""
    if dec.sampling_topk < -1:
        fail(f"decode.sampling_topk must be -1 (all), 0 (off) or above, got {dec.sampling_topk}")
    if not 0 < dec.sampling_topp <= 1:
        fail(f"decode.sampling_topp must be in (0, 1], got {dec.sampling_topp}")
    if not 0 < dec.sampling_temperature <= 100:
        fail(f"decode.sampling_temperature must be in (0, 100], got {dec.sampling_temperature}")
    if not 0 <= dec.seed < 2**32:  # CTranslate2's set_random_seed takes an unsigned 32-bit int
        fail(f"decode.seed must be in 0..{2**32 - 1} (32 bits, for every engine), got {dec.seed}")
    if not dec.sampling and (dec.sampling_topp != 1 or dec.sampling_temperature != 1):
        fail(
            "decode.sampling_topp and sampling_temperature shape random sampling, which is off "
            "(decode.sampling_topk 0): set sampling_topk to k, or -1 for every token"
        )


def save_config(config: Config, path: Path) -> None:
    """Write `config` as YAML, atomically: a run's config.yaml is rewritten on every resume, and
    one cut short by a kill or a full disk would leave a run that cannot resume."""
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    with atomic_output(path) as f:
        f.write(text)


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts, as 'key: old -> new' lines."""
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += config_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return lines
