"""`tf serve` under load: requests/s and p50/p99 latency at 1, 8 and 32 concurrent clients, one
sentence a request, against a live server on loopback started as a user starts it (its own
process, so clients and server share no interpreter), and the same sentences through
`tf translate`'s path in one process (`Engine.stream`, all in one batch) for comparison.

    python -m benchmarks.serve_bench [--run RUN] [--sentences 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.common import ROOT, print_table
from benchmarks.decode_bench import default_run, source_sentences


def run(run_dir: Path, sentences: list[str], clients=(1, 8, 32), device: str = "auto") -> dict:
    """{"sentences", "translate_sentences_per_s", "serve": {clients: {requests_per_s, p50_ms,
    p99_ms, errors}}}: every sentence sent once at each number of clients."""
    results: dict = {"sentences": len(sentences), "serve": {}}
    results["translate_sentences_per_s"] = in_one_process(run_dir, sentences, device)
    with served(run_dir, device) as port:
        post(port, sentences[:1])  # the first search warms the model up
        for n in clients:
            results["serve"][n] = under_load(port, sentences, n)
    return results


def in_one_process(run_dir: Path, sentences: list[str], device: str) -> float:
    """Sentences/s through the engine as `tf translate FILE` drives it (best of two)."""
    from cli.device import pick_device
    from cli.inference.engines import load_engine

    engine = load_engine(str(run_dir), pick_device(device), [])
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        found = [hyps[0].tokens for _, hyps in engine.stream(sentences, "bench")]
        engine.tokenizer.decode_tgt(found)
        best = min(best, time.perf_counter() - start)
    return len(sentences) / best


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
    """`clients` threads, each with its own keep-alive connection, share the sentences out and
    send them one a request, all starting together."""
    latencies: list[float] = []
    errors = [0]
    start = threading.Barrier(clients + 1)

    def client(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        start.wait()
        for sentence in mine:
            began = time.perf_counter()
            status = post(port, [sentence], conn)
            latencies.append(time.perf_counter() - began)  # list.append is atomic
            errors[0] += status != 200
        conn.close()

    threads = [
        threading.Thread(target=client, args=(sentences[i::clients],)) for i in range(clients)
    ]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - began
    latencies.sort()
    return {
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "errors": errors[0],
    }


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of an ascending list."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def print_results(r: dict) -> None:
    base = r["translate_sentences_per_s"]
    rows = [("path", "clients", "requests/s", "p50 ms", "p99 ms", "vs translate", "errors")]
    rows.append(("tf translate, one process", "-", f"{base:.1f}", "-", "-", "1.00x", "-"))
    for clients, s in r["serve"].items():
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
    print(f"{r['sentences']} sentences, one a request; tf translate sends them all in one batch")
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    run_dir = args.run or default_run()
    print_results(run(run_dir, source_sentences(args.sentences), device=args.device))


if __name__ == "__main__":
    main()
