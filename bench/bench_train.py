"""Training throughput and peak memory: snug against PyTorch eager on the same machine, in the same run.

For each model, both trainers take the same Hugging Face folder (random weights), the same micro-batch shape and
fp32 AdamW, on the same number of threads. Prints tokens/s and peak RSS of each and the ratios snug/PyTorch.
With --bf16: snug with `bf16: true` (16-bit weights, activations and gradients, fp32 master weights) against
PyTorch under torch.autocast("cpu", bfloat16) (fp32 weights and gradients, bf16 matmuls).

    python bench/bench_train.py --snug build/snug [--threads 2] [--steps 6] [--bf16]
    python bench/bench_train.py --snug build/snug --mfu     # GPT-2 124M at B8xT256: achieved fraction of fp32 peak

With --mfu: snug's training FLOP/s on GPT-2 124M at B8xT256 (6 FLOPs per matmul parameter per token, head
included, plus 6*L*T*C for causal attention) against the machine's fp32 peak, the faster of two GEMM
microbenchmarks at 2048^3 on the same threads: bench_gemm (OpenBLAS with the kernels snug chose) and torch.mm.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

CASES = [
    # name, transformers config, micro-batch, sequence length
    ("gpt2-124m", dict(model_type="gpt2", vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), 4, 64),
    ("llama-30m", dict(model_type="llama", vocab_size=32000, hidden_size=512, intermediate_size=1376,
                       num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=2048, tie_word_embeddings=True), 1, 512),
]


def make_model(cfg: dict, path: str) -> None:
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    model.save_pretrained(path, safe_serialization=True)


def make_data(path: str, n_tokens: int) -> None:
    """Text for the byte-level stand-in: fortunes if present, else generated words."""
    src = "/usr/share/games/fortunes/fortunes"
    text = open(src, encoding="utf-8", errors="replace").read() if os.path.exists(src) else ""
    while len(text) < n_tokens:
        text += " ".join(f"word{i % 977}" for i in range(10000)) + "\n"
    with open(path, "w") as f:
        chunk = 2000
        for i in range(0, n_tokens, chunk):
            f.write(json.dumps({"text": text[i:i + chunk]}) + "\n")


TORCH_CHILD = r"""
import json, resource, sys, time, torch, transformers
path, B, T, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
bf16 = sys.argv[6] == "1"
torch.set_num_threads(threads)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", torch_dtype=torch.float32)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
ids = torch.randint(0, 256, (B, T))
times = []
for s in range(steps):
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
warm = times[2:] if len(times) > 3 else times[1:]
print(json.dumps({"tokens_per_s": B * T * len(warm) / sum(warm),
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run_torch(path, B, T, steps, threads, bf16=False):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", TORCH_CHILD, path, str(B), str(T), str(steps), str(threads),
                        "1" if bf16 else "0"],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_snug(snug, path, data, B, T, steps, threads, out, bf16=False):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [snug, "train", "--base_model", path, "--dataset", data, "--micro_batch_size", str(B), "--sequence_len",
           str(T), "--max_steps", str(steps), "--learning_rate", "1e-4", "--lr_scheduler", "constant",
           "--logging_steps", "1", "--output_dir", out, "--threads", str(threads), "--sample_tokens", "0"]
    if bf16:
        cmd += ["--bf16", "true"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    warm = rows[2:] if len(rows) > 3 else rows[1:]
    # tokens_per_s of each logged step is that step's own rate; combine by total tokens over total time
    secs = sum(B * T / r["tokens_per_s"] for r in warm)
    return {"tokens_per_s": B * T * len(warm) / secs, "peak_rss": rows[-1]["peak_rss_bytes"]}


TORCH_MM = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
n = 2048
a, b = torch.randn(n, n), torch.randn(n, n)
a @ b
best = 1e9
for _ in range(5):
    t0 = time.perf_counter()
    a @ b
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"gflops": 2 * n ** 3 / best / 1e9}))
"""


def mfu(a, work, data):
    name, cfg, _, _ = CASES[0]
    B, T = 8, 256
    path = os.path.join(work, name)
    make_model(cfg, path)
    gemm = os.path.join(os.path.dirname(os.path.abspath(a.snug)), "bench_gemm")
    g = json.loads(subprocess.run([gemm, str(a.threads)], check=True, capture_output=True, text=True).stdout)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    t = json.loads(subprocess.run([sys.executable, "-c", TORCH_MM, str(a.threads)], check=True, capture_output=True,
                                  text=True, env=env).stdout)
    peak = max(g["gflops"], t["gflops"]) * 1e9
    s = run_snug(a.snug, path, data, B, T, a.steps, a.threads, os.path.join(work, "out-mfu"), a.bf16)
    C, L, V = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
    flops_tok = 6 * (12 * L * C * C + V * C) + 6 * L * T * C
    achieved = s["tokens_per_s"] * flops_tok
    print(f"fp32 GEMM peak, 2048^3, {a.threads} threads: OpenBLAS ({g['kernels']} kernels) {g['gflops']:.1f} GFLOP/s, "
          f"torch.mm {t['gflops']:.1f} GFLOP/s")
    print(f"snug GPT-2 124M B{B}xT{T}{' bf16' if a.bf16 else ''}: {s['tokens_per_s']:.1f} tok/s x "
          f"{flops_tok / 1e6:.0f} MFLOP/token = {achieved / 1e9:.1f} GFLOP/s = {100 * achieved / peak:.1f}% of peak")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default="build/snug")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default="")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--mfu", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp()
    data = os.path.join(work, "data.jsonl")
    make_data(data, 2_000_000)
    if a.mfu:
        return mfu(a, work, data)
    print(f"{'model':<12} {'B':>2} {'T':>4} {'snug tok/s':>11} {'torch tok/s':>12} {'ratio':>6}   "
          f"{'snug RSS':>9} {'torch RSS':>9} {'ratio':>6}")
    for name, cfg, B, T in CASES:
        if a.only and a.only != name:
            continue
        path = os.path.join(work, name)
        make_model(cfg, path)
        s = run_snug(a.snug, path, data, B, T, a.steps, a.threads, os.path.join(work, "out-" + name), a.bf16)
        t = run_torch(path, B, T, a.steps, a.threads, a.bf16)
        print(f"{name:<12} {B:>2} {T:>4} {s['tokens_per_s']:>11.1f} {t['tokens_per_s']:>12.1f} "
              f"{s['tokens_per_s'] / t['tokens_per_s']:>5.2f}x   {s['peak_rss'] / 2**20:>7.0f}Mi "
              f"{t['peak_rss'] / 2**20:>7.0f}Mi {s['peak_rss'] / t['peak_rss']:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
