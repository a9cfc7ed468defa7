"""Training throughput and peak GPU memory on one CUDA GPU: snug against PyTorch/transformers, in the same run.

For each model, both trainers take the same Hugging Face folder (random weights, bf16 safetensors), the same
micro-batch of full rows and as close to the same settings as the two allow:

    snug    device: cuda, bf16: true, flash_attention: true, gradient_checkpointing: full, optimizer: adamw_8bit
    torch   bf16 autocast over fp32 weights (what Trainer's bf16=True does), attn_implementation="sdpa",
            gradient checkpointing (non-reentrant), bitsandbytes' AdamW8bit when it imports, else fused fp32 AdamW

Prints tokens/s, MFU and peak memory of each and the ratios snug/PyTorch. MFU = (6 * parameters + 6 * layers *
T * width) * tokens/s over the GPU's dense bf16 peak (989 TFLOP/s for an H100/H200 SXM; --peak_tflops), the second
term being causal attention's forward + backward FLOPs per token; recomputation is not counted. Peak memory is
torch.cuda.max_memory_allocated for PyTorch and the peak snug reports (metrics.jsonl or memory.json).

A run that fails (a key snug does not have yet, out of memory) prints the tail of its output and the benchmark goes
on with the rest. No network: everything is generated locally.

    python3 bench/gpu/bench_train_gpu.py --snug build/snug [--steps 8] [--only gpt2-124m]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = [
    # name, transformers config, micro-batch, sequence length
    ("gpt2-124m", dict(model_type="gpt2", vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), 16, 1024),
    ("llama-1b", dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                      max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                      rms_norm_eps=1e-5), 4, 2048),  # Llama-3.2-1B's shape, without rope_scaling
]


def model_dims(cfg: dict):
    """(layers, width) of a transformers config dict."""
    if cfg["model_type"] == "gpt2":
        return cfg["n_layer"], cfg["n_embd"]
    return cfg["num_hidden_layers"], cfg["hidden_size"]


def make_model(cfg: dict, path: str) -> int:
    """Random weights saved as bf16 safetensors; returns the parameter count."""
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialising 1B parameters is faster there
        model = transformers.AutoModelForCausalLM.from_config(config)
    nparams = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    return nparams


def make_data(path: str, n_chars: int) -> None:
    """Text for the byte-level stand-in tokenizer: fortunes if present, else generated words."""
    src = "/usr/share/games/fortunes/fortunes"
    text = open(src, encoding="utf-8", errors="replace").read() if os.path.exists(src) else ""
    while len(text) < n_chars:
        text += " ".join(f"word{i % 977}" for i in range(10000)) + "\n"
    with open(path, "w") as f:
        chunk = 2000
        for i in range(0, n_chars, chunk):
            f.write(json.dumps({"text": text[i:i + chunk]}) + "\n")


TORCH_CHILD = r"""
import json, sys, time, torch, transformers
path, B, T, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True  # PyTorch's usual training setting; the GEMMs run in bf16 anyway
model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa",
                                                          torch_dtype=torch.float32).cuda()
model.config.use_cache = False
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.train()
try:
    import bitsandbytes as bnb
    opt, opt_name = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4, weight_decay=0.0), "bnb AdamW8bit"
except Exception:
    opt, opt_name = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True), "fused AdamW"
ids = torch.randint(0, 256, (B, T), device="cuda")
torch.cuda.reset_peak_memory_stats()
times = []
for s in range(steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
warm = times[2:] if len(times) > 3 else times[1:]
print(json.dumps({"tokens_per_s": B * T * len(warm) / sum(warm), "peak_bytes": torch.cuda.max_memory_allocated(),
                  "optimizer": opt_name}))
"""


def tail(text: str, n: int = 15) -> str:
    return "\n".join("    | " + l for l in text.strip().splitlines()[-n:])


def run_torch(path, B, T, steps, timeout):
    r = subprocess.run([sys.executable, "-c", TORCH_CHILD, path, str(B), str(T), str(steps)], capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def find_peak(obj, prefer=("device", "gpu", "cuda", "vram")):
    """The first number under a key naming a device peak, searched depth-first; None if there is none."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            kl = k.lower()
            if isinstance(v, (int, float)) and "peak" in kl and any(p in kl for p in prefer):
                return float(v)
        for v in obj.values():
            got = find_peak(v, prefer)
            if got is not None:
                return got
    return None


def snug_peak(out):
    """snug's reported peak device memory: a device peak in the last metrics row or in memory.json, else the arenas'
    measured total from memory.json (labelled so), else None."""
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    got = find_peak(rows[-1]) if rows else None
    if got is not None:
        return got, "device peak"
    mj = os.path.join(out, "memory.json")
    if os.path.exists(mj):
        mem = json.load(open(mj))
        got = find_peak(mem)
        if got is not None:
            return got, "device peak"
        if "measured_total" in mem:
            return float(mem["measured_total"]), "arena peaks"
    return None, ""


def run_snug(snug, path, data, B, T, steps, out, timeout):
    cfg = os.path.join(out + ".yaml")
    with open(cfg, "w") as f:
        f.write(f"""base_model: {path}
datasets:
  - path: {data}
    type: completion
sequence_len: {T}
concatenate: true            # full rows of T tokens, like the random ids of the PyTorch run
micro_batch_size: {B}
gradient_accumulation_steps: 1
max_steps: {steps}
learning_rate: 1.0e-4
lr_scheduler: constant
weight_decay: 0.0
max_grad_norm: 1.0
logging_steps: 1
sample_tokens: 0
output_dir: {out}
device: cuda
bf16: true
flash_attention: true
gradient_checkpointing: full
optimizer: adamw_8bit
""")
    r = subprocess.run([snug, "train", cfg], capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    warm = rows[2:] if len(rows) > 3 else rows[1:]
    secs = sum(B * T / row["tokens_per_s"] for row in warm)  # each row's rate is its own step's
    peak, what = snug_peak(out)
    return {"tokens_per_s": B * T * len(warm) / secs, "peak_bytes": peak, "peak_what": what}


def fmt_bytes(b):
    return f"{b / 2**30:7.2f}Gi" if b is not None else "    n/a "


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default="build/snug")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--only", default="")
    ap.add_argument("--peak_tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per training run")
    a = ap.parse_args()
    try:
        import torch
        have_cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if have_cuda else "no GPU"
    except ImportError:
        print("bench_train_gpu: PyTorch is not importable; it makes the models and runs the comparison",
              file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="snug-train-gpu-")
    data = os.path.join(work, "data.jsonl")
    make_data(data, 4_000_000)
    print(f"# training on {gpu}: tokens/s, MFU at {a.peak_tflops:.0f} TFLOP/s, peak memory; {a.steps} steps, "
          f"the first 2 not timed")
    print(f"{'model':<10} {'B':>2} {'T':>5} {'snug tok/s':>11} {'torch tok/s':>12} {'ratio':>6} {'snug MFU':>9} "
          f"{'torch MFU':>9} {'snug peak':>10} {'torch peak':>10} {'ratio':>6}", flush=True)
    for name, cfg, B, T in CASES:
        if a.only and a.only != name:
            continue
        path = os.path.join(work, name)
        t0 = time.time()
        try:
            nparams = make_model(cfg, path)
        except Exception as e:  # noqa: BLE001 - an older transformers, out of memory: go on with the rest
            print(f"# making {name} failed:\n{tail(repr(e))}", flush=True)
            continue
        L, C = model_dims(cfg)
        fpt = 6 * nparams + 6 * L * T * C  # FLOPs per trained token
        print(f"# {name}: {nparams / 1e6:.0f}M parameters, B={B} T={T} (model made in {time.time() - t0:.0f} s)",
              flush=True)
        s = t = {}
        try:
            s = run_snug(a.snug, path, data, B, T, a.steps, os.path.join(work, "out-" + name), a.timeout)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"# snug run failed for {name}:\n{tail(str(e))}", flush=True)
        try:
            t = run_torch(path, B, T, a.steps, a.timeout)
        except Exception as e:  # noqa: BLE001
            print(f"# torch run failed for {name}:\n{tail(str(e))}", flush=True)
        st, tt = s.get("tokens_per_s"), t.get("tokens_per_s")
        sp, tp = s.get("peak_bytes"), t.get("peak_bytes")
        mfu = lambda tps: 100 * fpt * (tps or 0) / (a.peak_tflops * 1e12)  # noqa: E731
        ratio = lambda x, y: f"{x / y:5.2f}x" if x and y else "   n/a"  # noqa: E731
        print(f"{name:<10} {B:>2} {T:>5} {st or 0:>11.0f} {tt or 0:>12.0f} {ratio(st, tt)} {mfu(st):8.1f}% "
              f"{mfu(tt):8.1f}% {fmt_bytes(sp):>10} {fmt_bytes(tp):>10} {ratio(sp, tp)}")
        # the same as one machine-readable line, for scripts/gpu-check.sh
        print(f"train model={name} B={B} T={T} snug_tok_s={st or 0:.0f} torch_tok_s={tt or 0:.0f} "
              f"snug_mfu={mfu(st):.1f} torch_mfu={mfu(tt):.1f} snug_peak_gib={(sp or 0) / 2**30:.2f} "
              f"torch_peak_gib={(tp or 0) / 2**30:.2f} "
              f"snug_peak_kind={s.get('peak_what', '').replace(' ', '_') or 'none'} "
              f"torch_optimizer={t.get('optimizer', 'none').replace(' ', '_')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
