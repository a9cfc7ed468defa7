"""Two snug binaries on the same training run, alternately: the check a refactoring owes before it lands.

Each round trains the same short run with OLD, then NEW (llama-30m from scratch, packed micro-batches of 2 x 256
tokens, fp32 AdamW, the given threads), and prints the seconds of steps 2..N of each (step 1 holds the one-time
costs) and whether both wrote the same losses and gradient norms, value for value as metrics.jsonl prints them. The
summary gives the median of each and the ratio NEW/OLD; alternating the two keeps drift in the machine's load from
favouring either.

    python bench/bench_ab.py --old OLD/snug --new build/snug [--rounds 5] [--steps 12] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run(snug, out, data, steps, threads):
    args = [snug, "train", "--dataset", data, "--model_preset", "llama-30m", "--max_steps", str(steps),
            "--micro_batch_size", "2", "--sequence_len", "256", "--sample_packing", "true", "--threads", str(threads),
            "--logging_steps", "1", "--save_steps", "0", "--sample_tokens", "0", "--output_dir", out]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{snug} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    rows = [j for j in rows if "step" in j and "loss" in j]
    seconds = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    return seconds, [(j["step"], j["loss"], j.get("grad_norm")) for j in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fortunes.jsonl"))
    a = ap.parse_args()
    times = {"old": [], "new": []}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            hist = {}
            for which in ("old", "new"):
                out = os.path.join(tmp, f"{which}{r}")
                s, hist[which] = run(getattr(a, which), out, a.data, a.steps, a.threads)
                times[which].append(s)
            same &= hist["old"] == hist["new"]
            print(f"round {r + 1}: old {times['old'][-1]:.2f} s, new {times['new'][-1]:.2f} s, "
                  f"same losses and grad norms: {hist['old'] == hist['new']}")
    mo, mn = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"steps 2..{a.steps}, median of {a.rounds}: old {mo:.2f} s, new {mn:.2f} s, new/old {mn / mo:.3f}; "
          f"every round the same losses and grad norms: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
