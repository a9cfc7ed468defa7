#!/usr/bin/env bash
# Corrupted inputs never crash snug: seeded random mutations of a valid config.json, model.safetensors header,
# tokenizer.json, YAML config and JSONL dataset. Every run must end with status 0 (the mutation was harmless) or 2
# (a clear error), never a signal, an internal error or a sanitizer report. Bounded: a fixed number of mutations.
. "$(dirname "$0")/lib.sh"
N=${SNUG_FUZZ_RUNS:-25}
errors=0

printf '{"text": "a small line of text for the fuzzing runs, repeated."}\n%.0s' $(seq 60) > "$W/data.jsonl"
T="--sequence_len 16 --micro_batch_size 2 --max_steps 1 --sample_tokens 0"
"$SNUG" train --dataset "$W/data.jsonl" --tokenizer "$SRC/assets/tokenizer" $T --output_dir "$W/model" >/dev/null 2>&1 \
  || fatal "cannot make a model"
cp "$SRC/assets/tokenizer/tokenizer.json" "$W/model/tokenizer.json"
printf 'datasets:\n  - path: data.jsonl\n    type: completion\nsequence_len: 16\nmicro_batch_size: 2\nmax_steps: 1\nsample_tokens: 0\nlearning_rate: 1.0e-3\n' > "$W/cfg.yaml"

# mutate SRC DST SEED MODE: MODE header = only within the first 600 bytes (safetensors header), all = anywhere
mutate() {
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import random, sys
src, dst, seed, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
b = bytearray(open(src, "rb").read())
for _ in range(rng.randint(1, 4)):
    span = min(len(b), 600) if mode == "header" else len(b)
    if span == 0:
        break
    op = rng.random()
    i = rng.randrange(span)
    if op < 0.5:
        b[i] = rng.randrange(256)
    elif op < 0.75:
        del b[i:i + rng.randint(1, 16)]
    else:
        b[i:i] = bytes(rng.choice(b'{}[]",:0123456789-eE.\\ntrue') for _ in range(rng.randint(1, 8)))
if rng.random() < 0.1:
    b = b[:rng.randrange(len(b) + 1)]
open(dst, "wb").write(b)
PY
}

survives() { # NAME CMD...: exit 0 or 2, no sanitizer report
  local name=$1; shift
  "$@" >"$W/out" 2>"$W/err"
  local rc=$?
  if { [ $rc -eq 0 ] || [ $rc -eq 2 ]; } && ! grep -q "Sanitizer\|runtime error" "$W/err"; then
    ok
    [ $rc -eq 2 ] && errors=$((errors + 1))
  else
    bad "$name: rc=$rc" "$W/err"
  fi
}

for i in $(seq 1 "$N"); do
  rm -rf "$W/m"; cp -r "$W/model" "$W/m"
  mutate "$W/model/config.json" "$W/m/config.json" "$i" all
  survives "config.json #$i" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/m" $T --output_dir "$W/o"

  rm -rf "$W/m"; cp -r "$W/model" "$W/m"
  mutate "$W/model/model.safetensors" "$W/m/model.safetensors" "$i" header
  survives "model.safetensors #$i" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/m" $T --output_dir "$W/o"

  rm -rf "$W/m"; cp -r "$W/model" "$W/m"
  mutate "$W/model/tokenizer.json" "$W/m/tokenizer.json" "$i" all
  survives "tokenizer.json #$i" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/m" $T --output_dir "$W/o"

  mutate "$W/cfg.yaml" "$W/c.yaml" "$i" all
  survives "config yaml #$i" "$SNUG" train "$W/c.yaml" --tokenizer "$SRC/assets/tokenizer" --output_dir "$W/o"

  mutate "$W/data.jsonl" "$W/d.jsonl" "$i" all
  survives "jsonl #$i" "$SNUG" train --dataset "$W/d.jsonl" --tokenizer "$SRC/assets/tokenizer" $T --output_dir "$W/o" \
    --dataset_prepared_path "$W/prep"
done
echo "  $errors of $((pass + fail)) corrupted inputs were refused with a clear error (exit 2), the rest were harmless"
finish
