#!/usr/bin/env bash
# Dataset formats through the program: `snug preprocess` (counts, --debug, --dump, the cache reused and rebuilt), the
# long-example and bad-line reports, training on alpaca / chat / pretokenized data, dataset_exact_deduplication, and
# bad data: exit status 2, one "snug: error:" line naming the file and the line, nothing in output_dir or the cache
# folder.
. "$(dirname "$0")/lib.sh"

# expect_error NAME PATTERN CMD...: exit status 2, one "snug: error:" line matching PATTERN, no output_dir, no cache
expect_error() {
  local name=$1 pattern=$2; shift 2
  rm -rf "$W/out" "$W/prep"
  "$@" >"$W/stdout" 2>"$W/stderr"
  local rc=$? lines
  lines=$(grep -c "snug: error:" "$W/stderr")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -Eq -- "$pattern" "$W/stderr" && [ ! -e "$W/out" ] &&
     [ ! -e "$W/prep" ]; then
    ok
  else
    bad "$name: rc=$rc, error lines=$lines, out: $([ -e "$W/out" ] && echo yes || echo no), prep: $([ -e "$W/prep" ] && echo yes || echo no)" "$W/stderr"
  fi
}

# expect_out NAME PATTERN FILE: FILE holds a line matching PATTERN
expect_out() {
  if grep -Eq -- "$2" "$3"; then ok; else bad "$1: no line matching '$2'" "$3"; fi
}

# A tokenizer with the chatml and llama3 special tokens: the built-in one plus added tokens.
mkdir -p "$W/tok"
python3 - "$SRC/assets/tokenizer/tokenizer.json" "$W/tok/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
n = max(max(t["model"]["vocab"].values()), max(a["id"] for a in t["added_tokens"])) + 1
for s in ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]:
    t["added_tokens"].append({"id": n, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True})
    n += 1
json.dump(t, open(sys.argv[2], "w"), ensure_ascii=False)
PY
cp "$SRC/assets/tokenizer/tokenizer_config.json" "$W/tok/"

for i in $(seq 30); do
  printf '{"instruction": "Name a color %d.", "input": "", "output": "Blue number %d."}\n' "$i" "$i"
  printf '{"instruction": "Add the numbers.", "input": "%d + %d", "output": "%d"}\n' "$i" "$i" $((i + i))
done > "$W/alpaca.jsonl"
for i in $(seq 30); do
  printf '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say %d."}, {"role": "assistant", "content": "%d!"}]}\n' "$i" "$i"
done > "$W/chat.jsonl"
python3 -c '
import json
for i in range(30):
    ids = [(7 * i + k) % 200 + 1 for k in range(12)]
    print(json.dumps({"input_ids": ids, "labels": [-100] * 4 + ids[4:]}))' > "$W/pretok.jsonl"
printf '{"text": "plain text number %d that is long enough to be cut by a short sequence_len."}\n' $(seq 20) > "$W/text.jsonl"

cat > "$W/mix.yaml" <<EOF
tokenizer: tok
datasets:
  - path: alpaca.jsonl
    type: alpaca
  - path: chat.jsonl
    type: chat
    chat_template: llama3
  - path: pretok.jsonl
    type: pretokenized
  - path: text.jsonl
sequence_len: 128
micro_batch_size: 2
max_steps: 2
sample_tokens: 0
val_set_size: 0.1
dataset_prepared_path: $W/prep
output_dir: $W/out
EOF

# preprocess: counts, the cache written, then reused
rm -rf "$W/prep"
"$SNUG" preprocess "$W/mix.yaml" --sequence_len 256 >"$W/p1" 2>&1 || bad "preprocess exit status" "$W/p1"
expect_out preprocess-counts "preprocessed 140 examples" "$W/p1"
expect_out preprocess-alpaca "alpaca.jsonl \(alpaca\): 60 examples" "$W/p1"
expect_out preprocess-chat "chat.jsonl \(chat, llama3\): 30 examples" "$W/p1"
expect_out preprocess-pretok "pretok.jsonl \(pretokenized\): 30 examples, 360 tokens, 240 supervised" "$W/p1"
expect_out preprocess-written "tokenized cache +$W/prep/data-[0-9a-f]{16}\.snugdata \(written\)" "$W/p1"
expect_out preprocess-split "validation 14 examples" "$W/p1"
[ "$(ls "$W/prep" | wc -l)" -eq 1 ] && ok || bad "one cache file in $W/prep: $(ls "$W/prep")"
"$SNUG" preprocess "$W/mix.yaml" --sequence_len 256 >"$W/p2" 2>&1
expect_out preprocess-reused "\(reused, input and options unchanged\)" "$W/p2"

# a corrupt cache file is rebuilt
f=$(ls "$W/prep"/*.snugdata)
printf 'XXXX' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
"$SNUG" preprocess "$W/mix.yaml" --sequence_len 256 >"$W/p3" 2>&1
expect_out cache-corrupt "\(rebuilt: corrupt: checksum mismatch\)" "$W/p3"
"$SNUG" preprocess "$W/mix.yaml" --sequence_len 256 >"$W/p3" 2>&1
expect_out cache-repaired "\(reused" "$W/p3"
# a changed option is another cache file
"$SNUG" preprocess "$W/mix.yaml" --sequence_len 256 --train_on_inputs >"$W/p4" 2>&1
expect_out cache-option "\(written\)" "$W/p4"

# --debug: the first examples token by token with the mask
cat > "$W/chat.yaml" <<EOF
tokenizer: tok
datasets:
  - path: chat.jsonl
    type: chat
dataset_prepared_path: $W/prep
EOF
"$SNUG" preprocess "$W/chat.yaml" --debug >"$W/d1" 2>&1 || bad "preprocess --debug exit status" "$W/d1"
expect_out debug-header "example 1 of 30: [0-9]+ tokens, [0-9]+ supervised" "$W/d1"
expect_out debug-im-start "^ +0 +[0-9]+ +no +\"<\|im_start\|>\"" "$W/d1"
expect_out debug-im-end "yes +\"<\|im_end\|>\"" "$W/d1"
expect_out debug-newline "no +\"\\\\n\"|no +\"Ċ\"" "$W/d1"
[ "$(grep -c '^example ' "$W/d1")" -eq 3 ] && ok || bad "debug shows 3 examples" "$W/d1"

# --dump: every example as input_ids + labels; assistant content and <|im_end|> supervised, nothing else
"$SNUG" preprocess "$W/chat.yaml" --dump "$W/dump.jsonl" >"$W/d2" 2>&1 || bad "preprocess --dump" "$W/d2"
python3 - "$W/dump.jsonl" "$W/tok/tokenizer.json" <<'PY' && ok || bad "dump mask"
import json, sys
tok = json.load(open(sys.argv[2]))
im_end = [a["id"] for a in tok["added_tokens"] if a["content"] == "<|im_end|>"][0]
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 30, len(rows)
for r in rows:
    ids, lab = r["input_ids"], r["labels"]
    sup = [i for i, l in enumerate(lab) if l != -100]
    assert all(lab[i] == ids[i] for i in sup)
    assert ids[sup[-1]] == im_end          # the assistant's end of turn is trained on
    assert ids.count(im_end) == 3 and sum(1 for i in sup if ids[i] == im_end) == 1
    assert sup == list(range(sup[0], sup[-1] + 1))   # one span: the assistant reply
PY

# long examples: counted and reported, truncated or dropped
"$SNUG" preprocess --dataset "$W/text.jsonl" --sequence_len 16 --dataset_prepared_path "$W/prep" >"$W/l1" 2>&1
expect_out long-truncate "20 examples longer than sequence_len 16: truncated" "$W/l1"
printf '{"text": "short"}\n' >> "$W/text.jsonl"
"$SNUG" preprocess --dataset "$W/text.jsonl" --sequence_len 16 --long_examples drop --dataset_prepared_path "$W/prep" >"$W/l2" 2>&1
expect_out long-drop "20 examples longer than sequence_len 16: dropped" "$W/l2"
expect_out long-drop-count "1 examples, " "$W/l2"

# training on the mix: the header reports the data; every format trains
"$SNUG" train "$W/mix.yaml" >"$W/t1" 2>&1 || bad "train on the mix exit status" "$W/t1"
expect_out train-alpaca "data files +.*alpaca.jsonl \(alpaca\): 60 examples, [0-9]+ tokens, [1-9][0-9]* supervised" "$W/t1"
expect_out train-chat "chat.jsonl \(chat, llama3\): 30 examples, [0-9]+ tokens, [1-9][0-9]* supervised" "$W/t1"
expect_out train-step "step +2/2" "$W/t1"
[ -e "$W/out/model.safetensors" ] && ok || bad "train on the mix saved a model"
rm -rf "$W/out"
"$SNUG" train "$W/mix.yaml" --sequence_len 24 --max_steps 1 >"$W/t2" 2>&1 || bad "train, short rows" "$W/t2"
expect_out train-long "60 examples longer than sequence_len 24: truncated \(60 of them keep no supervised token" "$W/t2"

# skip_bad_examples: skipped and reported with the first line numbers
{ printf '{"text": "good one"}\n{"text": \n{"text": "good two"}\n{"txt": "x"}\n'
  printf '{"text": "more good text here"}\n%.0s' $(seq 40); } > "$W/skip.jsonl"
"$SNUG" preprocess --dataset "$W/skip.jsonl" --skip_bad_examples --dataset_prepared_path "$W/prep" >"$W/s1" 2>&1 ||
  bad "skip_bad_examples exit status" "$W/s1"
expect_out skip-report "skipped 2 bad lines \(lines 2, 4\); line 2: invalid JSON" "$W/s1"

# bad data: exit 2, one error line naming the file and the line, nothing written
T="--sequence_len 16 --micro_batch_size 2 --max_steps 1 --sample_tokens 0 --output_dir $W/out --dataset_prepared_path $W/prep"
printf '{"text": "fine"}\n{"text": "broken\n' > "$W/b1.jsonl"
expect_error invalid-json "b1.jsonl line 2: invalid JSON" "$SNUG" train --dataset "$W/b1.jsonl" $T
printf '{"text": "fine"}\n\n{"text": "caf\xe9"}\n' > "$W/b2.jsonl"
expect_error invalid-utf8 "b2.jsonl line 3: invalid UTF-8" "$SNUG" train --dataset "$W/b2.jsonl" $T
printf '{"text": ""}\n' > "$W/b3.jsonl"
expect_error empty "b3.jsonl line 1: .*empty" "$SNUG" train --dataset "$W/b3.jsonl" $T
printf 'datasets:\n  - path: b4.jsonl\n    type: alpaca\n' > "$W/b4.yaml"
printf '{"instruction": "x", "output": "y"}\n{"instruction": "x", "output": 5}\n' > "$W/b4.jsonl"
expect_error alpaca-type "b4.jsonl line 2: the \"output\" field is an integer, not a string" "$SNUG" train "$W/b4.yaml" $T
printf '{"instruction": "x"}\n' > "$W/b4.jsonl"
expect_error alpaca-missing "b4.jsonl line 1: the \"output\" field is missing" "$SNUG" train "$W/b4.yaml" $T
printf 'datasets:\n  - path: b5.jsonl\n    type: pretokenized\n' > "$W/b5.yaml"
printf '{"input_ids": [1, 2, 99999]}\n' > "$W/b5.jsonl"
expect_error id-range "b5.jsonl line 1: input_ids\[2\] is 99999, outside the vocabulary" "$SNUG" train "$W/b5.yaml" $T
printf '{"input_ids": [1, 2, 3], "labels": [1, 2]}\n' > "$W/b5.jsonl"
expect_error lengths "b5.jsonl line 1: \"labels\" has 2 entries but \"input_ids\" has 3" "$SNUG" train "$W/b5.yaml" $T
printf 'datasets:\n  - path: b6.jsonl\n    type: chat\n' > "$W/b6.yaml"
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' > "$W/b6.jsonl"
expect_error no-special "b6.jsonl: chat_template chatml needs the special token <\|im_start\|>" \
  "$SNUG" train "$W/b6.yaml" $T
printf '{"messages": [{"role": "robot", "content": "hi"}]}\n' > "$W/b6.jsonl"
expect_error chat-role "b6.jsonl line 1: messages\[0\].role is \"robot\"" "$SNUG" train "$W/b6.yaml" --tokenizer "$W/tok" $T
printf 'datasets:\n  - path: b8.jsonl\n    type: input_output\n' > "$W/b8.yaml"
printf '{"segments": [{"label": false, "text": "Q"}, {"label": true, "text": "A"}]}\n{"segments": [{"text": "Q"}]}\n' \
  > "$W/b8.jsonl"
expect_error io-label "b8.jsonl line 2: segments\[0\].label is missing; it must be true" "$SNUG" train "$W/b8.yaml" $T
printf '{"segments": [{"label": false, "text": "Q"}, {"label": true, "text": ""}]}\n' > "$W/b8.jsonl"
expect_error io-untrained "b8.jsonl line 1: no segment with \"label\": true and text: nothing to train on" \
  "$SNUG" train "$W/b8.yaml" $T
printf '{"segments": "Q"}\n' > "$W/b8.jsonl"
expect_error io-segments "b8.jsonl line 1: the \"segments\" field is a string; each input_output line must be" \
  "$SNUG" train "$W/b8.yaml" $T
printf 'datasets:\n  - path: b7.jsonl\n    type: chat\n    chat_template: zephyr\n' > "$W/b7.yaml"
expect_error template "chat_template 'zephyr' is not supported yet" "$SNUG" train "$W/b7.yaml" $T
expect_error preprocess-bad "b1.jsonl line 2: invalid JSON" "$SNUG" preprocess --dataset "$W/b1.jsonl" $T

# dataset_exact_deduplication: 6 lines, 3 of them repeats; test_datasets' lines that training has, and their repeats,
# dropped; a validation set left empty refused (after tokenizing: the cache files stay, valid; no output_dir)
printf '{"text": "%s"}\n' "a b c" hello "a b c" zz hello "a b c" > "$W/dup.jsonl"
printf '{"text": "zz"}\n{"text": "new"}\n{"text": "new"}\n' > "$W/dupv.jsonl"
"$SNUG" train --dataset "$W/dup.jsonl" --test_datasets "$W/dupv.jsonl" --tokenizer "$SRC/assets/tokenizer" $T \
  --dataset_exact_deduplication true > "$W/dup.log" 2>&1 || bad dedup "$W/dup.log"
expect_out dedup-train "data +3 examples, .* \(validation: 1 examples\)" "$W/dup.log"
expect_out dedup-count "3 duplicate examples removed \(dataset_exact_deduplication\)" "$W/dup.log"
expect_out dedup-val "2 duplicate examples removed \(dataset_exact_deduplication\)" "$W/dup.log"
printf '{"text": "zz"}\n{"text": "hello"}\n' > "$W/dupv.jsonl"
rm -rf "$W/out"
"$SNUG" train --dataset "$W/dup.jsonl" --test_datasets "$W/dupv.jsonl" --tokenizer "$SRC/assets/tokenizer" $T \
  --dataset_exact_deduplication true > "$W/dup2.log" 2>&1
[ $? -eq 2 ] && [ ! -e "$W/out" ] && grep -q "every example of test_datasets is also a training example" \
  "$W/dup2.log" &&
  ok || bad dedup-empty "$W/dup2.log"

finish
