"""A light HTTP load generator for `tf serve`, run in a process of its own: N keep-alive
connections on one asyncio loop, each sending the next sentence as soon as its last answer
came, one sentence a request. It parses only the status line and Content-Length, so it takes
next to no CPU from the server it measures (ApacheBench's way; a client of Python threads in
the server's machine took a third of its two cores and halved the figure).

    python -m benchmarks.load_client PORT CLIENTS < sentences.json   # a JSON list of strings

prints {"requests_per_s", "p50_ms", "p99_ms", "errors"} as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def load(port: int, sentences: list[str], clients: int) -> dict:
    """Every sentence sent once, by `clients` connections that share them out as they go."""
    bodies = [json.dumps({"text": [s]}).encode() for s in sentences]
    head = f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    head += "Content-Type: application/json\r\nContent-Length: "
    latencies: list[float] = []
    errors = 0
    next_one = iter(bodies)

    async def client() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for body in next_one:  # one shared iterator: a free connection takes the next
            began = time.perf_counter()
            writer.write(f"{head}{len(body)}\r\n\r\n".encode() + body)
            status = await answer(reader)
            latencies.append(time.perf_counter() - began)
            errors += status != 200
        writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = time.perf_counter() - began
    latencies.sort()
    return {
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "errors": errors,
    }


async def answer(reader: asyncio.StreamReader) -> int:
    """Read one response (status line, headers, a Content-Length body); its status."""
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of an ascending list."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def main() -> None:
    port, clients = int(sys.argv[1]), int(sys.argv[2])
    sentences = json.load(sys.stdin)
    print(json.dumps(asyncio.run(load(port, sentences, clients))))


if __name__ == "__main__":
    main()
