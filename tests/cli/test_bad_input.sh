#!/usr/bin/env bash
# Bad input gets one clear error line naming the file and the place, exit status 2, and nothing in output_dir.
. "$(dirname "$0")/lib.sh"

# expect_error NAME PATTERN CMD...: exit status 2, one "snug: error:" line on stderr matching PATTERN, no crash
expect_error() {
  local name=$1 pattern=$2; shift 2
  rm -rf "$W/out"
  "$@" >"$W/stdout" 2>"$W/stderr"
  local rc=$? lines
  lines=$(grep -c "snug: error:" "$W/stderr")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -Eq -- "$pattern" "$W/stderr" && [ ! -e "$W/out" ]; then
    ok
  else
    bad "$name: rc=$rc, error lines=$lines, out exists: $([ -e "$W/out" ] && echo yes || echo no)" "$W/stderr"
  fi
}

printf '{"text": "hello world, this is a small dataset line that repeats."}\n%.0s' $(seq 200) > "$W/data.jsonl"
T="--tokenizer $SRC/assets/tokenizer --sequence_len 16 --micro_batch_size 2 --sample_tokens 0 --output_dir $W/out"

# a valid model folder to corrupt
"$SNUG" train --dataset "$W/data.jsonl" $T --max_steps 1 --output_dir "$W/model" >/dev/null 2>&1 || fatal "cannot make a model"

# configuration
expect_error missing-config "nope.yaml" "$SNUG" train "$W/nope.yaml"
printf 'learning_rate: 1e-3\nmicro_batch_size: [1,\n' > "$W/broken.yaml"
expect_error yaml-syntax "broken.yaml line [0-9]+ column [0-9]+" "$SNUG" train "$W/broken.yaml"
printf 'learning_rat: 1e-3\n' > "$W/typo.yaml"
expect_error unknown-key "learning_rat.*typo.yaml line 1.*learning_rate" "$SNUG" train "$W/typo.yaml"
printf 'micro_batch_size: four\n' > "$W/type.yaml"
expect_error wrong-type "type.yaml line 1: micro_batch_size must be an integer" "$SNUG" train "$W/type.yaml"
printf 'datasets:\n  - path: data.jsonl\ntf32: true\n' > "$W/later.yaml"
expect_error not-supported "tf32.*not supported yet" "$SNUG" train "$W/later.yaml"
expect_error fp16-no-master "fp16 without master_weights" "$SNUG" train --dataset "$W/data.jsonl" $T --fp16 true --master_weights false
expect_error device-name "device must be one of auto, cpu, cuda" "$SNUG" train --dataset "$W/data.jsonl" $T --device tpu
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then # no GPU here: device: cuda is an error
  expect_error device-cuda "device: cuda" "$SNUG" train --dataset "$W/data.jsonl" $T --device cuda
fi
# ddp_backend (Hugging Face's key): nccl needs CUDA ranks, so on the CPU it is refused, whether the CPU was asked for
# or device: auto found no GPU (hidden here); an unknown value, or a backend not built, names the choices
expect_error ddp-nccl-cpu "ddp_backend is nccl but device is cpu.*ddp_backend: mpi" "$SNUG" train --dataset "$W/data.jsonl" $T --device cpu --ddp_backend nccl
printf 'datasets:\n  - path: data.jsonl\nddp_backend: nccl\n' > "$W/nccl.yaml"
expect_error ddp-nccl-auto "ddp_backend is nccl but this run trains on the CPU \\(device: auto, and no GPU is visible\\)" env CUDA_VISIBLE_DEVICES= "$SNUG" train "$W/nccl.yaml" $T
expect_error ddp-backend-name "ddp_backend must be one of auto, nccl, mpi, got 'nccll'" "$SNUG" train --dataset "$W/data.jsonl" $T --ddp_backend nccll
expect_error ddp-backend-later "ddp_backend 'gloo' is not supported yet; use auto, nccl, mpi" "$SNUG" train --dataset "$W/data.jsonl" $T --ddp_backend gloo
expect_error cli-unknown "lerning_rate.*learning_rate" "$SNUG" train --dataset "$W/data.jsonl" --lerning_rate 1
expect_error no-dataset "dataset" "$SNUG" train --datasets "$W/missing.jsonl" $T
expect_error in-backward-clip "optimizer_in_backward.*max_grad_norm: 0" "$SNUG" train --dataset "$W/data.jsonl" $T --optimizer_in_backward true
expect_error in-backward-accumulate "optimizer_in_backward.*gradient_accumulation_steps: 1" "$SNUG" train --dataset "$W/data.jsonl" $T --optimizer_in_backward true --max_grad_norm 0 --gradient_accumulation_steps 2
expect_error too-big "memory plan needs .* this machine has .*snug plan" "$SNUG" train --dataset "$W/data.jsonl" $T --model_preset gpt2-124m --micro_batch_size 4096 --sequence_len 1024
# data
printf '{"text": "fine"}\n{"text": "broken\n' > "$W/bad.jsonl"
expect_error jsonl-syntax "bad.jsonl line 2" "$SNUG" train --dataset "$W/bad.jsonl" $T
printf '{"text": "fine"}\n{"txt": "x"}\n' > "$W/field.jsonl"
expect_error jsonl-field "field.jsonl line 2.*missing" "$SNUG" train --dataset "$W/field.jsonl" $T

# model folders
bad_model() { rm -rf "$W/bm"; cp -r "$W/model" "$W/bm"; }
bad_model; rm "$W/bm/config.json"
expect_error no-config "bm/config.json" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; printf '{"model_type": "llama", "hidden_size": 64' > "$W/bm/config.json"
expect_error corrupt-config "bm/config.json" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; python3 - "$W/bm/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_attention_heads"] = 7; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error heads "num_attention_heads" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; head -c 1000 "$W/model/model.safetensors" > "$W/bm/model.safetensors"
expect_error truncated "model.safetensors" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; python3 - "$W/bm/model.safetensors" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); b[0:8] = struct.pack("<Q", len(b) * 2)
open(sys.argv[1], "wb").write(b)
PY
expect_error header-length "model.safetensors" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; python3 - "$W/bm/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); name = sorted(k for k in h if k != "__metadata__")[0]
s, e = h[name]["data_offsets"]; b[8 + n + s:8 + n + s + 4] = struct.pack("<f", float("nan"))
open(sys.argv[1], "wb").write(b)
PY
expect_error nan "model.safetensors.*(NaN|nan|non-finite|infinite)" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; python3 - "$W/bm/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); name = [k for k in h if k.endswith("k_proj.weight")][0]
h[name]["shape"] = [h[name]["shape"][1], h[name]["shape"][0]]
hb = json.dumps(h).encode(); hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect_error shape "k_proj.weight.*shape" "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T

# out-of-range numbers found by fuzzing: each once overflowed an int, read past a table, crashed, or trained NaN
cfgset() { # cfgset KEY VALUE: the model folder's config.json with KEY set
  bad_model; python3 - "$W/bm/config.json" "$1" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c[sys.argv[2]] = json.loads(sys.argv[3]); json.dump(c, open(sys.argv[1], "w"))
PY
}
for kv in "intermediate_size 1073741824" "num_hidden_layers 65536" "vocab_size 2147483647" "hidden_size 2147483640"; do
  set -- $kv
  cfgset "$1" "$2"
  expect_error "config-$1" "bm/config.json: $1 is $2; snug plans and trains models with $1 up to" \
    "$SNUG" plan --base_model "$W/bm" --sequence_len 16
done
cfgset rope_theta 1e-300
expect_error rope-theta "bm/config.json: rope_theta is 1e-300; it must be at least 1" \
  "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
cfgset rope_scaling '{"rope_type": "linear", "factor": 1e-300}'
expect_error rope-factor "bm/config.json: rope_scaling.factor is 1e-300; it must be at least 1" \
  "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
expect_error threads "threads is 100000; use 0 \(all cores\) or a count up to 1024" \
  "$SNUG" train --dataset "$W/data.jsonl" $T --threads 100000
expect_error accumulation "gradient_accumulation_steps is 2147483647; use 1 to 1048576" \
  "$SNUG" train --dataset "$W/data.jsonl" $T --gradient_accumulation_steps 2147483647
expect_error val-huge "val_set_size 1e\+30 leaves no training examples" \
  "$SNUG" train --dataset "$W/data.jsonl" $T --val_set_size 1e30
: > "$W/empty.jsonl"
expect_error empty-dataset "empty.jsonl: the file has no examples" "$SNUG" train --dataset "$W/empty.jsonl" $T
# a folder where the weights or the configuration go; a shard index naming something that is not a file of the folder
bad_model; rm "$W/bm/model.safetensors"; mkdir "$W/bm/model.safetensors"
expect_error weights-folder "bm/model.safetensors: not a regular file \(a folder\)" \
  "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; rm "$W/bm/config.json"; mkdir "$W/bm/config.json"
expect_error config-folder "bm/config.json is a folder where a file was expected" \
  "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
bad_model; mv "$W/bm/model.safetensors" "$W/bm/model-00001-of-00001.safetensors"
python3 - "$W/bm" <<'PY'
import json, struct, sys
d = sys.argv[1]
h = open(f"{d}/model-00001-of-00001.safetensors", "rb").read()
names = [k for k in json.loads(h[8:8 + struct.unpack("<Q", h[:8])[0]]) if k != "__metadata__"]
wm = {k: "model-00001-of-00001.safetensors" for k in names}
wm[names[0]] = ".."
json.dump({"metadata": {}, "weight_map": wm}, open(f"{d}/model.safetensors.index.json", "w"))
PY
expect_error shard-name 'weight_map puts tensor .* in "\.\.", which is not a file name of the model folder' \
  "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
# a FIFO where the weights go: refused at once (opening it would wait for a writer forever)
bad_model; rm "$W/bm/model.safetensors"; mkfifo "$W/bm/model.safetensors"
expect_error weights-fifo "bm/model.safetensors: not a regular file \(a device, pipe or socket\)" \
  timeout 60 "$SNUG" train --dataset "$W/data.jsonl" --base_model "$W/bm" $T
# tokenizers that misbehave on a line: a regex that backtracks without end is bad input naming the file and line; a
# line that encodes to no tokens at all (a Strip normalizer on blanks) is an example like any other, not a crash
tokset() { # tokset NAME JSON: the tokenizer with normalizer JSON, in $W/NAME
  rm -rf "$W/$1"; cp -r "$SRC/assets/tokenizer" "$W/$1"
  python3 - "$W/$1/tokenizer.json" "$2" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); t["normalizer"] = json.loads(sys.argv[2]); json.dump(t, open(sys.argv[1], "w"))
PY
}
tokset tk_regex '{"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": "x"}'
python3 -c "import json; print(json.dumps({'text': 'a' * 5000 + 'b'}))" > "$W/aaa.jsonl"
expect_error regex-limit "aaa.jsonl line 1: tokenizer.json: a regex of its normalizer or pre_tokenizer gives up" \
  "$SNUG" train --dataset "$W/aaa.jsonl" $T --tokenizer "$W/tk_regex" --max_steps 1
tokset tk_strip '{"type": "Strip", "left": true, "right": true}'
printf '{"text": "fine line"}\n{"text": "   "}\n' > "$W/blank.jsonl"
rm -rf "$W/out"
"$SNUG" train --dataset "$W/blank.jsonl" $T --tokenizer "$W/tk_strip" --max_steps 1 > "$W/stdout" 2> "$W/stderr"
rc=$?
if [ $rc -eq 0 ] || { [ $rc -eq 2 ] && [ "$(grep -c 'snug: error:' "$W/stderr")" -eq 1 ]; }; then ok; else
  bad "a line of no tokens: exit $rc" "$W/stderr"; fi
# a loss that is no number (a learning rate that blows the weights up) stops the run naming the fix, with no NaN model
rm -rf "$W/out"
"$SNUG" train --dataset "$W/data.jsonl" $T --max_steps 20 --learning_rate 1e30 > "$W/stdout" 2> "$W/stderr"
if [ $? -eq 2 ] && grep -Eq "step [0-9]+: the loss is -?nan: training diverged.*lower learning_rate" "$W/stderr" &&
   [ ! -e "$W/out/model.safetensors" ]; then ok; else
  bad "diverged: $(tail -1 "$W/stderr")"; fi
# a dataset read from a pipe (its size unknown until read): trained, not taken for an empty file
rm -rf "$W/out"
if "$SNUG" train --dataset <(cat "$W/data.jsonl") $T --max_steps 1 > "$W/stdout" 2>&1 && [ -f "$W/out/model.safetensors" ]
then ok; else bad "pipe: $(tail -1 "$W/stdout")"; fi

finish
