"""The same sentence alone, in a batch of `tf translate` and joined mid-search in `tf serve
--schedule steps` (issue 59): lines whose translation differs between the three, per precision.

Each test sentence is searched three ways with the run's own decode settings (its beam):
  alone    `Engine.search` of that sentence by itself;
  batch    `Engine.search` of all of them, as `tf translate` batches them;
  joined   `tf serve`'s scheduler (`cli.inference.lanes.Scheduler`) in this process, under a
           closed loop of `--clients` requests of one sentence each, a new one submitted as
           each is answered, so every sentence joins a search that is already running.
In fp32 the three should give the same tokens, and scores equal within float rounding (a
matmul over other rows may sum in another order). In bf16 the matmuls' results depend on
how many rows they hold (oneDNN blocks them by the row count), so a near-tie between two
candidates can fall either way: the differing lines are counted, not expected to be none.

    python -m benchmarks.join_parity [--run RUN] [--sentences 1000] [--clients 16]
        [--precisions fp32,bf16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import OUT, cpu_name, print_table
from benchmarks.decode_bench import default_run, source_sentences
from benchmarks.serve_bench import usable_precisions, words


def joined(engine, src_ids: list[list[int]], decode, clients: int) -> list:
    """Each sentence's hypotheses, joined into the running search of a closed loop."""
    import torch

    from cli.inference.lanes import Scheduler

    scheduler = Scheduler(engine, torch.device("cpu"))
    found: list = [None] * len(src_ids)
    sent = 0
    for _ in range(min(clients, len(src_ids))):
        scheduler.submit(sent, [src_ids[sent]], decode, None)
        sent += 1
    while scheduler.busy:
        for event in scheduler.events():
            if event[0] != "done":
                continue
            _, key, ok, value = event
            if not ok:
                raise value
            found[key] = value[0]
            if sent < len(src_ids):
                scheduler.submit(sent, [src_ids[sent]], decode, None)
                sent += 1
    return found


def compare(a: list, b: list) -> dict:
    """Lines whose best tokens differ, and the largest relative score difference of the
    lines whose tokens agree."""
    differ = sum(x[0].tokens != y[0].tokens for x, y in zip(a, b, strict=True))
    scores = [
        abs(x[0].score - y[0].score) / max(abs(y[0].score), 1e-9)
        for x, y in zip(a, b, strict=True)
        if x[0].tokens == y[0].tokens
    ]
    return {"differing_lines": differ, "max_relative_score_diff": max(scores, default=0.0)}


def run(run_dir: Path, sentences: list[str], clients: int, precisions: tuple[str, ...]) -> dict:
    import torch

    from cli.inference.engines import load_engine

    notes: list[str] = []
    results: dict = {"cpu": cpu_name(), "sentences": len(sentences), "clients": clients}
    results |= {"precisions": usable_precisions(precisions, "cpu", notes), "notes": notes}
    for precision in results["precisions"]:
        engine = load_engine(str(run_dir), torch.device("cpu"), [f"decode.precision={precision}"])
        decode = engine.config.decode
        src_ids = engine.tokenizer.encode_src(sentences)
        ways = {
            "alone": [engine.search([ids], decode)[0] for ids in src_ids],
            "batch": engine.search(src_ids, decode),
            "joined": joined(engine, src_ids, decode, clients),
        }
        results[precision] = {
            f"{a} vs {b}": compare(ways[a], ways[b])
            for a, b in (("alone", "batch"), ("alone", "joined"), ("batch", "joined"))
        }
        results[precision]["beam"] = decode.beam_size
    return results


def print_results(results: dict) -> None:
    print(f"{results['cpu']}; {results['sentences']} sentences, {results['clients']} clients")
    for note in results["notes"]:
        print(f"note: {note}")
    rows = [("precision", "pair", "differing lines", "max relative score diff (same tokens)")]
    for precision in results["precisions"]:
        for pair, r in results[precision].items():
            if pair != "beam":
                score = f"{r['max_relative_score_diff']:.1e}"
                rows.append((precision, pair, str(r["differing_lines"]), score))
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--precisions", type=words, default=("fp32", "bf16"))
    args = parser.parse_args()
    run_dir = args.run or default_run()
    results = run(run_dir, source_sentences(args.sentences), args.clients, args.precisions)
    out = OUT / "join_parity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print_results(results)


if __name__ == "__main__":
    main()
