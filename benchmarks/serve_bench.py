"""`tf serve` under load, measured where users feel it (issue 59): requests/s and p50/p99
latency at 1, 8, 32 and 64 concurrent clients, one sentence a request, in fp32 and (where the
CPU computes it natively) bf16, against a live server on loopback started as a user starts it
(its own process) and a light client in another (`benchmarks.load_client`: asyncio, it takes
next to no CPU). Each precision has its reference measured in the same run: the same sentences
through `tf translate`'s path in one process (`Engine.stream`, in its batches), before the
servers start and again after they end, the ratios against the mean of the two. The peer is
`tf serve` of the same model's CTranslate2 export (`tf export --to ctranslate2`, made once),
under the same loads, clients and precision. Two loads: one sentence of median length sent
again and again (the issue's ApacheBench setting), and the test set's sentences, one each.
`--ab` checks the first load with ApacheBench itself (`ab -c 32`), where `ab` is installed.

    python -m benchmarks.serve_bench [--run RUN] [--sentences 300] [--clients 1,8,32,64]
        [--precisions fp32,bf16] [--ab] [--workers N]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import importlib.util
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.common import OUT, ROOT, cpu_name, print_table, run_python
from benchmarks.decode_bench import default_run, source_sentences

ENGINES = {"tf": "tf serve, loopback", "ctranslate2": "tf serve, CTranslate2 export"}
AB_CLIENTS = 32  # the ApacheBench setting


def run(
    run_dir: Path,
    sentences: list[str],
    clients: tuple[int, ...] = (1, 8, 32, 64),
    device: str = "auto",
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    out: Path = OUT,
    ab: bool = False,
    workers: int = 0,
) -> dict:
    """Every engine, precision, load and number of clients, for one model (`tf serve
    --workers WORKERS`, 0: its default). At each number of clients every sentence of the load
    is sent once.

    Returns:
        {"sentences", "cpu", "clients", "precisions", "notes" (what was left out, and why),
        "translate": {precision: {load: sentences/s}},
        "serve": {engine: {precision: {load: {clients: {requests_per_s, p50_ms, p99_ms, errors,
        vs_translate}}}}}, and with `ab`, "ab": {engine: {precision: the same figures}}}.
        Engines: "tf" (the run) and "ctranslate2" (its export); loads: "same sentence" and
        "varied".
    """
    loads = make_loads(sentences)
    notes: list[str] = []
    results: dict = {"sentences": len(sentences), "cpu": cpu_name(), "clients": list(clients)}
    results |= {"precisions": usable_precisions(precisions, device, notes), "notes": notes}
    results |= {"translate": {}, "serve": {}} | ({"ab": {}} if ab else {})
    peer = ctranslate2_export(run_dir, out, notes)
    if ab and shutil.which("ab") is None:
        notes.append("--ab: no `ab` on PATH, ApacheBench not run")
        ab = False
    results["translate_before_after"] = {}
    for precision in results["precisions"]:
        # Measured with the cores to itself, before the servers start and again after they
        # end: the ratios are against the mean of the two, and both are kept (this machine's
        # speed moved by up to 1.4x within minutes, which one measurement would not show).
        before = reference_rates(run_dir, loads, device, precision)
        served_by: dict = {}
        for engine, path in engines_for(run_dir, peer, precision, device, notes).items():
            served_by[engine] = under_server(path, loads, clients, device, precision, ab, workers)
        after = reference_rates(run_dir, loads, device, precision)
        reference = {name: (before[name] + after[name]) / 2 for name in loads}
        results["translate"][precision] = reference
        results["translate_before_after"][precision] = {n: [before[n], after[n]] for n in loads}
        for engine, (figures, checked) in served_by.items():
            for name, by_clients in figures.items():
                for s in by_clients.values():
                    s["vs_translate"] = s["requests_per_s"] / reference[name]
            results["serve"].setdefault(engine, {})[precision] = figures
            if checked is not None:
                checked["vs_translate"] = checked["requests_per_s"] / reference["same sentence"]
                results["ab"].setdefault(engine, {})[precision] = checked
    return results


def reference_rates(run_dir: Path, loads: dict, device: str, precision: str) -> dict[str, float]:
    return {name: in_one_process(run_dir, load, device, precision) for name, load in loads.items()}


def make_loads(sentences: list[str]) -> dict[str, list[str]]:
    """The two loads: "same sentence", the median-length one as many times as there are
    sentences, and "varied", the sentences."""
    median = sorted(sentences, key=len)[len(sentences) // 2]
    return {"same sentence": [median] * len(sentences), "varied": sentences}


def usable_precisions(precisions: tuple[str, ...], device: str, notes: list[str]) -> list[str]:
    """The asked precisions this device computes natively: bf16 only where `auto` would pick it
    (elsewhere it is emulated, slowly, and no user would serve in it)."""
    import torch

    from cli.device import autocast_dtype, pick_device

    native_bf16 = autocast_dtype("auto", pick_device(device)) == torch.bfloat16
    if "bf16" in precisions and not native_bf16:
        notes.append("bf16: not native on this device, left out")
    return [p for p in precisions if p != "bf16" or native_bf16]


def ctranslate2_export(run_dir: Path, out: Path, notes: list[str]) -> Path | None:
    """`tf export RUN --to ctranslate2` into OUT, once: again only when the run's checkpoint is
    newer than it. None (and a note) where ctranslate2 is not installed."""
    if importlib.util.find_spec("ctranslate2") is None:
        notes.append("ctranslate2: not importable (pip install 'tf[export]'), peer left out")
        return None
    from cli.runs.model_dirs import resolve_checkpoint

    checkpoint = resolve_checkpoint(str(run_dir))[0]
    # The run's path in the name: two runs called `small` (runs/, bench-out/) never share one.
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    target = out / f"{run_dir.name}-ctranslate2-{digest}"
    model = target / "model.bin"
    if not model.exists() or model.stat().st_mtime < checkpoint.stat().st_mtime:
        print(f"exporting {run_dir} for CTranslate2 into {target} (once)")
        export = ["export", str(run_dir), "--to", "ctranslate2", "-o", str(target), "--force"]
        run_python("-m", "cli.main", *export)
    return target


def engines_for(
    run_dir: Path, peer: Path | None, precision: str, device: str, notes: list[str]
) -> dict[str, Path]:
    """What `tf serve` serves in `precision`: the run, and its export where CTranslate2 has
    that compute type here (`cli.inference.engines.ct2_compute_type`)."""
    engines = {"tf": run_dir}
    if peer is None:
        return engines
    refusal = ctranslate2_refusal(precision, device)
    if refusal:
        notes.append(f"ctranslate2 {precision}: left out ({refusal})")
    else:
        engines["ctranslate2"] = peer
    return engines


def ctranslate2_refusal(precision: str, device: str) -> str:
    """Why CTranslate2 cannot compute in `precision` here ("" where it can), asked in a process
    of its own: its OpenMP runtime beside PyTorch's slows both (`benchmarks.engines_bench`),
    and this process times `tf translate`."""
    code = (
        "import sys, ctranslate2\n"
        "from cli.device import pick_device\n"
        "from cli.inference.engines import ct2_compute_type\n"
        "from data.errors import InputError\n"
        "try:\n"
        "    ct2_compute_type(ctranslate2, sys.argv[1], pick_device(sys.argv[2]))\n"
        "except InputError as e:\n"
        "    print(e)\n"
    )
    return run_python("-c", code, precision, device).strip()


def in_one_process(run_dir: Path, sentences: list[str], device: str, precision: str) -> float:
    """Sentences/s through the engine as `tf translate FILE --set decode.precision=PRECISION`
    drives it (best of two)."""
    from cli.device import pick_device
    from cli.inference.engines import load_engine

    engine = load_engine(str(run_dir), pick_device(device), [f"decode.precision={precision}"])
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        found = [hyps[0].tokens for _, hyps in engine.stream(sentences, "bench")]
        engine.tokenizer.decode_tgt(found)
        best = min(best, time.perf_counter() - start)
    return len(sentences) / best


def under_server(
    path: Path,
    loads: dict[str, list[str]],
    clients: tuple[int, ...],
    device: str,
    precision: str,
    ab: bool,
    workers: int = 0,
) -> tuple[dict, dict | None]:
    """One `tf serve PATH --set decode.precision=PRECISION` under every load and number of
    clients ({load: {clients: figures}}), and ApacheBench's figures with `ab`."""
    with served(path, device, [f"decode.precision={precision}"], workers) as port:
        post(port, loads["varied"][:1])  # the first search warms the model up
        figures = {
            name: {n: under_load(port, load, n) for n in clients} for name, load in loads.items()
        }
        checked = apache_bench(port, loads["same sentence"]) if ab else None
    return figures, checked


@contextmanager
def served(path: Path, device: str, overrides: list[str], workers: int = 0) -> Iterator[int]:
    """`tf serve PATH --set ...` on a free loopback port, until the block ends; yields the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "cli.main", "serve", str(path), "--port", str(port)]
    command += ["--device", device, "--max-queue", str(1 << 24), "--timeout", "600"]
    command += ["--workers", str(workers)]
    command += [arg for item in overrides for arg in ("--set", item)]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not healthy(port):
            if proc.poll() is not None:
                raise RuntimeError(f"tf serve exited: {proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("tf serve did not answer within 300 s")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def post(port: int, text: list[str], conn: http.client.HTTPConnection | None = None) -> int:
    """POST /translate over `conn` (or a new connection); the status."""
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"text": text})
    conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def under_load(port: int, sentences: list[str], clients: int) -> dict:
    """`benchmarks.load_client` in its own process: `clients` keep-alive connections share
    the sentences out and send them one a request."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.load_client", str(port), str(clients)],
        input=json.dumps(sentences),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return json.loads(out.stdout)


def apache_bench(port: int, sentences: list[str]) -> dict:
    """`ab -n N -c 32 -p body.json -T application/json` with the load's one sentence (N: the
    load's requests, at least 32, which ab requires)."""
    with tempfile.TemporaryDirectory(prefix="tf-ab-") as folder:
        body = Path(folder) / "body.json"
        body.write_text(json.dumps({"text": sentences[:1]}), encoding="utf-8")
        command = ["ab", "-n", str(max(len(sentences), AB_CLIENTS)), "-c", str(AB_CLIENTS)]
        command += ["-p", str(body), "-T", "application/json"]
        command.append(f"http://127.0.0.1:{port}/translate")
        report = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return {**parse_ab(report), "clients": AB_CLIENTS}


def parse_ab(report: str) -> dict:
    """Requests/s, p50/p99 (ms, from the percentile table) and errors of an `ab` report. ab's
    "Length" failures are answers whose size differs from the first one's: not errors here
    (bf16 batches of different sizes may translate the one sentence slightly differently)."""

    def field(pattern: str) -> str | None:
        found = re.search(pattern, report, re.MULTILINE)
        return found[1] if found else None

    within = dict(re.findall(r"^\s*(\d+)%\s+(\d+)", report, re.MULTILINE))
    failed = re.search(
        r"\(Connect: (\d+), Receive: (\d+), Length: \d+, Exceptions: (\d+)\)", report
    )
    errors = sum(int(n) for n in failed.groups()) if failed else 0
    return {
        "requests_per_s": float(field(r"^Requests per second:\s+([\d.]+)")),
        "p50_ms": float(within["50"]),
        "p99_ms": float(within["99"]),
        "errors": errors + int(field(r"^Non-2xx responses:\s+(\d+)") or 0),
    }


def print_results(r: dict) -> None:
    """One table per precision and load: tf translate's reference, then each engine's rows."""
    print(f"CPU: {r['cpu']}")
    for note in r["notes"]:
        print(f"note: {note}")
    for precision in r["precisions"]:
        for load, base in r["translate"][precision].items():
            rows = [("path", "clients", "requests/s", "p50 ms", "p99 ms", "vs translate", "errors")]
            rows.append(("tf translate, one process", "-", f"{base:.1f}", "-", "-", "1.00x", "-"))
            for engine, label in ENGINES.items():
                by_clients = r["serve"].get(engine, {}).get(precision, {}).get(load, {})
                rows += [row(label, clients, s) for clients, s in by_clients.items()]
                checked = r.get("ab", {}).get(engine, {}).get(precision)
                if checked and load == "same sentence":
                    rows.append(row(f"{label}, ApacheBench", checked["clients"], checked))
            print(f"\n{load}, {precision} on {r['cpu']}: {r['sentences']} requests of one sentence")
            print_table(rows)
            spread = r.get("translate_before_after", {}).get(precision, {}).get(load)
            if spread:  # (results of an earlier version have one measurement)
                print(f"tf translate before the servers {spread[0]:.1f} sentences/s, after "
                      f"{spread[1]:.1f}: the ratios are against their mean")  # fmt: skip


def row(label: str, clients: int | str, s: dict) -> tuple:
    return (
        label,
        clients,
        f"{s['requests_per_s']:.1f}",
        f"{s['p50_ms']:.0f}",
        f"{s['p99_ms']:.0f}",
        f"{s['vs_translate']:.2f}x",
        s["errors"],
    )


def numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--clients", type=numbers, default=(1, 8, 32, 64))
    parser.add_argument("--precisions", type=words, default=("fp32", "bf16"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--ab", action="store_true", help="ApacheBench too (`ab` on PATH)")
    parser.add_argument("--workers", type=int, default=0, help="tf serve --workers (0: its own)")
    args = parser.parse_args()
    if not set(args.precisions) <= {"fp32", "bf16"}:
        parser.error(f"--precisions {','.join(args.precisions)}: fp32, bf16 or both")
    run_dir = args.run or default_run()
    sentences = source_sentences(args.sentences)
    r = run(run_dir, sentences, args.clients, args.device, args.precisions, ab=args.ab,
            workers=args.workers)  # fmt: skip
    print_results(r)


if __name__ == "__main__":
    main()
