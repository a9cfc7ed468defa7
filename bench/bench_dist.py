"""Data parallel on CPU ranks: N MPI ranks x 1 thread against 1 process x N threads, the same global batch.

Both sides train the same Hugging Face folder (GPT-2 124M, random weights) on the same data with fp32 AdamW; the
one process takes the global batch as N micro-batches of gradient accumulation, the ranks one micro-batch each
(`ddp: true`, and `zero_stage: 1|2|3` for the sharded rows). Prints tokens/s (global tokens over the steps after
the first two) and each rank's peak RSS, and the ratios against the one process, all measured in this run. The
ranks and the one process alternate (--rounds), so a drift of the machine's speed falls on both.

    python bench/bench_dist.py --snug build/snug [--ranks 2] [--steps 8] [--rounds 2] [--zero 1,2,3]
        [--extra "--adapter lora --bf16 true"]   (more snug options for every run: LoRA at stage 3, --zero 3)

With --tp, tensor parallelism instead (Llama 30M, bench_train's second case): N ranks x 1 thread with
`tensor_parallel_size: N`, every rank on the same micro-batch, against 1 process x N threads on it.

    python bench/bench_dist.py --snug build/snug --tp [--ranks 2] [--micro_batch 1] [--seq 512]

With --pp, pipeline parallelism (Llama 30M): N ranks x 1 thread with `pipeline_parallel_size: N` over --accum
micro-batches per step (1F1B), against 1 process x N threads accumulating the same micro-batches.

    python bench/bench_dist.py --snug build/snug --pp [--ranks 2] [--accum 8] [--micro_batch 1] [--seq 512]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import CASES, make_data, make_model  # noqa: E402

# each rank's peak RSS: the snug process's own, reported by the wrapper that waits for it
RSS_CHILD = r"""
import json, os, resource, subprocess, sys
r = subprocess.run(sys.argv[2:])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
with open(os.path.join(sys.argv[1], "rss.rank" + rank), "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(r.returncode)
"""


def tokens_per_s(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    warm = rows[2:] if len(rows) > 3 else rows[1:]
    tokens = [r["tokens_per_s"] for r in warm]
    # each logged step's rate over the same global tokens: combine by total tokens over total time
    return len(tokens) / sum(1.0 / t for t in tokens)


def run(snug, folder, data, out, B, T, steps, ranks, threads, accum, extra):
    os.makedirs(out, exist_ok=True)
    cmd = [snug, "train", "--base_model", folder, "--dataset", data, "--micro_batch_size", str(B),
           "--sequence_len", str(T), "--gradient_accumulation_steps", str(accum), "--max_steps", str(steps),
           "--learning_rate", "1e-4", "--lr_scheduler", "constant", "--logging_steps", "1", "--output_dir", out,
           "--threads", str(threads), "--sample_tokens", "0", "--val_set_size", "0"] + extra
    wrapped = [sys.executable, "-c", RSS_CHILD, out] + cmd
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if ranks > 1:
        mpi = ["mpirun", "--oversubscribe", "-np", str(ranks), "--bind-to", "none"]
        if os.geteuid() == 0:
            mpi.append("--allow-run-as-root")
        wrapped = mpi + wrapped
    r = subprocess.run(wrapped, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(" ".join(cmd) + "\n" + r.stdout[-3000:] + r.stderr[-3000:])
    rss = [int(open(os.path.join(out, "rss.rank%d" % k)).read()) for k in range(ranks)]
    return {"tokens_per_s": tokens_per_s(out), "rss": rss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default="build/snug")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--zero", default="1,2,3", help="ZeRO stages to run beside DDP (empty: none)")
    ap.add_argument("--micro_batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--extra", default="", help="more snug options for every run, e.g. \"--adapter lora --bf16 true\"")
    ap.add_argument("--tp", action="store_true", help="tensor parallelism (Llama 30M) instead of data parallel")
    ap.add_argument("--pp", action="store_true", help="pipeline parallelism (Llama 30M) instead of data parallel")
    ap.add_argument("--accum", type=int, default=8, help="micro-batches per step under --pp")
    a = ap.parse_args()
    more = a.extra.split()
    split = a.tp or a.pp  # the model split over the ranks, against one process
    snug = os.path.abspath(a.snug)
    N = a.ranks
    stages = [int(s) for s in a.zero.split(",") if s]
    name, cfg, _, _ = CASES[1 if split else 0]
    w = tempfile.mkdtemp(prefix="bench_dist.")
    try:
        folder, data = os.path.join(w, name), os.path.join(w, "data.jsonl")
        make_model(cfg, folder)
        make_data(data, 400000)
        B, T = a.micro_batch, a.seq
        if a.tp:
            print(f"{name}: micro-batch {B} x {T} tokens on every rank, AdamW, {a.steps} steps, {a.rounds} rounds"
                  + (f", {a.extra}" if more else ""))
        elif a.pp:
            print(f"{name}: {a.accum} micro-batches of {B} x {T} tokens per step through {N} stages, AdamW, "
                  f"{a.steps} steps, {a.rounds} rounds" + (f", {a.extra}" if more else ""))
        else:
            print(f"{name}: global batch {N} x {B} x {T} tokens, AdamW, {a.steps} steps, {a.rounds} rounds"
                  + (f", {a.extra}" if more else ""))
        # the same global batch on one process: accumulation over N micro-batches, or (the step inside backward
        # cannot accumulate) one micro-batch N times as large
        if a.tp:  # every rank on the same micro-batch: one process takes it once
            modes = [("1 process x %d threads" % N, 1, N, 1, more, B),
                     ("%d ranks x 1 thread, tensor parallel" % N, N, 1, 1,
                      ["--tensor_parallel_size", str(N)] + more, B)]
        elif a.pp:  # the same micro-batches: one process accumulates them, the stages pipeline them
            modes = [("1 process x %d threads, accumulation %d" % (N, a.accum), 1, N, a.accum, more, B),
                     ("%d ranks x 1 thread, pipeline parallel" % N, N, 1, a.accum,
                      ["--pipeline_parallel_size", str(N)] + more, B)]
        elif "--optimizer_in_backward" in more:
            modes = [("1 process x %d threads, micro-batch %d" % (N, N * B), 1, N, 1, more, N * B)]
        else:
            modes = [("1 process x %d threads, accumulation %d" % (N, N), 1, N, N, more, B)]
        if not split:
            modes.append(("%d ranks x 1 thread, DDP" % N, N, 1, 1, ["--ddp", "true"] + more, B))
        for s in stages if not split else []:
            modes.append(("%d ranks x 1 thread, ZeRO-%d" % (N, s), N, 1, 1,
                          ["--ddp", "true", "--zero_stage", str(s)] + more, B))
        res = {m[0]: [] for m in modes}
        for k in range(a.rounds):
            for label, ranks, threads, accum, extra, mb in modes:
                out = os.path.join(w, "out-%d-%d" % (k, len(res[label])))
                try:
                    res[label].append(run(snug, folder, data, out, mb, T, a.steps, ranks, threads, accum, extra))
                except RuntimeError as err:
                    res[label].append({"error": str(err).splitlines()[-1]})
                shutil.rmtree(out, ignore_errors=True)
        base = res[modes[0][0]]
        ddp = res[modes[0 if split else 1][0]]  # the RSS reference: DDP's, or under --tp/--pp the one process's
        ref = "1 process" if split else "DDP"
        print(f"| run | tokens/s per round | vs 1 process | peak RSS per rank (MiB) | vs {ref} |")
        print("|---|---|---|---|---|")
        for label, *_ in modes:
            rows = res[label]
            if any("error" in r for r in rows):
                print(f"| {label} | refused: {[r['error'] for r in rows if 'error' in r][0]} | | | |")
                continue
            tps = " / ".join("%.1f" % r["tokens_per_s"] for r in rows)
            ratio = " / ".join("%.2fx" % (r["tokens_per_s"] / b["tokens_per_s"]) for r, b in zip(rows, base))
            rss = max(max(r["rss"]) for r in rows)
            d = [x for x in ddp if "error" not in x]
            vs = "%.2fx" % (rss / max(max(x["rss"]) for x in d)) if d and label != modes[0][0] else ""
            print(f"| {label} | {tps} | {ratio} | {rss / 2**20:.0f} | {vs} |")
    finally:
        shutil.rmtree(w, ignore_errors=True)


if __name__ == "__main__":
    main()
