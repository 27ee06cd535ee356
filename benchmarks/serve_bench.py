"""`tf serve` under load: requests/s and p50/p99 latency at 1, 8 and 32 concurrent clients, one
sentence a request, against a live server on loopback started as a user starts it (its own
process) and a light client in another (`benchmarks.load_client`: asyncio, it takes next to no
CPU), and the same sentences through `tf translate`'s path in one process (`Engine.stream`,
in its batches) for comparison. Two loads: one sentence of median length sent again and
again (the issue's ApacheBench setting), and the test set's sentences, one each.

    python -m benchmarks.serve_bench [--run RUN] [--sentences 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.common import ROOT, cpu_name, print_table
from benchmarks.decode_bench import default_run, source_sentences


def run(run_dir: Path, sentences: list[str], clients=(1, 8, 32), device: str = "auto") -> dict:
    """{"sentences", "precision", "loads": {load: {"translate_sentences_per_s", "serve":
    {clients: {requests_per_s, p50_ms, p99_ms, errors}}}}}: at each number of clients every
    sentence of the load is sent once. Loads: "same sentence" (the median-length one, as
    many times as there are sentences) and "varied" (the sentences)."""
    by_length = sorted(sentences, key=len)
    loads = {
        "same sentence": [by_length[len(by_length) // 2]] * len(sentences),
        "varied": sentences,
    }
    results: dict = {"sentences": len(sentences), "loads": {}}
    for name, load in loads.items():
        per_s, precision = in_one_process(run_dir, load, device)
        results["precision"] = precision
        results["loads"][name] = {"translate_sentences_per_s": per_s, "serve": {}}
    with served(run_dir, device) as port:
        post(port, sentences[:1])  # the first search warms the model up
        for name, load in loads.items():
            for n in clients:
                results["loads"][name]["serve"][n] = under_load(port, load, n)
    return results


def in_one_process(run_dir: Path, sentences: list[str], device: str) -> tuple[float, str]:
    """Sentences/s through the engine as `tf translate FILE` drives it (best of two), and the
    precision it decoded in."""
    from cli.device import autocast_dtype, pick_device
    from cli.inference.engines import load_engine

    engine = load_engine(str(run_dir), pick_device(device), [])
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        found = [hyps[0].tokens for _, hyps in engine.stream(sentences, "bench")]
        engine.tokenizer.decode_tgt(found)
        best = min(best, time.perf_counter() - start)
    dtype = autocast_dtype(engine.config.decode.precision, pick_device(device), "precision")
    return len(sentences) / best, "fp32" if dtype is None else str(dtype).removeprefix("torch.")


@contextmanager
def served(run_dir: Path, device: str) -> Iterator[int]:
    """`tf serve RUN` on a free loopback port, until the block ends; yields the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "cli.main", "serve", str(run_dir), "--port", str(port)]
    command += ["--device", device, "--max-queue", str(1 << 24), "--timeout", "600"]
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


def print_results(r: dict) -> None:
    print(f"CPU: {cpu_name()}; precision: {r['precision']}")
    for name, load in r["loads"].items():
        base = load["translate_sentences_per_s"]
        rows = [("path", "clients", "requests/s", "p50 ms", "p99 ms", "vs translate", "errors")]
        rows.append(("tf translate, one process", "-", f"{base:.1f}", "-", "-", "1.00x", "-"))
        for clients, s in load["serve"].items():
            rows.append(
                (
                    "tf serve, loopback",
                    clients,
                    f"{s['requests_per_s']:.1f}",
                    f"{s['p50_ms']:.0f}",
                    f"{s['p99_ms']:.0f}",
                    f"{s['requests_per_s'] / base:.2f}x",
                    s["errors"],
                )
            )
        print(f"\n{name}: {r['sentences']} requests of one sentence at each number of clients")
        print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    run_dir = args.run or default_run()
    print_results(run(run_dir, source_sentences(args.sentences), device=args.device))


if __name__ == "__main__":
    main()
