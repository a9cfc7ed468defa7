#!/usr/bin/env bash
# What a run configuration means, end to end: epochs and evaluation (eval_steps: 0 evaluates at the end of each
# epoch; num_epochs never runs into an extra epoch when the micro-batches of an epoch are not a multiple of the
# accumulation), the warmup printed is the warmup used, `snug generate` takes its flags through the key table
# (out-of-range numbers and over-long prompts get one clear error, exit 2), and a pretokenized dataset for a model
# folder without a tokenizer is checked against the model's vocabulary.
. "$(dirname "$0")/lib.sh"
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(3)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(94):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(3, 30)))}) + "\n")
PY
base="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sequence_len 48 --micro_batch_size 4
      --sample_tokens 0 --learning_rate 1e-3 --lr_scheduler constant --dataset_prepared_path $W/prepared"

# 90 training examples in 23 micro-batches per epoch, 3 per step: 8 steps per epoch, the 8th with 2 micro-batches
"$SNUG" train $base --val_set_size 4 --gradient_accumulation_steps 3 --num_epochs 2 --eval_steps 0 \
  --lr_scheduler constant_with_warmup --warmup_ratio 0.1 --output_dir "$W/epochs" > "$W/epochs.log" 2>&1 ||
  { bad "epochs run failed"; tail -3 "$W/epochs.log"; }
if python3 - "$W/epochs.log" "$W/epochs/metrics.jsonl" <<'PY'
import json, math, re, sys
log = open(sys.argv[1]).read()
rows = [json.loads(l) for l in open(sys.argv[2])]
m = re.search(r"schedule +(\d+) steps \((\d+) micro-batches per epoch\), lr (\S+) constant_with_warmup, warmup (\d+)",
              log)
steps, per_epoch, lr, warmup = int(m[1]), int(m[2]), float(m[3]), int(m[4])
per_step_epoch = math.ceil(per_epoch / 3)
want_steps = 2 * per_step_epoch
evals = [r["step"] for r in rows if "val_loss" in r]
lrs = {r["step"]: r["lr"] for r in rows}
print(f"  {per_epoch} micro-batches per epoch, {steps} steps (want {want_steps}), last epoch {rows[-1]['epoch']}, "
      f"evaluated at {evals} (want {[per_step_epoch, want_steps]}), warmup {warmup} (want {math.ceil(0.1 * steps)}): "
      f"lr {lrs[warmup]:.3e} then {lrs[warmup + 1]:.3e}")
good = (per_epoch % 3 != 0 and steps == want_steps and len(rows) == steps and rows[-1]["epoch"] == 2.0
        and rows[per_step_epoch - 1]["epoch"] == 1.0 and evals == [per_step_epoch, want_steps]
        and warmup == math.ceil(0.1 * steps) and lrs[warmup] < lr * 0.999 and abs(lrs[warmup + 1] - lr) <= 1e-9 * lr)
sys.exit(0 if good else 1)
PY
then ok; else bad "epochs, evaluation or warmup not as configured"; fi

# a model folder to generate from, and the same folder without its tokenizer
"$SNUG" train $base --max_steps 2 --output_dir "$W/model" > "$W/model.log" 2>&1 || bad "model run failed"
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$@" > "$W/out" 2> "$W/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -c . "$W/err")" -eq 1 ] && grep -Eq "snug: error: .*$pattern" "$W/err"; then ok
  else bad "$name: rc=$rc: $(head -c 300 "$W/err")"; fi
}
expect_error max-new-negative "max_new_tokens is -5; it must be at least 0" \
  "$SNUG" generate "$W/model" --prompt hello --max_new_tokens -5
expect_error top-k-text "top_k must be an integer, got 'many'" "$SNUG" generate "$W/model" --top_k many
expect_error top-p-range "top_p is 2; it must be in \(0, 1\]" "$SNUG" generate "$W/model" --top_p 2
expect_error unknown-flag "unknown key 'max_new_token'.*did you mean 'max_new_tokens'" \
  "$SNUG" generate "$W/model" --max_new_token 3
expect_error vocab-block-range "loss_vocab_block is -2; use a number of rows of at least 1, 0 for auto or -1 for off" \
  "$SNUG" train $base --max_steps 1 --loss_vocab_block -2 --output_dir "$W/vbbad"
expect_error bucket-cap-zero "ddp_bucket_cap_mb is 0; it must be at least 1" \
  "$SNUG" train $base --max_steps 1 --ddp_bucket_cap_mb 0 --output_dir "$W/bucket0"
expect_error vocab-block-gpu "loss_vocab_block is 64, but the loss over blocks of the head's rows runs on the CPU" \
  "$SNUG" plan $base --loss_vocab_block 64 --gpu h100
long=$(python3 -c "print(' '.join(['wizards quietly hex jovial bakers'] * 400))")
expect_error long-prompt "the prompt is [0-9]+ tokens but the model in .* has a context of [0-9]+ tokens" \
  "$SNUG" generate "$W/model" --prompt "$long" --max_new_tokens 4
if "$SNUG" generate "$W/model" --prompt "the quick" --max_new_tokens 3 --temperature 0 > "$W/gen" 2> "$W/gen.err"
then ok; else bad "generate failed: $(head -c 300 "$W/gen.err")"; fi

mkdir -p "$W/notok" && cp "$W/model/config.json" "$W/model/model.safetensors" "$W/notok/"
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$W/notok/config.json")
python3 - "$W/pretok.jsonl" "$vocab" <<'PY'
import json, sys
V = int(sys.argv[2])
with open(sys.argv[1], "w") as f:
    for i in range(16):
        ids = [(788 + 37 * i + k) % V for k in range(20)]
        f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
PY
printf 'base_model: %s\ndatasets:\n  - path: %s\n    type: pretokenized\n' "$W/notok" "$W/pretok.jsonl" > "$W/pretok.yaml"
if "$SNUG" train "$W/pretok.yaml" --max_steps 2 --sequence_len 32 --micro_batch_size 2 --sample_tokens 0 \
     --dataset_prepared_path "$W/prepared" --output_dir "$W/pretok" > "$W/pretok.log" 2>&1
then ok; else bad "pretokenized data for a folder without tokenizer: $(grep error "$W/pretok.log")"; fi
printf '{"input_ids": [1, %d], "labels": [1, %d]}\n' "$vocab" "$vocab" > "$W/outside.jsonl"
sed "s|pretok.jsonl|outside.jsonl|" "$W/pretok.yaml" > "$W/outside.yaml"
expect_error outside-vocab "input_ids\[1\] is $vocab, outside the vocabulary 0\.\.$((vocab - 1))" \
  "$SNUG" train "$W/outside.yaml" --max_steps 1 --sample_tokens 0 --dataset_prepared_path "$W/prepared" \
  --output_dir "$W/outside"

finish
