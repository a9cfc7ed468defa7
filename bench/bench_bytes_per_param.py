"""Bytes per parameter of the weights, master copy, gradients and optimizer state for each precision/optimizer
combination: computed by the planner (`snug plan --json`) for a Llama-3.2-1B-shaped model, and confirmed by short
training runs of llama-30m, whose arena high-water marks (memory.json) are measured.

    python bench/bench_bytes_per_param.py --snug build/snug
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

COMBOS = [
    ("fp32 + AdamW", []),
    ("fp32 + 8-bit AdamW", ["--optimizer", "adamw_8bit"]),
    ("bf16 + fp32 master + AdamW", ["--bf16", "true"]),
    ("bf16 + fp32 master + 8-bit AdamW", ["--bf16", "true", "--optimizer", "adamw_8bit"]),
    ("bf16, no master + AdamW", ["--bf16", "true", "--master_weights", "false"]),
    ("bf16, no master + 8-bit AdamW", ["--bf16", "true", "--master_weights", "false", "--optimizer", "adamw_8bit"]),
    ("fp16 + fp32 master + AdamW", ["--fp16", "true"]),
    ("bf16 + master + AdamW, accumulation 4", ["--bf16", "true", "--gradient_accumulation_steps", "4"]),
    ("bf16, no master + 8-bit, step in backward",
     ["--bf16", "true", "--master_weights", "false", "--optimizer", "adamw_8bit", "--optimizer_in_backward", "true",
      "--max_grad_norm", "0"]),
]
CATS = ["parameters", "master weights", "gradients", "optimizer state"]
LLAMA_1B = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=2048,
                intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                hidden_act="silu", torch_dtype="bfloat16")


def per_param(mem: dict, n: int) -> list:
    return [mem[c] / n for c in CATS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default="build/snug")
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(__file__), "..", "assets", "tokenizer"))
    a = ap.parse_args()
    snug = os.path.abspath(a.snug)
    with tempfile.TemporaryDirectory() as w:
        os.makedirs(f"{w}/llama1b")
        json.dump(LLAMA_1B, open(f"{w}/llama1b/config.json", "w"))
        with open(f"{w}/data.jsonl", "w") as f:
            for i in range(200):
                f.write(json.dumps({"text": "the quick brown fox jumps over the lazy dog " * (1 + i % 5)}) + "\n")
        print(f"{'combination':<44} {'planned, Llama-3.2-1B shape':>34} {'measured, llama-30m run':>34}")
        print(f"{'':<44} {'w   master  grads  optim  total':>34} {'w   master  grads  optim  total':>34}")
        for name, args in COMBOS:
            out = subprocess.run([snug, "plan", "--base_model", f"{w}/llama1b", "--micro_batch_size", "1",
                                  "--sequence_len", "2048", "--json"] + args, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"snug plan failed for {name}: {out.stderr.strip()}")
            d = json.loads(out.stdout)
            n = d["model"]["parameters"]
            planned = per_param({c: d["memory"]["categories"][c]["bytes"] for c in CATS}, n)
            od = f"{w}/run"
            run = subprocess.run([snug, "train", "--model_preset", "llama-30m", "--dataset", f"{w}/data.jsonl",
                                  "--tokenizer", a.tokenizer, "--micro_batch_size", "1", "--sequence_len", "64",
                                  "--max_steps", "2", "--sample_tokens", "0", "--val_set_size", "0",
                                  "--output_dir", od] + args, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"snug train failed for {name}: {run.stdout[-500:]}{run.stderr[-500:]}")
            m = json.load(open(f"{od}/memory.json"))
            nm = json.loads(subprocess.run([snug, "plan", "--model_preset", "llama-30m", "--json"],
                                           capture_output=True, text=True).stdout)["model"]["parameters"]
            measured = per_param(m["measured"], nm)
            fmt = lambda v: f"{v[0]:4.2f} {v[1]:6.2f} {v[2]:6.2f} {v[3]:6.2f} {sum(v):6.2f}"
            print(f"{name:<44} {fmt(planned):>34} {fmt(measured):>34}")


if __name__ == "__main__":
    main()
