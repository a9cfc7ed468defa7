"""Activation levers: step time and memory of each lever against the run without it, measured in the same run.

1. Training steps of a Llama (preset llama-30m, T=512) with each lever: tokens/s, the step-time overhead of
   recomputation, and the saved-activation / workspace arena peaks (measured high-water marks).
2. Gradient accumulation: arena peaks and process peak RSS at N = 1, 4, 16 micro-batches per step.
3. Chunked cross-entropy on a 128k vocabulary at 4096 tokens (Llama-3.2-1B shapes, plan only: the plan is the
   allocation).

    python bench/bench_levers.py --snug build/snug [--threads 2] [--steps 6]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def train(snug, work, name, extra, steps, threads):
    out = os.path.join(work, name)
    cmd = [snug, "train", "--model_preset", "llama-30m", "--tokenizer", os.path.join(SRC, "assets/tokenizer"),
           "--dataset", os.path.join(SRC, "data/fortunes.jsonl"), "--sequence_len", "512", "--max_steps", str(steps),
           "--logging_steps", "1", "--sample_tokens", "0", "--output_dir", out, "--threads", str(threads),
           "--lr_scheduler", "constant", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    warm = rows[1:]
    tps = sum(x["tokens_per_s"] for x in warm) / len(warm)
    peaks = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s+(saved activations|workspace|total)\s+\S+ \S+\s+([\d.]+) (\S+)", line)
        if m:
            peaks[m.group(1)] = float(m.group(2)) * {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[m.group(3)]
    return tps, peaks, rows[-1]["peak_rss_bytes"] / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snug", default="build/snug")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    work = tempfile.mkdtemp()

    print("1. levers, llama-30m preset, micro-batch 2 x 512 tokens")
    print(f"{'lever':<34} {'tok/s':>8} {'step time':>10} {'saved acts':>11} {'workspace':>10} {'arenas':>9}")
    cases = [("none", []), ("gradient_checkpointing: selective", ["--gradient_checkpointing", "selective"]),
             ("gradient_checkpointing: full", ["--gradient_checkpointing", "full"]),
             ("flash_attention: false", ["--flash_attention", "false"]),
             ("chunked_cross_entropy: true", ["--chunked_cross_entropy", "true"])]
    base = None
    for name, extra in cases:
        tps, peaks, rss = train(a.snug, work, re.sub(r"\W", "_", name), ["--micro_batch_size", "2", *extra],
                                a.steps, a.threads)
        base = base or tps
        print(f"{name:<34} {tps:>8.0f} {base / tps:>9.2f}x {peaks['saved activations']:>8.1f}Mi "
              f"{peaks['workspace']:>7.1f}Mi {peaks['total']:>6.1f}Mi", flush=True)

    print("\n2. gradient accumulation, micro-batch 1 x 512 tokens")
    print(f"{'N':>3} {'saved acts':>11} {'workspace':>10} {'arenas':>9} {'peak RSS':>9}")
    for n in (1, 4, 16):
        tps, peaks, rss = train(a.snug, work, f"ga{n}", ["--micro_batch_size", "1",
                                                         "--gradient_accumulation_steps", str(n)], 2, a.threads)
        print(f"{n:>3} {peaks['saved activations']:>8.1f}Mi {peaks['workspace']:>7.1f}Mi {peaks['total']:>6.1f}Mi "
              f"{rss:>6.0f}Mi", flush=True)

    print("\n3. chunked cross-entropy, Llama-3.2-1B shapes (vocab 128256), 1 x 4096 tokens, plan")
    cfg_dir = os.path.join(work, "llama-3.2-1b")
    os.makedirs(cfg_dir)
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
               "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192},
               "tie_word_embeddings": True}, open(os.path.join(cfg_dir, "config.json"), "w"))
    for extra in ([], ["--chunked_cross_entropy", "true"]):
        r = subprocess.run([a.snug, "plan", "--base_model", cfg_dir, "--sequence_len",
                            "4096", "--micro_batch_size", "1", *extra], capture_output=True, text=True)
        ws = [l for l in r.stdout.splitlines() if l.strip().startswith("workspace")]
        print(f"  {' '.join(extra) or 'plain':<30} {ws[0].strip() if ws else r.stdout + r.stderr}")


if __name__ == "__main__":
    main()
