"""`make bench` runs to its last table: every section at the smoke size (`tiny`, a handful of
batches and sentences) returns the fields its table prints, then `benchmarks.run --smoke` end
to end. Nothing else runs a benchmark, so a signature change in cli/ or model/ would otherwise
break `make bench` silently (as one did, half-way through, in the decoding section)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch

from benchmarks import common, decode_bench, engines_bench, run, train_bench
from benchmarks.common import corpus_batches, run_python
from benchmarks.run import SMOKE
from cli.config import load_config
from cli.device import autocast_dtype
from data.config import DataConfig

CT2 = importlib.util.find_spec("ctranslate2") is not None  # the `export` extra; CI has it
PRECISIONS = ("fp32", "bf16")
# One pytest-xdist worker runs the whole module (`make test`: --dist loadgroup): its tests share
# the trained model and MEASURED, which another worker would make again.
pytestmark = pytest.mark.xdist_group("benchmarks")
SEARCHES = ("greedy", "beam5")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory):
    """One results folder for the module: the corpus head, tokenizers and the trained model are
    made once. The working directory is it too, so a user's runs/tiny is not decoded here."""
    folder = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        yield folder


@pytest.fixture(scope="module")
def trained(out: Path) -> Path:
    """`tiny` trained for a few updates through `tf train`'s function, once for all decoders."""
    return run.trained_run(SMOKE, out)


# What each section's own test measured: the end-to-end run below takes these results instead
# of measuring them a second time.
MEASURED: dict[str, dict] = {}


def assert_numbers(r: dict, keys: list[str]) -> None:
    missing = [key for key in keys if key not in r]
    assert not missing, f"missing {missing}"
    bad = {key: r[key] for key in keys if not (math.isfinite(r[key]) and r[key] > 0)}
    assert not bad, f"not positive: {bad}"


def test_data(out, capsys):
    r = MEASURED["data"] = run.data_section(SMOKE, out)
    assert r["pairs"] == SMOKE.pairs and r["vocab_size"] == 100 and r["max_tokens"] == 512
    keys = ["load_s", "tokenizer_train_s", "encode_s", "encode_cached_s", "mean_src_tokens"]
    keys += ["mean_tgt_tokens", "batch_plan_s", "epoch_collate_s", "batches"]
    assert_numbers(r, [*keys, "sentences_per_batch", "padding_efficiency"])
    shapes = r["shapes_3_epochs"]
    assert set(shapes) == {"1", str(r["pad_multiple"])}
    for each in shapes.values():
        assert each["batches"] >= 3 and 0 < each["distinct_shapes"] <= each["batches"]
        assert 0 <= each["padding_share"] < 1
    printed = capsys.readouterr().out
    assert "padding efficiency" in printed and "pad_multiple 1: shapes in 3 epochs" in printed


def test_train(out, capsys):
    r = MEASURED["train"] = run.train_section(SMOKE, out)
    keys = [
        f"{name}_{precision}_{field}"
        for name in ("tf", "reference", "reference_matched")
        for precision in PRECISIONS
        for field in ("tokens_per_s", "vs_reference_fp32", "tflops")
    ]
    assert_numbers(r, keys)
    assert r["batches"] == SMOKE.batches
    assert "reference_matched" in capsys.readouterr().out
    # The peak memory column, off at the smoke size (a fresh process per model): one probe.
    tokenizer, batches = corpus_batches(load_config("tiny"), 1, pairs=SMOKE.pairs, out=out)
    assert 0 < train_bench.peak_rss_mb("tf", "tiny", "bf16", batches, tokenizer) < 100_000


def test_loop(out, capsys):
    """`tf train` launched as a user does, a few updates of `tiny`."""
    r = MEASURED["loop"] = run.loop_section(SMOKE, out)
    assert (r["config"], r["updates"]) == ("tiny", SMOKE.loop_updates)
    keys = [
        f"{prefix}_{precision}_{suffix}"
        for precision in SMOKE.loop_precisions
        for prefix, suffix in (
            ("tf_loop", "tokens_per_s"),
            ("reference_fp32_around", "tokens_per_s"),
            ("tf_loop", "vs_reference_fp32"),
        )
    ]
    assert_numbers(r, keys)
    precision = SMOKE.loop_precisions[-1]
    assert f"tiny {precision}, {SMOKE.loop_updates} updates" in capsys.readouterr().out


def test_attention(out, capsys):
    r = MEASURED["attention"] = run.attention_section(SMOKE, out)
    keys = [
        f"{kernel}_{precision}_{mask}_ms"
        for kernel in ("sdpa", "sdpa_math", "ours")
        for precision in PRECISIONS
        for mask in ("padding", "causal")
    ]
    assert_numbers(r, keys)
    assert "fp32, causal" in capsys.readouterr().out


def test_dropout(out, capsys):
    """The two dropouts' kernels, then `tiny` training with each in turn, in one process."""
    r = MEASURED["dropout"] = run.dropout_section(SMOKE, out)
    assert_numbers(r, [f"{name}_{p}_ms" for name in ("torch", "ours") for p in PRECISIONS])
    loop = r["loop"]
    assert (loop["config"], loop["updates"]) == ("tiny", SMOKE.loop_updates)
    assert loop["torch"] > 0 and loop["tf"] > 0
    assert "updates alternated in one process" in capsys.readouterr().out


def test_dropout_bench_runs_as_the_readme_shows(tmp_path):
    """`python -m benchmarks.dropout_bench --config small --updates 60 --precision bf16`, at
    `tiny`'s size: the kernels' table, then the training loop's line."""
    args = ["--config", "tiny", "--updates", "4", "--precision", "fp32", "--pairs", "500"]
    printed = run_python("-m", "benchmarks.dropout_bench", *args, "--out", str(tmp_path))
    assert "F.dropout ms" in printed
    assert "`tiny` with model.dropout 0.1, fp32, 4 updates alternated" in printed


def test_documents(trained, capsys):
    """Document mode against line mode (issue 69, item 5) at the smoke size: every score and
    both speeds, the units covering every verse."""
    from benchmarks import documents_bench

    r = documents_bench.run(str(trained), n_verses=30, repeats=1)
    assert r["verses"] == 30 and r["paragraphs"] >= 4 and r["units"] <= 30
    assert_numbers(r, ["document_verses_per_s", "verses_per_s", "throughput_ratio"])
    for key in ("document_units", "verses_units", "paragraph_lines_now", "paragraph_lines_before"):
        assert 0 <= r[key]["bleu"] <= 100 and 0 <= r[key]["chrf"] <= 100
    documents_bench.table(r)
    assert "verses/s" in capsys.readouterr().out


def test_decode(out, trained, capsys):
    """Cached and uncached search, greedy and beam 5, over the same sentences."""
    r = MEASURED["decode"] = run.decode_section(SMOKE, out)
    assert r["run"] == str(trained) and r["sentences"] == SMOKE.sentences
    fields = ("sentences_per_s", "tokens_per_s", "uncached_tokens_per_s", "speedup_vs_uncached")
    fields += ("cached_tokens", "uncached_tokens")
    assert_numbers(r, [f"{search}_{field}" for search in SEARCHES for field in fields])
    assert "cache speed-up" in capsys.readouterr().out


def test_engines(out, trained, capsys):
    """Every engine `tf translate` can use, the CTranslate2 exports included where installed."""
    r = MEASURED["engines"] = run.engines_section(SMOKE, out)
    engines = ["tf_fp32", "tf_int8"]
    engines += ["tf_bf16"] if autocast_dtype("auto", torch.device("cpu")) == torch.bfloat16 else []
    engines += ["ct2_float32", "ct2_int8"] if CT2 else []
    keys = [
        f"{engine}_{search}_{field}"
        for engine in engines
        for search in SEARCHES
        for field in ("sentences_per_s", "tokens_per_s", "tokens")
    ]
    assert_numbers(r, keys)
    assert all(f"{engine}_{search}_bleu" in r for engine in engines for search in SEARCHES)
    assert all(0 <= r[f"{engine}_{search}_steal"] <= 1 for engine in engines for search in SEARCHES)
    table = capsys.readouterr().out
    assert all(engine in table for engine in engines) and "host steal" in table


class FakeWorker:
    """A search that takes 10 s, then 5, then 3.3 (to tell the tries apart), while the host
    steals the next of `steals` seconds."""

    def __init__(self, steals: list[float], clock: list[float]):
        self.steals, self.clock, self.calls = iter(steals), clock, 0

    def translate(self, beam: int):
        self.calls += 1
        self.clock[0] += next(self.steals)
        return 10.0 / self.calls, [[self.calls]]  # each try faster, to tell them apart


@pytest.mark.parametrize(
    ("steals", "calls", "kept"),
    [
        ([0.0], 1, 1),  # undisturbed: run once
        ([8.0, 0.0], 2, 2),  # 8 s of 2 CPUs x 10 s stolen: run again
        ([8.0, 3.0, 7.0], 3, 2),  # 40%, 30%, 105%: the least disturbed try is kept
    ],
)
def test_a_search_the_host_disturbed_runs_again(monkeypatch, steals, calls, kept):
    clock = [0.0]
    monkeypatch.setattr(engines_bench, "stolen_seconds", lambda: clock[0])
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    worker = FakeWorker(steals, clock)
    seconds, stolen, outputs = engines_bench.undisturbed(worker, beam=5)
    assert worker.calls == calls and outputs == [[kept]]
    assert stolen == pytest.approx(steals[kept - 1] / (2 * seconds))


def test_the_int8_report_names_each_layer_shape_without_an_exact_kernel(monkeypatch):
    """tf_int8's line says which layers multiply through `torch._int_mm` and which in float32,
    every layer's shape asked as `--int8` asks it: a CPU exact for (d_model, d_ff) alone was
    reported as running every layer through the int8 kernel."""
    import model.int8
    from model.transformer import Transformer

    vocab = 40  # an output layer of a shape of its own
    tiny = Transformer(load_config("tiny").model, vocab, vocab, pad_id=0).eval()
    c = tiny.config
    exact = {(c.d_model, c.d_ff)}  # linear1 of each layer, no other shape
    monkeypatch.setattr(model.int8, "int_mm_is_exact", lambda k, n: (k, n) in exact)
    said = engines_bench.products(tiny)
    layers = c.n_encoder_layers + c.n_decoder_layers  # one linear1 each
    assert said.startswith(f"torch._int_mm in {layers} of ")
    for k, n in [(c.d_ff, c.d_model), (c.d_model, c.d_model), (c.d_model, vocab)]:
        assert f"{k}x{n}" in said  # linear2, the attentions' projections, the output layer
    monkeypatch.setattr(model.int8, "int_mm_is_exact", lambda k, n: True)
    assert engines_bench.products(tiny).startswith("torch._int_mm in all ")


def test_stolen_seconds_reads_the_steal_column(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 900 3 0 2 250 0 0\ncpu0 50 0 25 450 1 0 1 125 0 0\n")
    assert common.stolen_seconds(stat) == 250 / os.sysconf("SC_CLK_TCK")
    stat.write_text("intr 1 2 3\n")  # no cpu line: nothing to read
    assert common.stolen_seconds(stat) == 0.0
    assert common.stolen_seconds(tmp_path / "missing") == 0.0  # no /proc: not Linux


def test_scaling(out, trained, capsys):
    r = MEASURED["scaling"] = run.scaling_section(SMOKE, out)
    assert list(r["train"]) == list(SMOKE.scaling_configs)
    assert_numbers(r["train"], list(SMOKE.scaling_configs))
    assert r["decode"], "no source-length bucket decoded"
    for bucket in r["decode"].values():
        assert_numbers(bucket, ["sentences", "greedy_ms", "beam5_ms", "greedy_out_tokens"])
        assert bucket["sentences"] <= SMOKE.per_bucket
    assert "vs tiny" in capsys.readouterr().out


def test_serve(out, trained, capsys):
    """`tf serve` of the run, and of its CTranslate2 export where installed, under both loads
    at each number of clients, against `tf translate` in the same precision."""
    r = MEASURED["serve"] = run.serve_section(SMOKE, out)
    check_serve(json.loads(json.dumps(r)))  # as bench.json holds it: the clients as strings
    printed = capsys.readouterr().out
    assert (
        f"same sentence, fp32 on {r['cpu']}" in printed and "tf translate, one process" in printed
    )
    assert ("CTranslate2 export" in printed) == CT2


def check_serve(r: dict) -> None:
    """The serve section's results as bench.json holds them: every engine, precision, load and
    number of clients measured, no request failed, each ratio to its own tf translate."""
    assert r["precisions"] == list(SMOKE.serve_precisions) and r["cpu"]
    assert set(r["serve"]) == ({"tf", "ctranslate2"} if CT2 else {"tf"})
    for precision in r["precisions"]:
        reference = r["translate"][precision]
        assert set(reference) == {"same sentence", "varied"}
        for load, (before, after) in r["translate_before_after"][precision].items():
            assert before > 0 and after > 0  # measured around the servers, the mean is used
            assert reference[load] == pytest.approx((before + after) / 2)
        for engine in r["serve"].values():
            assert set(engine[precision]) == set(reference)
            for load, by_clients in engine[precision].items():
                assert set(by_clients) == {str(n) for n in SMOKE.serve_clients}
                for s in by_clients.values():  # the light client's figures
                    assert s["errors"] == 0 and 0 < s["p50_ms"] <= s["p99_ms"]
                    assert s["vs_translate"] == pytest.approx(s["requests_per_s"] / reference[load])
                    assert s["requests_per_s"] > 0 and reference[load] > 0


AB_REPORT = """Concurrency Level:      32
Time taken for tests:   2.345 seconds
Complete requests:      300
Failed requests:        7
   (Connect: 0, Receive: 1, Length: 5, Exceptions: 1)
Non-2xx responses:      3
Requests per second:    127.93 [#/sec] (mean)
Time per request:       250.137 [ms] (mean)

Percentage of the requests served within a certain time (ms)
  50%    245
  66%    260
  90%    300
  99%    380
 100%    400 (longest request)
"""


def test_serve_bench_reads_an_apachebench_report():
    from benchmarks.serve_bench import parse_ab

    r = parse_ab(AB_REPORT)
    # Length "failures" are answers of another size than the first: not errors
    assert r == {"requests_per_s": 127.93, "p50_ms": 245.0, "p99_ms": 380.0, "errors": 5}


def test_run_smoke_end_to_end(out, trained, capsys, monkeypatch):
    """`python -m benchmarks.run --smoke`: an estimate first, each section timed, bench.json.
    The sections whose own tests above ran them give those results (run alone, this test
    measures them all); the others run here."""
    sections = [name for name, _ in run.SECTIONS]
    monkeypatch.setattr(
        run,
        "SECTIONS",
        [
            (name, (lambda size, out, r=MEASURED[name]: r) if name in MEASURED else section)
            for name, section in run.SECTIONS
        ],
    )
    run.main(["--smoke", "--out", str(out)])
    printed = capsys.readouterr().out
    bench = json.loads((out / "bench.json").read_text())
    assert bench["size"] == "smoke"
    assert all(bench[name] for name in sections)
    assert list(bench["section_seconds"]) == sections
    cpu, estimate = printed.splitlines()[:2]
    assert cpu.startswith("CPU: ") and "GFLOPS; precision: auto is " in cpu
    assert estimate.startswith("benchmarks at smoke size: about ")
    assert all(f"section {name}: " in printed for name in sections)
    assert printed.index("section scaling: ") < printed.index("section serve: ")
    if "serve" not in MEASURED:  # measured here (test_serve did not run first): its table too
        assert printed.index("section scaling: ") < printed.index("== `tf serve` on loopback")
    check_corpus(bench["corpus"])
    check_serve(bench["serve"])
    memory = bench["memory"]
    runs = [f"train_pad_multiple_{m}" for m in sorted({1, DataConfig.pad_multiple})]
    assert memory["precision"] in ("fp32", "bf16") and "RSS over `tf train tiny`" in printed
    for m in [memory[key] for key in runs] + [memory["translate"]]:
        assert 0 < m["rss_at_tenth_gb"] <= m["peak_rss_gb"] < 64
        assert m["peak_over_tenth"] == pytest.approx(m["peak_rss_gb"] / m["rss_at_tenth_gb"])
    assert all(memory[key]["tokens_per_s"] > 0 for key in runs)
    assert memory["translate"]["sentences_per_s"] > 0
    assert set(bench["finetune"]) == {"tiny", "nllb-tiny"}  # Marian's layout, NLLB-200's
    for standin in bench["finetune"].values():
        (precision,) = set(standin) & {"fp32", "bf16"}  # the machine's own (auto)
        both = standin[precision]
        assert both["ratio"] > 0 and both["tf"]["peak_rss_gb"] > 0
        assert both["transformers"]["tokens_per_s"] > 0 and "CPU: " in printed
    lora = bench["lora"]  # full, LoRA and peft's LoRA on the same batches
    assert set(lora["loops"]) == {"tf, full", "tf, LoRA", "transformers + peft, LoRA"}
    assert all(m["tokens_per_s"] > 0 and m["peak_rss_gb"] > 0 for m in lora["loops"].values())
    assert 0 < lora["lora_over_full"]["checkpoint"] < 1 and lora["tf_over_peft"] > 0
    paired = lora["paired"]  # the two LoRA updates alternated in one process
    assert paired["tf_over_peft"] == paired["tf_tokens_per_s"] / paired["peft_tokens_per_s"] > 0


def check_corpus(results: dict) -> None:
    """The corpus section's fields (run in the end-to-end smoke run: three `tf train` launches)."""
    (start,) = results.values()
    first, cached, ranks = start["first"], start["cached"], start["two_ranks"]
    assert {"reading", "cleaning", "encoding / cached ids", "model + 1 update"} <= set(
        first["stages"]
    )
    assert "cleaning" not in cached["stages"]  # the cached start does not clean again
    assert len(ranks["ranks"]) >= 2 and all(r["peak_pss_gb"] > 0 for r in ranks["ranks"])
    assert start["disk_gb"] > 0 and first["seconds_to_first_update"] > 0
    assert first["tree_peak_pss_gb"] >= first["ranks"][0]["peak_pss_gb"] > 0


def test_backtranslation_halves_split_the_bundled_pairs_by_verse(tmp_path):
    from benchmarks import backtranslation

    backtranslation.split(tmp_path)
    halves = {
        f"{h}.{lang}": (tmp_path / f"half-{h}.{lang}").read_text().splitlines()
        for h in "ab"
        for lang in ("es", "en")
    }
    assert len(halves["a.es"]) == len(halves["a.en"]) and len(halves["b.es"]) == len(halves["b.en"])
    assert len(halves["a.en"]) + len(halves["b.en"]) == 28_045
    assert abs(len(halves["a.en"]) - len(halves["b.en"])) < 1000  # odd and even verses
    assert not set(halves["a.en"][:500]) & set(halves["b.en"][:500])


def test_backtranslation_keeps_each_budget_and_recipe_apart_and_scores_its_sources(tmp_path):
    from benchmarks import backtranslation

    folders = {
        backtranslation.results_dir(steps, recipe)
        for steps, recipe in [(1000, ()), (2000, ()), (2000, ("model.dropout=0.1",))]
    }
    assert len(folders) == 3  # no run of one budget or recipe is taken for another's
    real, synthetic = tmp_path / "real.es", tmp_path / "synthetic.es"
    real.write_text("el principio de todo\ny dijo dios\n")
    synthetic.write_text("el principio de todo\ny dijo dios\n")
    assert backtranslation.quality(synthetic, real)["bleu_vs_real"] == pytest.approx(100)
    synthetic.write_text("otra cosa distinta\nnada igual aqui\n")
    assert backtranslation.quality(synthetic, real)["bleu_vs_real"] < 10


def test_control(out, trained, capsys):
    from benchmarks import control_bench

    assert control_bench.term("And God said, Let there be light.", phrase=False) == "light"
    assert control_bench.term("And God said, Let there be light.", phrase=True) == "light"
    assert control_bench.term("Jacob went to Bethel and built", phrase=True) == "Bethel and"
    r = control_bench.constraints(str(trained), out / "constraints", n=6)
    assert r["with"]["terms_held"] == 1.0 and r["terms"] == 6
    assert_numbers(r["without"], ["sentences_per_s"])
    e = control_bench.ensembles({"one": [str(trained)], "two": [str(trained)] * 2}, limit=4)
    assert e["one"]["bleu"] == e["two"]["bleu"] and e["one"]["chrf"] == e["two"]["chrf"]


def test_the_quick_size_shrinks_on_a_slower_cpu_and_only_there():
    """`make bench QUICK=1` measures the CPU first: on one half as fast as the reference it
    does half the updates and sentences (about the same minutes); the full size never
    shrinks, and a CPU as fast or faster keeps the quick size."""
    slow = run.sized_for(run.QUICK, run.REFERENCE_GFLOPS / 2)
    # the loop keeps two log windows (the first is warm-up)
    assert 2 * slow.loop_log_every <= slow.loop_updates < run.QUICK.loop_updates
    assert slow.sentences == run.QUICK.sentences // 2
    assert slow.finetune_updates == run.QUICK.finetune_updates // 2
    assert run.sized_for(run.QUICK, 10 * run.REFERENCE_GFLOPS) == run.QUICK
    assert run.sized_for(run.QUICK, 0.9 * run.REFERENCE_GFLOPS) == run.QUICK  # noise, not a cut
    assert run.sized_for(run.FULL, 1.0) == run.FULL
    # the loop runs bf16 only where it is native, at every size
    assert run.sized_for(run.FULL, 1.0, native_bf16=False).loop_precisions == ("fp32",)
    assert "bf16" in run.sized_for(run.FULL, 1.0, native_bf16=True).loop_precisions
    assert run.matmul_gflops(0.05) > 0


def test_a_users_run_is_decoded_only_if_it_holds_the_configs_model(tmp_path, monkeypatch):
    """runs/NAME stands in for the config's trained model only when it is that model: `make
    demo` on a CPU without bf16 leaves demo-fp32's narrower model in runs/demo."""
    from cli.commands import train
    from cli.config import load_config, save_config

    monkeypatch.chdir(tmp_path)
    trained_anew = []
    monkeypatch.setattr(train, "run_train", lambda config, out, **kw: trained_anew.append(out))
    for sets, expected in ((["model.d_model=48"], None), ([], Path("runs") / "tiny")):
        run = Path("runs") / "tiny"
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run / "checkpoints" / "last.pt").touch()
        save_config(load_config("tiny", sets), run / "config.yaml")
        got = decode_bench.default_run(tmp_path / "out", "tiny", ())
        assert got == (expected or tmp_path / "out" / "tiny")
    assert trained_anew == [tmp_path / "out" / "tiny"]  # trained once: for the other model


def test_lora_quality_runs_as_the_readme_shows_at_a_tiny_size(tmp_path, capsys):
    """`python -m benchmarks.lora_quality`: pretraining on half the pairs, full and LoRA
    fine-tuning on the other half, each scored; 2 updates each, 4 lines scored."""
    from benchmarks import lora_quality

    results = lora_quality.run(updates=2, ranks=(2,), out=tmp_path, pretrain_steps=2, lines=4)
    assert set(results["runs"]) == {"pretrained", "full", "lora-2"}
    full, lora = results["runs"]["full"], results["runs"]["lora-2"]
    assert lora["checkpoint_mb"] < full["checkpoint_mb"] / 10  # the adapters alone
    assert all(0 <= r["test_bleu"] <= 100 for r in results["runs"].values())
    lora_quality.print_results(results)
    assert "lora-2" in capsys.readouterr().out
