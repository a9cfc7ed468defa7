#!/usr/bin/env bash
# The tokenizer and the commands: `snug plan` never needs a tokenizer that loads (one with a component snug does not
# support plans with the vocabulary size read from the file, or from the base model's config.json when the file is
# not even JSON), while training refuses it with one error line that names the file, the place and the component
# type (exit status 2). A tokenizer in SmolLM's published shape (Digits before ByteLevel) trains.
. "$(dirname "$0")/lib.sh"
CFG=$SRC/tests/data/configs
T="--sequence_len 16 --micro_batch_size 2 --sample_tokens 0 --output_dir $W/out"
printf '{"text": "hello world 12345"}\n{"text": "another line, 2024-12-07"}\n' > "$W/data.jsonl"

tokset() { # tokset NAME PRE_TOKENIZER_JSON: the built-in tokenizer with that pre_tokenizer, in $W/NAME
  rm -rf "$W/$1"; cp -r "$SRC/assets/tokenizer" "$W/$1"
  python3 - "$W/$1/tokenizer.json" "$2" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); t["pre_tokenizer"] = json.loads(sys.argv[2]); json.dump(t, open(sys.argv[1], "w"))
PY
}
BL='{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}'
tokset tk_bad "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Wordish\"}, $BL]}"
tokset tk_smol "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": true}, $BL]}"

vocab_of() { sed -n 's/.*vocab \([0-9]*\)).*/\1/p' "$W/stdout" | head -1; }

# the plan with the tokenizer that loads, and with one that does not: the same model, the same vocabulary
"$SNUG" plan --tokenizer "$SRC/assets/tokenizer" > "$W/stdout" 2> "$W/stderr"
want=$(vocab_of)
if [ -n "$want" ]; then ok; else bad "plan with the built-in tokenizer: no vocab in the output" "$W/stderr"; fi
"$SNUG" plan --tokenizer "$W/tk_bad" > "$W/stdout" 2> "$W/stderr"
rc=$?
if [ $rc -eq 0 ] && [ "$(vocab_of)" = "$want" ]; then ok; else
  bad "plan with an unsupported pre_tokenizer: exit $rc, vocab '$(vocab_of)' (want $want)" "$W/stderr"; fi
# with data, the plan says why the data could not be read
"$SNUG" plan --tokenizer "$W/tk_bad" --dataset "$W/data.jsonl" > "$W/stdout" 2> "$W/stderr"
rc=$?
if [ $rc -eq 0 ] && tr '\n' ' ' < "$W/stdout" | tr -s ' ' |
   grep -q 'could not be read (.*tk_bad/tokenizer.json: .*pre_tokenizer type "Wordish" is not supported'; then ok; else
  bad "plan with data and an unsupported pre_tokenizer: exit $rc" "$W/stderr"; fi
# a base model whose tokenizer.json is not even JSON: its config.json gives the vocabulary
mkdir -p "$W/bm" && cp "$CFG/llama-3.2-3b/config.json" "$W/bm/" && echo "not json" > "$W/bm/tokenizer.json"
"$SNUG" plan --base_model "$W/bm" > "$W/stdout" 2> "$W/stderr"
rc=$?
if [ $rc -eq 0 ] && grep -q "vocab 128256" "$W/stdout"; then ok; else
  bad "plan of a base model with a broken tokenizer.json: exit $rc" "$W/stderr"; fi

# training refuses the unsupported component by name: the file, the JSON path, the type
"$SNUG" train --dataset "$W/data.jsonl" $T --tokenizer "$W/tk_bad" --max_steps 1 > "$W/stdout" 2> "$W/stderr"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c 'snug: error:' "$W/stderr")" -eq 1 ] &&
   grep -q 'tk_bad/tokenizer.json: pre_tokenizer.pretokenizers\[0\]: pre_tokenizer type "Wordish" is not supported' \
     "$W/stderr"; then ok; else bad "train with an unsupported pre_tokenizer: exit $rc" "$W/stderr"; fi

# SmolLM's shape trains
rm -rf "$W/out"
"$SNUG" train --dataset "$W/data.jsonl" $T --tokenizer "$W/tk_smol" --max_steps 1 > "$W/stdout" 2> "$W/stderr"
rc=$?
if [ $rc -eq 0 ] && [ -e "$W/out/model.safetensors" ]; then ok; else
  bad "train with Digits + ByteLevel: exit $rc" "$W/stderr"; fi
finish
