"""A Hugging Face model's generation settings as tf's `decode.*`: what `model.generate()` does
with no arguments, as tf's search does it, and what tf has no equivalent for, each with why.

transformers reads `generation_config.json`, or, where a model has none (older OPUS-MT
uploads), the same keys in `config.json`; a key that neither names takes its default
(`DEFAULTS`, transformers' documented ones: an OPUS-MT model's beam search divides by
|Y| ** 1.0 and stops by its `early_stopping: false` estimate unless it says otherwise).

Lengths count differently: transformers' `max_length` counts the decoder's start token, and
at `max_length - 1` its `forced_eos_token_id` forces EOS, so a translation holds at most
`max_length - 2` tokens before its EOS (`max_len_b`, with `max_len_a` 0: one limit for every
sentence, as transformers has); `min_length` counts the start token too (`min_len` is one
less); `max_new_tokens` counts the generated tokens, the forced EOS included, and
`min_new_tokens` those before EOS (`min_len` itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cli.config import DecodeConfig
from data.errors import InputError
from data.files import read_json_object

GENERATION_CONFIG = "generation_config.json"

# transformers' defaults for the keys tf reads (GenerationConfig's documented values).
DEFAULTS: dict[str, Any] = {
    "num_beams": 1,
    "do_sample": False,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 1.0,
    "max_length": None,  # transformers' own default (20 tokens) is no model's: not taken
    "max_new_tokens": None,
    "min_length": 0,
    "min_new_tokens": None,
    "no_repeat_ngram_size": 0,
    "length_penalty": 1.0,
    "early_stopping": False,
    "forced_eos_token_id": None,
    "renormalize_logits": False,
    "bad_words_ids": None,
}

# Settings that change what `generate` does and that tf has no equivalent of: each with its
# default (a key at its default changes nothing) and why it cannot be imported.
NO_EQUIVALENT: dict[str, tuple[Any, str]] = {
    "repetition_penalty": (1.0, "tf has no repetition penalty"),
    "encoder_repetition_penalty": (1.0, "tf has no repetition penalty"),
    "encoder_no_repeat_ngram_size": (0, "tf bans no n-gram of the source"),
    "num_beam_groups": (1, "tf has no diverse beam search"),
    "diversity_penalty": (0.0, "tf has no diverse beam search"),
    "exponential_decay_length_penalty": (None, "tf's length penalty ranks finished outputs only"),
    "suppress_tokens": (None, "tf bans no tokens but the decoder's start"),
    "begin_suppress_tokens": (None, "tf bans no tokens but the decoder's start"),
    "sequence_bias": (None, "tf biases no token sequence"),
    "forced_bos_token_id": (
        None,
        "tf forces the first token per request: --to, where the decoder writes the target "
        "language's token first (NLLB-200, M2M100, mBART-50), or a prefix",
    ),
    "forced_decoder_ids": (None, "tf forces no token (a prefix does, per request)"),
    "force_words_ids": (None, "tf takes constraints per request, not in the model's settings"),
    "constraints": (None, "tf takes constraints per request, not in the model's settings"),
    "typical_p": (1.0, "tf samples by top-k and top-p only"),
    "min_p": (None, "tf samples by top-k and top-p only"),
    "epsilon_cutoff": (0.0, "tf samples by top-k and top-p only"),
    "eta_cutoff": (0.0, "tf samples by top-k and top-p only"),
    "penalty_alpha": (None, "tf has no contrastive search"),
    "guidance_scale": (None, "tf has no classifier-free guidance"),
    "num_return_sequences": (1, "tf's --nbest asks for more per run, not per model"),
    "max_time": (None, "tf stops a search by its length only"),
    "stop_strings": (None, "tf stops a translation at EOS only"),
    "remove_invalid_values": (False, "tf's search never sees NaN or inf log-probabilities"),
}

# Keys of generation_config.json that say nothing about the search: token ids (checked against
# the tokenizer elsewhere), outputs, caches, bookkeeping.
IGNORED = {
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "use_cache",
    "cache_implementation",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "transformers_version",
    "_from_model_config",
}


@dataclass
class Generation:
    """The decode settings read, and the record of what was taken from where.

    Attributes:
        decode: tf's decode settings for the model (DecodeConfig's defaults where the model
            says nothing tf takes).
        source: the file the settings came from (None: neither file has any).
        imported: {"from": {key: value}, "decode": {setting: value}} per setting taken.
        not_imported: {"key", "value", "why"} per setting tf has no equivalent for.
    """

    decode: DecodeConfig = field(default_factory=DecodeConfig)
    source: str | None = None
    imported: list[dict[str, Any]] = field(default_factory=list)
    not_imported: list[dict[str, Any]] = field(default_factory=list)

    def take(self, keys: dict[str, Any], **decode: Any) -> None:
        self.decode = replace(self.decode, **decode)
        self.imported.append({"from": keys, "decode": decode})

    def refuse(self, key: str, value: Any, why: str) -> None:
        self.not_imported.append({"key": key, "value": value, "why": why})

    def record(self) -> dict[str, Any]:
        """What import.json keeps of it."""
        return {"from": self.source, "imported": self.imported, "not_imported": self.not_imported}

    def report(self) -> list[str]:
        """Lines for `tf import`'s output."""
        taken = "; ".join(
            " ".join(f"{k}={_json(v)}" for k, v in item["decode"].items())
            + f" ({', '.join(f'{k} {_json(v)}' for k, v in item['from'].items())})"
            for item in self.imported
        )
        source = self.source or "its defaults (the model names no generation setting)"
        lines = [f"decoding as transformers' generate, from {source}: {taken or 'nothing'}"]
        if self.not_imported:
            refused = (f"{n['key']} {_json(n['value'])} ({n['why']})" for n in self.not_imported)
            lines.append("not imported: " + "; ".join(refused))
        return lines


def _json(value: Any) -> str:
    return json.dumps(value)


def read_generation(directory: Path, eos_id: int, start_id: int, start: str) -> Generation:
    """The generation settings of the model in `directory` as tf's decode settings.

    Args:
        directory: a Hugging Face model's directory.
        eos_id: the target vocabulary's EOS id; start_id: the decoder's first token, `start`
            its piece (Marian's: `<pad>`, which tf's search never outputs; NLLB-200's, M2M100's
            and mBART-50's: the EOS, `decoder_start_token_id` 2, which it does).

    Raises:
        InputError: a setting of the wrong kind, naming the file and key.
    """
    path = directory / GENERATION_CONFIG
    if path.is_file():
        found = read_json_object(path)
    else:  # transformers takes an older model's settings from its config.json
        path = directory / "config.json"
        known = set(DEFAULTS) | set(NO_EQUIVALENT)
        found = {k: v for k, v in read_json_object(path).items() if k in known}
    generation = Generation(source=path.name if found else None)
    settings = {**DEFAULTS, **{k: v for k, v in found.items() if v is not None}}  # None: unset
    check = _Checker(path, settings)
    _search(generation, settings, check)
    _lengths(generation, settings, check, eos_id)
    _banned(generation, settings, check, (start_id, eos_id), start)
    for key, (default, why) in NO_EQUIVALENT.items():
        if settings.get(key, default) not in (default, None):
            generation.refuse(key, settings[key], why)
    return generation


@dataclass
class _Checker:
    """Reads a setting, checked for its kind: a one-line InputError naming file and key."""

    path: Path
    settings: dict[str, Any]

    def int(self, key: str, least: int) -> int:
        value = self.settings[key]
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            kind = "a positive integer" if least == 1 else f"an integer of {least} or more"
            raise InputError(f"{self.path}: {key} must be {kind}, got {value!r}")
        return value

    def number(self, key: str) -> float:
        value = self.settings[key]
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            raise InputError(f"{self.path}: {key} must be a number, got {value!r}")
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.settings[key]
        if not isinstance(value, bool):
            raise InputError(f"{self.path}: {key} must be true or false, got {value!r}")
        return value


def _given(settings: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: settings[key] for key in keys}


def _search(generation: Generation, settings: dict[str, Any], check: _Checker) -> None:
    """The search: beam or sampling, its length penalty, its stopping rule, renormalising."""
    beams = check.int("num_beams", 1)
    samples = check.flag("do_sample")
    sampling = samples and beams == 1
    if sampling:  # one sample, drawn from transformers' top-k and top-p (by another generator)
        generation.take(
            _given(settings, "do_sample", "top_k", "top_p", "temperature"),
            beam_size=1,
            sampling_topk=check.int("top_k", 0) or -1,
            sampling_topp=check.number("top_p"),
            sampling_temperature=check.number("temperature"),
        )
    else:
        if samples:
            generation.refuse("do_sample", True, "beam-sample search has no tf equivalent")
        generation.take(_given(settings, "num_beams"), beam_size=beams)
    if check.flag("renormalize_logits"):
        generation.take(_given(settings, "renormalize_logits"), renormalize=True)
    if sampling:  # neither a length penalty nor a stopping rule: one sample of each line
        return
    generation.take(
        _given(settings, "length_penalty"),
        length_penalty=check.number("length_penalty"),
        length_penalty_form="power",
    )
    early = settings["early_stopping"]
    if early not in (True, False, "never"):
        raise InputError(
            f'{check.path}: early_stopping must be true, false or "never", got {early!r}'
        )
    stop = {
        False: dict(beam_stop="current_length", patience=0.0),  # transformers' estimate
        True: dict(beam_stop="bound", patience=1.0),  # done once num_beams have finished
        "never": dict(beam_stop="bound", patience=0.0),  # until no live one can win
    }[early]
    generation.take(_given(settings, "early_stopping"), **stop)


def _lengths(generation: Generation, settings: dict[str, Any], check: _Checker, eos: int) -> None:
    """The length limit (and whether EOS is forced there) and the least length."""
    forced = settings["forced_eos_token_id"]
    forces_eos = forced == eos or forced == [eos]
    if forces_eos:
        generation.take(_given(settings, "forced_eos_token_id"), score_forced_eos=False)
    elif forced is not None:
        generation.refuse("forced_eos_token_id", forced, f"tf forces its EOS ({eos}) at the limit")
    if settings["max_new_tokens"] is not None:
        key, generated = "max_new_tokens", check.int("max_new_tokens", 1)
    elif settings["max_length"] is not None:
        key, generated = "max_length", check.int("max_length", 2) - 1  # less the start token
    else:
        key, generated = None, 0
    if key is None:
        generation.refuse(
            "max_length",
            None,
            "none given: transformers' 20 tokens are no model's; tf keeps its own limit, "
            "decode.max_len_a x source length + decode.max_len_b",
        )
    elif generated - int(forces_eos) < 1:
        generation.refuse(key, settings[key], "leaves no token before EOS")
    else:
        keys = _given(settings, key) | ({"forced_eos_token_id": forced} if forces_eos else {})
        generation.take(keys, max_len_a=0.0, max_len_b=generated - int(forces_eos))
    if key is not None and forced is None:
        generation.refuse(
            "forced_eos_token_id",
            forced,
            "transformers cuts a translation at the limit without EOS; tf adds one there (the "
            "same text; beams cut there rank by its log-probability)",
        )
    if settings["min_new_tokens"] is not None:
        if check.int("min_new_tokens", 0):
            generation.take(_given(settings, "min_new_tokens"), min_len=settings["min_new_tokens"])
    elif check.int("min_length", 0) > 1:  # it counts the start token
        generation.take(_given(settings, "min_length"), min_len=settings["min_length"] - 1)
    if check.int("no_repeat_ngram_size", 0):
        generation.take(
            _given(settings, "no_repeat_ngram_size"),
            no_repeat_ngram_size=settings["no_repeat_ngram_size"],
        )


def _banned(
    generation: Generation,
    settings: dict[str, Any],
    check: _Checker,
    ids: tuple[int, int],
    start: str,
) -> None:
    """bad_words_ids: the decoder's start token tf bans already (unless it is the EOS, `ids`
    are the start's and the EOS's); any other has no equivalent."""
    start_id, eos_id = ids
    banned = settings["bad_words_ids"]
    if banned is not None and not (
        isinstance(banned, list)
        and all(isinstance(w, list) and all(_is_id(i) for i in w) for w in banned)
    ):
        raise InputError(f"{check.path}: bad_words_ids must be lists of token ids, got {banned!r}")
    words = banned or []
    if start_id == eos_id:  # the decoder starts from EOS (NLLB's, mBART-50's): banned nowhere
        if words:
            generation.refuse("bad_words_ids", words, "tf bans no token")
        return
    if [start_id] not in words:
        generation.refuse(
            "bad_words_ids",
            banned,
            f"tf never outputs {start} ({start_id}), the decoder's "
            "start token; transformers can without it",
        )
    others = [w for w in words if w != [start_id]]
    if others:
        generation.refuse("bad_words_ids", others, f"tf bans no token but {start}")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
