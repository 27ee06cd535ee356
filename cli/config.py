"""The one typed configuration tree: every default of `tf` lives here, in `ModelConfig`
(`model/`) and in `DataConfig` (`data/`).

A YAML file names only what differs from the defaults. Loading is strict: an unknown key or a
value of the wrong type is a `ConfigError` naming the dotted key and the nearest valid one.
Every number, at any depth, is finite and in the range its field declares in the schema
(`ranged(1.0, "(0, inf)")`: `data.ranges`); every setting that names files or folders is
marked so (`metadata={"path": True}`: `with_paths` finds them). `--set section.key=value`
overrides are parsed with `yaml.safe_load`, then checked the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
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
from data.ranges import first_out_of_range, out_of_range, ranged
from model.lora import NEW_ROWS, TRAINABLE_GROUPS, LoraConfig, check_lora
from model.transformer import ModelConfig

# The run's config beside an exported model (CTranslate2, Hugging Face): what `tf translate DIR`
# decodes with, and what `tf import` of an export restores.
TF_CONFIG = "tf_config.yaml"


class ConfigError(Exception):
    """A bad config file, key or value; `str()` is one line for the user."""


@dataclass
class TrainConfig:
    # 32 bits: SentencePiece's and numpy's generators take no more.
    seed: int = ranged(1, "[0, 4294967295]")
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False  # torch.compile the model
    # A checkpoint whose weights start the run (fine-tuning, e.g. a `tf prune` output): its model
    # shapes and its tokenizer replace the config's.
    init: str = field(default="", metadata={"path": True})
    deterministic: bool = False  # torch.use_deterministic_algorithms, for bit-exact resume tests
    # Seconds a torchrun rank waits in a collective (NCCL's default is 10 minutes): the others
    # wait while rank 0 alone trains the tokenizer and encodes a large corpus.
    dist_timeout: float = ranged(7200.0, "(0, inf)")
    # Batches: a token budget counted with padding, accumulated over update_freq batches per update.
    max_tokens: int = ranged(4096, "(0, inf)")
    max_sentences: int = ranged(1024, "(0, inf)")
    update_freq: int = ranged(1, "(0, inf)")
    # Stopping: whichever comes first; 0 disables a limit.
    max_steps: int = ranged(100_000, "[0, inf)")
    max_epochs: int = ranged(0, "[0, inf)")
    max_time: float = ranged(0.0, "[0, inf)")  # seconds of wall time
    # Optimiser: Adam(0.9, 0.98, eps 1e-9) as in the paper, section 5.3.
    # noam: a multiplier of d_model^-0.5 * min(...); the others: the peak.
    lr: float = ranged(1.0, "(0, inf)")
    # linear/cosine: warm up, then decay to 0 when the nearest of max_steps, max_epochs and
    # max_time is reached (with max_time the lr follows the clock, so reruns differ slightly;
    # with none of them set it stays at the peak).
    schedule: Literal["noam", "inverse_sqrt", "linear", "cosine"] = "noam"
    # (0 would divide by zero under noam, or leave the lr at 0 under inverse_sqrt.)
    warmup_steps: int = ranged(4000, "(0, inf)")
    betas: list[float] = ranged([0.9, 0.98], "[0, 1)")
    adam_eps: float = ranged(1e-9, "(0, inf)")
    weight_decay: float = ranged(0.0, "[0, inf)")
    # 0 disables gradient clipping.
    clip_norm: float = ranged(0.0, "[0, inf)")
    label_smoothing: float = ranged(0.1, "[0, 1)")
    # 0: off. Else the weights of record (validated, kept as best.pt, translated, exported) are
    # an exponential moving average of the trained ones with this decay (cli/training/ema.py);
    # the checkpoints keep the trained weights too, to resume from.
    ema_decay: float = ranged(0.0, "[0, 1)")
    # Stop after this many non-finite losses in a row.
    max_bad_steps: int = ranged(5, "(0, inf)")
    # Logging, validation, checkpoints (in updates).
    log_every: int = ranged(100, "(0, inf)")
    # 0: validate only at the end.
    eval_every: int = ranged(1000, "[0, inf)")
    eval_on_start: bool = False  # validate at step 0 too (fine-tuning: the imported model's BLEU)
    # Dev sentences decoded greedily for BLEU/chrF, per direction (two dev sets of one direction
    # share them evenly, what a short one cannot use going to the other); 0: all.
    eval_bleu_sentences: int = ranged(500, "[0, inf)")
    early_stop_metric: Literal["bleu", "chrf", "loss"] = "bleu"
    # Validations without improvement before stopping; 0 disables.
    patience: int = ranged(0, "[0, inf)")
    save_every: int = ranged(1000, "[0, inf)")
    keep_last: int = ranged(5, "[0, inf)")  # step_N.pt files kept
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
    beam_size: int = ranged(4, "(0, inf)")  # paper, section 6.1
    # GNMT's alpha in ((5 + len) / 6) ** alpha.
    length_penalty: float = ranged(0.6, "(-inf, inf)")
    # The output length limit: a * src_len + b (paper: src_len + 50).
    max_len_a: float = ranged(1.0, "[0, inf)")
    max_len_b: int = ranged(50, "[0, inf)")
    min_len: int = ranged(0, "[0, inf)")
    nbest: int = ranged(1, "(0, inf)")
    no_repeat_ngram_size: int = ranged(0, "[0, inf)")
    # Beam search: a sentence stops at its max length, once no live hypothesis can beat its
    # nbest finished ones, or once beam_size x patience of its hypotheses have finished
    # (CTranslate2's `patience`, Kasai et al. 2022; 1 is fairseq's rule). 0: only the first two.
    # On the shared test set (small, beam 5) patience 2 left 992 of 1,000 translations as the
    # exhaustive search made them, in 0.6x the time; patience 1 changed 93 and cost 0.2 BLEU.
    patience: float = ranged(2.0, "[0, inf)")
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
    # Source tokens per translation batch, padding counted.
    max_tokens: int = ranged(4096, "(0, inf)")
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
    sampling_topk: int = ranged(0, "[-1, inf)", says="-1 (all), 0 (off) or above")
    # Then the most probable tokens whose mass reaches p (nucleus).
    sampling_topp: float = ranged(1.0, "(0, 1]")
    # Log-probabilities are divided by it before drawing.
    sampling_temperature: float = ranged(1.0, "(0, 100]")
    # 32 bits, for every engine: CTranslate2's set_random_seed takes an unsigned 32-bit int.
    seed: int = ranged(0, "[0, 4294967295]")

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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    values = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"{source}: unknown key '{dotted}'{suggest(key, names, prefix)}")
        values[key] = check_type(value, hints[key], dotted, source)
        check_number(values[key], fields[key], dotted, source)
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
        try:
            return float(value)
        except OverflowError:  # over 1e308: no finite float
            raise ConfigError(f"{source}: {dotted} must be a finite number, got {value}") from None
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


def check_number(value: Any, f: dataclasses.Field, dotted: str, source: str) -> None:
    """`value` of field `f` (a number, or a list of numbers) finite and in `f`'s declared range
    (`data.ranges.out_of_range`), else a ConfigError naming `dotted`; any other value passes."""
    problem = out_of_range(value, f)
    if problem:
        raise ConfigError(f"{source}: {dotted} {problem}, got {value!r}")


def check_numbers(node: Any, source: str) -> None:
    """Every number of the dataclass tree `node` (a config built in code: an import's, a merged
    one) finite and in its field's range, as `from_dict` checks those a file gives."""
    problem = first_out_of_range(node)
    if problem:
        raise ConfigError(f"{source}: {problem}")


def check_config(config: Config, source: str) -> Config:
    """Check values and relations between them; ConfigError naming the key, else `config`."""

    def fail(problem: str) -> None:
        raise ConfigError(f"{source}: {problem}")

    check_numbers(config, source)  # each in its range first: the relations below assume it
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
    if not m.d_head and m.d_model % m.n_heads:
        fail(f"model.d_model {m.d_model} is not divisible by model.n_heads {m.n_heads}")
    if m.d_model % 2:
        fail(f"model.d_model {m.d_model} must be even (sine and cosine positions in pairs)")
    if m.positions == "fairseq" and m.d_model < 4:  # its frequencies divide by D/2 - 1
        fail(f"model.positions 'fairseq' needs model.d_model 4 or more, got {m.d_model}")
    if m.tie_embeddings == "all" and not d.joint_vocab:
        fail("model.tie_embeddings 'all' needs data.joint_vocab: true (one shared vocabulary)")
    if len(t.betas) != 2:
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
    """data.new_languages grows a pretrained model, whose new rows LoRA may train (whether
    weight decay would move the others of a matrix that trains its new rows alone depends on
    the model's tying: `cli.training.lora.check_weight_decay`)."""
    t = config.train
    if config.data.new_languages and not t.init:
        fail("data.new_languages adds languages to a pretrained model: it needs --init RUN")
    if NEW_ROWS in t.trainable and not config.data.new_languages:
        fail("train.trainable embeddings_of_new_languages: data.new_languages names none")


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
    """The sampling settings (each in its range already): none given while sampling is off."""
    if not dec.sampling and (dec.sampling_topp != 1 or dec.sampling_temperature != 1):
        fail(
            "decode.sampling_topp and sampling_temperature shape random sampling, which is off "
            "(decode.sampling_topk 0): set sampling_topk to k, or -1 for every token"
        )


def with_paths(node: Any, place: Callable[[str], str], like: Any = None) -> Any:
    """`node` (a dataclass of the schema: the config, a section, a corpus entry) with `place`
    applied to the value of every setting that names files or folders, at any depth: each field
    marked `metadata={"path": True}` that holds a string (a path, a corpus spec), and those of
    the entries of a list (`data.train: [{corpus: ...}]`). `like`: a node of the same schema (a
    run's saved config) whose value of such a setting is kept, as it is written, where `place`
    makes the same of both."""
    changed = {}
    for f in dataclasses.fields(node):
        value, kept = getattr(node, f.name), getattr(like, f.name, None)
        if isinstance(value, str) and f.metadata.get("path"):
            placed = place(value)
            changed[f.name] = kept if isinstance(kept, str) and place(kept) == placed else placed
        elif dataclasses.is_dataclass(value):
            changed[f.name] = with_paths(value, place, kept)
        elif isinstance(value, list) and any(dataclasses.is_dataclass(v) for v in value):
            olds = (
                kept if isinstance(kept, list) and len(kept) == len(value) else [None] * len(value)
            )
            changed[f.name] = [with_paths(v, place, old) for v, old in zip(value, olds)]
    return dataclasses.replace(node, **changed)


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
