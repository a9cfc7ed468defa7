#!/usr/bin/env python3
"""The sequence levers on real text with irregular lengths: Debian's fortunes (data/fortunes.jsonl, made by
scripts/setup.sh) and the docstrings of Python's standard library (modules, classes and functions, read with ast).

1. bench_packing on both corpora: padding and efficiency of fixed padding, dynamic padding, length grouping, packing
   and concatenation, and the time to plan a packed epoch of 1,000,000 examples drawn from each.
2. `snug train` for one epoch over the same examples with each way of batching, in this run, on this machine: example
   tokens per second (padding not counted), token slots computed per second, and the ratio to packing.

    python3 bench/bench_sequence.py [--snug build/snug] [--threads 2] [--examples 600] [--sequence_len 256]
"""
import argparse
import ast
import glob
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_docstrings(path: str) -> int:
    """Every module, class and function docstring of the standard library, one example each."""
    root = sysconfig.get_paths()["stdlib"]
    n = 0
    with open(path, "w") as f:
        for p in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            if "site-packages" in p or "/test" in p:
                continue
            try:
                tree = ast.parse(open(p, encoding="utf-8").read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    d = ast.get_docstring(node)
                    if d and d.strip():
                        f.write(json.dumps({"text": d}) + "\n")
                        n += 1
    return n


def train(snug, data, out, threads, T, B, extra):
    cmd = [snug, "train", "--dataset", data, "--tokenizer", os.path.join(SRC, "assets/tokenizer"),
           "--sequence_len", str(T), "--micro_batch_size", str(B), "--num_epochs", "1", "--val_set_size", "0",
           "--learning_rate", "1e-3", "--lr_scheduler", "constant", "--logging_steps", "1", "--sample_tokens", "0",
           "--threads", str(threads), "--seed", "1", "--output_dir", out] + extra
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stdout[-2000:] + r.stderr)
    head = r.stdout
    tokens = int(re.search(r"data +\d+ examples, (\d+) tokens", head).group(1))
    row = re.search(r"^ +\* (.+?) +(\d+) +(\d+) +(\d+) +([\d.]+)%", head, re.M)
    slots, eff = int(row.group(3)), float(row.group(5))
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    # elapsed_s counts from the first step; the first step also warms up, so measure from the end of step 1
    secs = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    first = rows[0]["tokens_per_s"] * rows[0]["elapsed_s"]  # example tokens of step 1
    return {"steps": len(rows), "tokens": tokens, "slots": slots, "eff": eff, "secs": secs,
            "tok_s": (tokens - first) / secs, "slot_s": slots * (1 - first / tokens) / secs,
            "loss": rows[-1]["loss"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default=os.path.join(SRC, "build/snug"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--examples", type=int, default=600)
    ap.add_argument("--sequence_len", type=int, default=256)
    ap.add_argument("--micro_batch_size", type=int, default=8)
    a = ap.parse_args()
    work = tempfile.mkdtemp()
    fortunes = os.path.join(SRC, "data/fortunes.jsonl")
    if not os.path.exists(fortunes):
        sys.exit("data/fortunes.jsonl is missing; run scripts/setup.sh")
    docs = os.path.join(work, "docstrings.jsonl")
    print(f"Python {sys.version.split()[0]} standard library docstrings: {make_docstrings(docs)} examples")

    bench_packing = os.path.join(os.path.dirname(a.snug), "bench_packing")
    print("\n== 1. efficiency of each way of batching, and planning a packed epoch of 1M examples ==")
    sys.stdout.flush()
    subprocess.run([bench_packing, "--sequence_len", f"{a.sequence_len},2048", "--micro_batch_size",
                    str(a.micro_batch_size), fortunes, docs], check=True)

    print(f"\n== 2. snug train, one epoch over {a.examples} fortunes, tiny-llama, sequence_len {a.sequence_len}, "
          f"micro_batch_size {a.micro_batch_size}, {a.threads} threads ==")
    lines = open(fortunes).read().splitlines()
    random.Random(3).shuffle(lines)
    data = os.path.join(work, "subset.jsonl")
    with open(data, "w") as f:
        f.write("\n".join(lines[:a.examples]) + "\n")
    ways = [("packed", ["--sample_packing", "true"]),
            ("grouped by length", ["--group_by_length", "true"]),
            ("dynamic padding", []),
            (f"fixed padding to {a.sequence_len}", ["--pad_to_sequence_len", "true"])]
    res = {}
    for name, extra in ways:
        res[name] = train(a.snug, data, os.path.join(work, name.split()[0]), a.threads, a.sequence_len,
                          a.micro_batch_size, extra)
    base = res["packed"]["tok_s"]
    print(f"{'batching':<24} {'steps':>6} {'token slots':>12} {'efficiency':>10} {'seconds':>8} "
          f"{'example tok/s':>14} {'slots/s':>9} {'vs packed':>10}")
    for name, _ in ways:
        r = res[name]
        print(f"{name:<24} {r['steps']:>6} {r['slots']:>12} {r['eff']:>9.1f}% {r['secs']:>8.1f} {r['tok_s']:>14.0f} "
              f"{r['slot_s']:>9.0f} {r['tok_s'] / base:>9.2f}x")


if __name__ == "__main__":
    main()
