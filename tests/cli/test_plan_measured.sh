#!/usr/bin/env bash
# The plan against the measurement: short training runs (2 steps) of small configurations, covering the model
# presets, batch and sequence sizes, accumulation, and every memory lever (checkpointing none/selective/full/every 2nd
# layer, naive attention, chunked cross-entropy, 8-bit and paged optimizers, auto_fit, bf16/fp16 mixed precision). For each run, memory.json in
# output_dir holds the plan and each arena's measured high-water mark: every category must be within 3% of its plan.
# The process peak RSS is compared with the plan plus the CPU runtime overhead (docs/MEMORY.md) and reported; it must
# stay within 10% + 32 MiB of the prediction (skipped under AddressSanitizer, whose shadow memory is in the RSS).
. "$(dirname "$0")/lib.sh"
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(3)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(3, 60)))}) + "\n")
PY
asan=0
if ldd "$SNUG" 2>/dev/null | grep -q libasan; then asan=1; fi
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --max_steps 2 --sample_tokens 0 --logging_steps 1
        --val_set_size 0"

run() { # NAME ARGS...
  local name=$1; shift
  if ! (cd "$W" && "$SNUG" train $common --output_dir "$W/$name" "$@" > "$W/$name.log" 2>&1); then
    bad "$name: training failed" "$W/$name.log"; return
  fi
  if python3 - "$W/$name/memory.json" "$name" "$asan" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); name = sys.argv[2]; asan = sys.argv[3] == "1"
worst = 0.0
for cat, planned in m["plan"].items():
    got = m["measured"][cat]
    err = abs(got - planned) / planned if planned else float(got != 0)
    worst = max(worst, err)
    if err > 0.03:
        print(f"  {name}: {cat} planned {planned} measured {got} ({100 * err:.1f}% off)")
rss, pred = m["peak_rss"], m["predicted_rss"]
rss_ok = asan or abs(rss - pred) <= 0.10 * pred + 32 * 2**20
print(f"  {name:<34} arenas {m['plan_total'] / 2**20:8.1f} MiB, worst category {100 * worst:.2f}% off; "
      f"peak RSS {rss / 2**20:7.1f} MiB vs predicted {pred / 2**20:7.1f} MiB ({100 * (rss - pred) / pred:+.1f}%)"
      + (" [RSS not checked under ASan]" if asan else ""))
sys.exit(0 if worst <= 0.03 and rss_ok else 1)
PY
  then ok; else bad "$name: measured memory is not what was planned"; fi
}

run tiny_b4_t64 --model_preset tiny-llama --micro_batch_size 4 --sequence_len 64
run tiny_b8_t128_ga2 --model_preset tiny-llama --micro_batch_size 8 --sequence_len 128 --gradient_accumulation_steps 2
run llama30m_b2_t128 --model_preset llama-30m --micro_batch_size 2 --sequence_len 128
run gpt2_b1_t64 --model_preset gpt2-124m --micro_batch_size 1 --sequence_len 64
run ckpt_selective --model_preset tiny-llama --micro_batch_size 4 --sequence_len 96 --gradient_checkpointing selective
run ckpt_full --model_preset llama-30m --micro_batch_size 2 --sequence_len 128 --gradient_checkpointing full
run ckpt_every2 --model_preset llama-30m --micro_batch_size 2 --sequence_len 128 --gradient_checkpointing full \
    --gradient_checkpointing_every_n_layers 2
run naive_attention --model_preset tiny-llama --micro_batch_size 2 --sequence_len 128 --flash_attention false
run chunked_ce --model_preset tiny-llama --micro_batch_size 4 --sequence_len 64 --chunked_cross_entropy true \
    --cross_entropy_chunk_tokens 37
run adamw_8bit --model_preset llama-30m --micro_batch_size 2 --sequence_len 64 --optimizer adamw_8bit
run paged_adamw_8bit --model_preset tiny-llama --micro_batch_size 2 --sequence_len 64 --optimizer paged_adamw_8bit
run auto_fit --model_preset llama-30m --micro_batch_size 8 --sequence_len 128 --auto_fit true --memory_budget 480MiB
# mixed precision: 16-bit parameters, activations and gradients (fp32 gradients when accumulating), with and without
# the fp32 master copy
run bf16 --model_preset llama-30m --micro_batch_size 2 --sequence_len 128 --bf16 true
run bf16_nomaster_8bit --model_preset llama-30m --micro_batch_size 2 --sequence_len 64 --bf16 true \
    --master_weights false --optimizer adamw_8bit
run fp16_ga2_selective --model_preset tiny-llama --micro_batch_size 4 --sequence_len 64 --fp16 true \
    --gradient_accumulation_steps 2 --gradient_checkpointing selective
run bf16_gpt2_full_packed --model_preset gpt2-124m --micro_batch_size 1 --sequence_len 64 --bf16 true \
    --gradient_checkpointing full --sample_packing true --chunked_cross_entropy true
run bf16_in_backward --model_preset tiny-llama --micro_batch_size 2 --sequence_len 64 --bf16 true \
    --optimizer_in_backward true --max_grad_norm 0 --gradient_checkpointing full
run ckpt_offload --model_preset llama-30m --micro_batch_size 2 --sequence_len 128 --gradient_checkpointing offload
run bf16_ckpt_offload --model_preset tiny-llama --micro_batch_size 4 --sequence_len 64 --bf16 true \
    --gradient_checkpointing offload --optimizer paged_adamw_8bit
run bf16_paged8_in_backward_offload --model_preset llama-30m --micro_batch_size 2 --sequence_len 64 --bf16 true \
    --master_weights false --optimizer paged_adamw_8bit --optimizer_in_backward true --max_grad_norm 0 \
    --gradient_checkpointing offload
run bf16_paged_32bit --model_preset tiny-llama --micro_batch_size 2 --sequence_len 64 --bf16 true \
    --optimizer paged_adamw_32bit

finish
