#!/usr/bin/env bash
# The sequence levers through `snug train`: packing together with gradient accumulation, full checkpointing and
# chunked cross-entropy logs the losses of the plain packed run (the same rows in every step); dynamic padding, padding
# to sequence_len and to a multiple of 16 log the same losses as each other (padding changes nothing), also with
# accumulation; length grouping and concatenation train; the header reports every way's padding and efficiency; and
# contradictory keys are refused.
. "$(dirname "$0")/lib.sh"
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(2)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(300):  # irregular lengths, a few longer than sequence_len (truncated)
        n = random.choice([random.randint(1, 8), random.randint(5, 25), random.randint(20, 60)])
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(n))}) + "\n")
PY
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sequence_len 64 --max_steps 4 --sample_tokens 0
        --logging_steps 1 --learning_rate 1e-3 --lr_scheduler constant --seed 5 --threads 2"

. "$(dirname "$0")/losses.sh"

train packed --sample_packing true --micro_batch_size 4
train packed_all --sample_packing true --micro_batch_size 1 --gradient_accumulation_steps 4 \
  --gradient_checkpointing full --chunked_cross_entropy true --cross_entropy_chunk_tokens 37
train padded --micro_batch_size 4
train padded_fixed --micro_batch_size 4 --pad_to_sequence_len true
train padded_x16 --micro_batch_size 4 --pad_to_multiple_of 16 --flash_attention false
train padded_accum --micro_batch_size 2 --gradient_accumulation_steps 2 --gradient_checkpointing selective
train grouped --micro_batch_size 4 --group_by_length true --val_set_size 20 --eval_steps 2
train concatenated --micro_batch_size 4 --concatenate true
train packed_val --sample_packing true --micro_batch_size 2 --val_set_size 0.1 --eval_steps 2
compare packed_all packed 1e-5
compare padded_fixed padded 1e-5
compare padded_x16 padded 1e-5
compare padded_accum padded 1e-5

# the header: the chosen way marked, every other way's padding and efficiency beside it
if grep -q "batching             packed: .* padding (.*% efficiency)" "$W/packed.log" &&
   grep -q "^ *\* packed " "$W/packed.log" && grep -q "fixed padding to 64" "$W/packed.log" &&
   grep -q "^ *\* dynamic padding " "$W/padded.log" && grep -q "^ *\* grouped by length " "$W/grouped.log" &&
   grep -q "^ *\* concatenated " "$W/concatenated.log"; then ok; else bad "batching report missing"; sed -n '/batching/,+7p' "$W/packed.log"; fi
# validation with packing and with grouping: a finite val_loss at steps 2 and 4
for run in packed_val grouped; do
  if python3 -c "
import json, math, sys
v = [json.loads(l).get('val_loss') for l in open(sys.argv[1])]
sys.exit(0 if v[1] is not None and v[3] is not None and math.isfinite(v[1]) and math.isfinite(v[3]) else 1)" \
    "$W/$run/metrics.jsonl"; then ok; else bad "$run: no validation loss"; fi
done

# contradictory keys: exit 2 with the reason, nothing trained
refuse() { # WANT ARGS...
  local want=$1; shift
  "$SNUG" train $common --output_dir "$W/refused" "$@" > "$W/refused.log" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -q "$want" "$W/refused.log" && [ ! -e "$W/refused/metrics.jsonl" ]; then ok
  else bad "expected exit 2 with '$want', got $rc: $(tail -1 "$W/refused.log")"; fi
}
refuse "sample_packing and group_by_length are both true" --sample_packing true --group_by_length true
refuse "concatenate is true with sample_packing" --sample_packing true --concatenate true
refuse "pad_to_multiple_of is -1" --pad_to_multiple_of -1

finish
