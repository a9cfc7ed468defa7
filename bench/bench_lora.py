"""LoRA fine-tuning throughput and peak memory: snug against PEFT on PyTorch, on the same machine, in the same run.

A SmolLM-135M-shaped Llama (random weights; 30 layers, width 576, 9 heads / 3 kv heads, MLP 1536, vocab 49152),
LoRA r=16 alpha 16 on all seven projections, dropout 0, fp32, AdamW over the adapters, the same micro-batch on the
same number of threads. PEFT trains the same base folder with get_peft_model (base frozen, adapters fp32). Prints
tokens/s and peak RSS of each and the ratios snug/PEFT. Targets (LoRA issue): tokens/s >= 1.5x at <= 0.6x peak RSS.
With --qlora: snug's adapter: qlora (NF4, double quantization, bf16 for the rest) against PEFT on transformers'
BitsAndBytesConfig model (the same quantization, compute dtype bf16) prepared with prepare_model_for_kbit_training,
as the QLoRA recipes do; target: peak RSS <= 0.5x. With --int8: LoRA on the 8-bit base (snug's load_in_8bit,
transformers' BitsAndBytesConfig(load_in_8bit=True), the rest bf16, prepared alike). With --dora: DoRA on the same
modules in both (snug's peft_use_dora, PEFT's use_dora).

    python bench/bench_lora.py --snug build/snug [--threads 2] [--steps 8] [--batch 4] [--seq 256] [--qlora | --int8]
                               [--dora]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import make_data  # noqa: E402

SMOL = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True,
            rms_norm_eps=1e-5, rope_theta=10000.0)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

PEFT_CHILD = r"""
import json, resource, sys, time, torch, transformers, peft
path, B, T, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
torch.manual_seed(0)
if sys.argv[6] != "0":  # QLoRA (1) or the 8-bit base (2): bitsandbytes, the recipe's preparation
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.bfloat16) if sys.argv[6] == "1" else \
        transformers.BitsAndBytesConfig(load_in_8bit=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.bfloat16,
                                                             quantization_config=bnb, device_map="cpu")
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
else:
    base = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
model = peft.get_peft_model(base, peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=%s,
                                                  use_dora=sys.argv[7] == "1"))
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
ids = torch.randint(0, 256, (B, T))
times = []
for s in range(steps):
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
warm = times[2:] if len(times) > 3 else times[1:]
print(json.dumps({"tokens_per_s": B * T * len(warm) / sum(warm),
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""" % repr(TARGETS)


def run_peft(path, B, T, steps, threads, qlora, dora):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", PEFT_CHILD, path, str(B), str(T), str(steps), str(threads),
                        {"nf4": "1", "int8": "2"}.get(qlora, "0"), "1" if dora else "0"],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_snug(snug, path, data, B, T, steps, threads, out, qlora, dora):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [snug, "train", "--base_model", path, "--dataset", data, "--micro_batch_size", str(B), "--sequence_len",
           str(T), "--max_steps", str(steps), "--learning_rate", "1e-4", "--lr_scheduler", "constant",
           "--logging_steps", "1", "--output_dir", out, "--threads", str(threads), "--sample_tokens", "0",
           "--adapter", "qlora" if qlora == "nf4" else "lora", "--load_in_8bit", "true" if qlora == "int8" else "false",
           "--lora_r", "16", "--lora_alpha", "16", "--lora_target_linear", "true",
           "--overwrite_output_dir", "true", "--max_grad_norm", "1.0", "--weight_decay", "0",
           "--peft_use_dora", "true" if dora else "false"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    warm = rows[2:] if len(rows) > 3 else rows[1:]
    secs = sum(B * T / x["tokens_per_s"] for x in warm)
    return {"tokens_per_s": B * T * len(warm) / secs, "peak_rss": rows[-1]["peak_rss_bytes"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default="build/snug")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--work", default="")
    ap.add_argument("--qlora", action="store_true")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--dora", action="store_true")
    a = ap.parse_args()
    quant = "nf4" if a.qlora else "int8" if a.int8 else ""
    import torch
    import transformers
    work = a.work or tempfile.mkdtemp()
    path = os.path.join(work, "smollm-135m")
    if not os.path.exists(os.path.join(path, "config.json")):
        torch.manual_seed(0)
        cfg = transformers.AutoConfig.for_model(**SMOL)
        transformers.AutoModelForCausalLM.from_config(cfg).float().save_pretrained(path, safe_serialization=True)
    data = os.path.join(work, "data.jsonl")
    make_data(data, a.batch * a.seq * (a.steps + 2) * 2)
    s = run_snug(a.snug, path, data, a.batch, a.seq, a.steps, a.threads, os.path.join(work, "out"), quant, a.dora)
    p = run_peft(path, a.batch, a.seq, a.steps, a.threads, quant, a.dora)
    what = {"nf4": "QLoRA (NF4, double quantization, bf16)", "int8": "LoRA on the 8-bit base (LLM.int8, bf16)"}.get(
        quant, "LoRA (fp32)")
    what = what.replace("LoRA", "DoRA") if a.dora else what
    print(f"{what} r=16 on all 7 projections, SmolLM-135M shape, B={a.batch} T={a.seq}, {a.threads} threads")
    print(f"  snug  {s['tokens_per_s']:8.1f} tokens/s  peak RSS {s['peak_rss'] / 2**20:8.1f} MiB")
    print(f"  PEFT  {p['tokens_per_s']:8.1f} tokens/s  peak RSS {p['peak_rss'] / 2**20:8.1f} MiB")
    print(f"  snug/PEFT: tokens/s {s['tokens_per_s'] / p['tokens_per_s']:.2f}x{'' if quant else ' (target >= 1.5x)'}, "
          f"peak RSS {s['peak_rss'] / p['peak_rss']:.2f}x (target <= {'0.5' if quant else '0.6'}x)")


if __name__ == "__main__":
    main()
