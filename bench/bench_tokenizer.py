#!/usr/bin/env python3
"""bench_tokenizer.py: single-threaded encode throughput of snug's tokenizer against Hugging Face `tokenizers`.

Same corpus and tokenizers as tests/parity/test_tokenizer_parity.py (built the same way, in this run). For each
family: snug through tests/parity/tok_driver.c (best of --repeat passes over every document, timed inside the
program around snug_tok_encode only), and `tokenizers` on one thread (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false): encode_batch over all documents, and a plain encode() loop; the faster of the two
counts. Both encode without the post-processor's special tokens. Prints MB/s and the ratio snug / tokenizers.

Run: /root/.cache/snug/venv/bin/python bench/bench_tokenizer.py [--mb 5.5] [--repeat 3]
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before `tokenizers` starts its thread pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "parity"))
import test_tokenizer_parity as parity  # noqa: E402  (corpus, tokenizer families, driver build)

FAMILIES = ["gpt2", "llama3", "qwen2", "sp-legacy", "sp-metaspace-first"]


def best_of(repeat, fn):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=5.5, help="corpus size in MB")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes; the best counts")
    args = ap.parse_args()

    docs = parity.make_corpus(random.Random(20240607), args.mb * 1e6)
    texts = [d.decode("utf-8", errors="replace") for d in docs]
    total = sum(len(d) for d in docs)
    tmp = tempfile.mkdtemp(prefix="snug_tokbench_")
    try:
        exe = parity.build_driver(tmp)
        docs_path = os.path.join(tmp, "docs.bin")
        parity.write_docs(docs_path, docs)
        fams = {name: tok for name, tok, _ in
                parity.build_families([x.replace("\x00", "") for x in texts[: len(texts) // 3]])}
        print(f"corpus: {len(docs)} documents, {total / 1e6:.2f} MB; one thread each side; best of {args.repeat}")
        print(f"{'family':<20} {'snug MB/s':>10} {'HF batch':>10} {'HF loop':>10} {'ratio':>7}")
        for name in FAMILIES:
            tok = fams[name]
            path = os.path.join(tmp, name + ".json")
            tok.save(path)
            out = subprocess.run([exe, path, docs_path, os.path.join(tmp, "ids"), "--repeat", str(args.repeat)],
                                 check=True, capture_output=True, text=True).stdout
            snug_s = float(out.split("seconds=")[1].split()[0])
            batch_s = best_of(args.repeat, lambda: tok.encode_batch(texts, add_special_tokens=False))
            loop_s = best_of(args.repeat, lambda: [tok.encode(x, add_special_tokens=False) for x in texts])
            hf_s = min(batch_s, loop_s)
            print(f"{name:<20} {total / snug_s / 1e6:>10.1f} {total / batch_s / 1e6:>10.1f} "
                  f"{total / loop_s / 1e6:>10.1f} {hf_s / snug_s:>6.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
