#!/usr/bin/env bash
# LoRA and QLoRA runs end to end (QLoRA's base 4-bit, or 8-bit: load_in_8bit), with the levers. Checkpointing
# (selective, full, every 2 layers, offloaded) gives bit for bit the losses and adapters of the run without it, for LoRA
# in fp32 and bf16 and for QLoRA, and so do a tiled MLP in one shard and the optimizer step inside backward; gradient
# accumulation matches to fp32 rounding, and a tiled MLP in several shards (with dropout too) to within four times that
# rounding floor; 8-bit and paged AdamW and packing train; the plan equals every arena's measured peak; the output
# folder is a PEFT adapter (no base weights), which `snug generate` samples from and `merge_lora` merges into
# output_dir/merged; a run from an adapter (lora_model_dir) takes every adapter setting from it and says which of the
# configuration's it overrode; an unknown target module, a 4-bit base without an adapter, and lora_modules_to_save naming another
# module or on tied embeddings are refused with exit 2.
. "$(dirname "$0")/lib.sh"
# One GEMM path for every run: where the CPU has AVX512-BF16 and oneDNN is installed, bf16 GEMMs choose oneDNN or
# OpenBLAS by timing each shape, so a tiled MLP's shorter GEMMs could take the other path than the run it is compared
# with, and near()'s premise (the same sums in another order) would not hold (seen: qlora_tiled 4.2e-05 from qlora
# against a floor of 3.9e-06 on a Zen 4 with oneDNN; within it with the path fixed). test_cpu_gemm tests the choice.
export SNUG_CPU_GEMM=${SNUG_CPU_GEMM:-openblas}
quick=${SNUG_SANITIZED:-0}
head -n 2000 "$SRC/data/fortunes.jsonl" > "$W/data.jsonl"
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sequence_len 48 --micro_batch_size 4
        --sample_tokens 0 --learning_rate 5e-3 --logging_steps 1 --max_steps 6 --val_set_size 0
        --dataset_prepared_path $W/prepared --lora_target_linear true --lora_r 4"

run() { # NAME ARGS: a run into $W/NAME
  local name=$1; shift
  "$SNUG" train $common "$@" --output_dir "$W/$name" > "$W/$name.log" 2>&1 || { bad "$name: $(tail -2 "$W/$name.log")"; return 1; }
}

# same A B [exact|close]: the logged losses and the saved adapters of two runs
same() {
  if python3 - "$W/$1" "$W/$2" "${3:-exact}" <<'PY'
import json, sys
a, b, mode = sys.argv[1:4]
la, lb = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")] for d in (a, b))
if mode == "exact":
    wa, wb = (open(d + "/adapter_model.safetensors", "rb").read() for d in (a, b))
    ok = la == lb and wa == wb
else:  # accumulation sums the same examples in another order: fp32 rounding apart
    ok = len(la) == len(lb) and max(abs(x - y) / abs(y) for x, y in zip(la, lb)) < 1e-4
print(f"  {a.split('/')[-1]:<18} vs {b.split('/')[-1]:<14} {'same' if ok else 'DIFFERENT'} ({mode})")
sys.exit(0 if ok else 1)
PY
  then ok; else bad "$1 differs from $2"; fi
}

# near A B FA FB: the losses of A and B as close as four times those of FA and FB, a pair whose only difference is
# the order of the same sums (accumulation): the rounding noise of this precision, measured here
near() {
  if python3 - "$W/$1" "$W/$2" "$W/$3" "$W/$4" <<'PY'
import json, sys
L = [[json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:5]]
gap = lambda x, y: max(abs(p - q) / abs(q) for p, q in zip(x, y)) if len(x) == len(y) else float("inf")
g, floor = gap(L[0], L[1]), gap(L[2], L[3])
ok = g <= 4 * max(floor, 1e-7)
print(f"  {sys.argv[1].split('/')[-1]:<18} vs {sys.argv[2].split('/')[-1]:<14} {'near' if ok else 'FAR'} "
      f"(loss gap {g:.1e}, rounding floor {floor:.1e})")
sys.exit(0 if ok else 1)
PY
  then ok; else bad "$1 is farther from $2 than rounding"; fi
}

# plan = measured, from memory.json
planned() {
  if python3 - "$W/$1/memory.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
sys.exit(0 if m["plan"] == m["measured"] and m["plan"]["adapter weights"] > 0 else 1)
PY
  then ok; else bad "$1: the plan differs from the measured peaks: $(head -c 400 "$W/$1/memory.json")"; fi
}

run lora --adapter lora && planned lora
for ck in selective full offload; do
  run "lora_$ck" --adapter lora --gradient_checkpointing "$ck" && same "lora_$ck" lora
done
run lora_every2 --adapter lora --gradient_checkpointing full --gradient_checkpointing_every_n_layers 2 && same lora_every2 lora
run lora_ga --adapter lora --micro_batch_size 2 --gradient_accumulation_steps 2 && same lora_ga lora close
run lora_bf16 --adapter lora --bf16 true && planned lora_bf16
run lora_bf16_full --adapter lora --bf16 true --gradient_checkpointing full && same lora_bf16_full lora_bf16
run qlora --adapter qlora && planned qlora
run qlora_full --adapter qlora --gradient_checkpointing full && same qlora_full qlora
# offload_params: the 4-bit base in host memory, each layer's copied into one of two device buffers before it runs
# (the next while it does): the same bits; the parameters arena keeps only the two buffers, the 4-bit bytes are
# in the offload arena, as planned
offloaded() { # OFF WHOLE: the parameters arena smaller, the base in the offload arena
  python3 - "$W/$1/memory.json" "$W/$2/memory.json" <<'PY' && ok || bad "$1: the arenas against $2's"
import json, sys
off, whole = (json.load(open(p))["plan"] for p in sys.argv[1:3])
assert whole["offloaded to host"] == 0 and off["offloaded to host"] > 0, (off, whole)
assert off["parameters"] < whole["parameters"] <= off["parameters"] + off["offloaded to host"], (off, whole)
PY
}
run qlora_off --adapter qlora --offload_params true && same qlora_off qlora && planned qlora_off &&
  offloaded qlora_off qlora
grep -q "offload_params  *the 4-bit base in host memory" "$W/qlora_off.log" && ok || bad "qlora_off: no header line"
run qlora_off_full --adapter qlora --offload_params true --gradient_checkpointing full && same qlora_off_full qlora
# and LoRA's frozen base (fp32 and bf16): laid out as ZeRO-3 lays it out, the whole table this process's shard in host
# memory, each layer copied into the gather region as it runs
run lora_off --adapter lora --offload_params true && same lora_off lora && planned lora_off && offloaded lora_off lora
run lora_bf16_off --adapter lora --bf16 true --offload_params true --gradient_checkpointing full &&
  same lora_bf16_off lora_bf16 && planned lora_bf16_off && offloaded lora_bf16_off lora_bf16
grep -q "offload_params  *the frozen base in host memory" "$W/lora_off.log" && ok || bad "lora_off: no header line"
# the end-of-run sample reads the offloaded base from host memory: the sample of the run without it
run qlora_sample --adapter qlora --max_steps 2 --sample_tokens 12 --sample_prompt hello &&
  run qlora_off_sample --adapter qlora --max_steps 2 --sample_tokens 12 --sample_prompt hello --offload_params true &&
  [ -n "$(grep -A1 '^sample (' "$W/qlora_sample.log" | tail -1)" ] &&
  [ "$(grep -A1 '^sample (' "$W/qlora_sample.log" | tail -1)" = "$(grep -A1 '^sample (' "$W/qlora_off_sample.log" | tail -1)" ] &&
  ok || bad "qlora_off_sample: not the sample without offload_params: $(grep -A1 '^sample (' "$W/qlora_off_sample.log")"
# a tiled MLP: in one shard the same arithmetic (bit for bit); in several, GEMMs over fewer rows, so as close as
# rounding; planned as allocated
# the step inside backward: each layer's adapters stepped as its backward ends, bit for bit the step after backward
run lora_noclip --adapter lora --max_grad_norm 0
run lora_oib --adapter lora --max_grad_norm 0 --optimizer_in_backward true && same lora_oib lora_noclip
run qlora_tiled1 --adapter qlora --tiled_mlp true --tiled_mlp_num_shards 1 && same qlora_tiled1 qlora
run qlora_ga --adapter qlora --micro_batch_size 2 --gradient_accumulation_steps 2
run lora_tiled --adapter lora --tiled_mlp true --tiled_mlp_num_shards 3 && near lora_tiled lora lora_ga lora &&
  planned lora_tiled
run qlora_tiled --adapter qlora --gradient_checkpointing full --tiled_mlp true --tiled_mlp_num_shards 5 &&
  near qlora_tiled qlora qlora_ga qlora && planned qlora_tiled
# load_in_8bit: LoRA on the base stored as LLM.int8's codes and row scales (in bf16 otherwise); the levers give the
# bits of the run without them; the parameters arena holds 1 byte and a bit per block weight, between QLoRA's 4-bit
# and bf16's 2 bytes
q8="--adapter lora --load_in_8bit true"
run q8 $q8 && planned q8
run q8_full $q8 --gradient_checkpointing full && same q8_full q8
run q8_off $q8 --offload_params true && same q8_off q8 && planned q8_off && offloaded q8_off q8
grep -q "offload_params  *the 8-bit base in host memory" "$W/q8_off.log" && ok || bad "q8_off: no header line"
run q8_tiled1 $q8 --tiled_mlp true --tiled_mlp_num_shards 1 && same q8_tiled1 q8
python3 - "$W" <<'PY' && ok || bad "the parameters arena of the 8-bit base is not between QLoRA's and bf16's"
import json, sys
p = {k: json.load(open(f"{sys.argv[1]}/{k}/memory.json"))["plan"]["parameters"] for k in ("qlora", "q8", "lora_bf16")}
print(f"  parameters arena: QLoRA {p['qlora']} B, 8-bit {p['q8']} B, bf16 {p['lora_bf16']} B")
sys.exit(0 if p["qlora"] < p["q8"] < p["lora_bf16"] else 1)
PY
if [ "$quick" != 1 ]; then
  run q8_dora $q8 --peft_use_dora true && planned q8_dora
  run lora_8bit --adapter lora --optimizer adamw_8bit --sample_packing true && planned lora_8bit
  run lora_paged --adapter lora --optimizer paged_adamw_32bit && same lora_paged lora
  run qlora_fp4 --adapter qlora --bnb_4bit_quant_type fp4 --bnb_4bit_use_double_quant false && planned qlora_fp4
  run lora_drop --adapter lora --lora_dropout 0.2 && planned lora_drop
  # the dropout mask of a row is the same in whichever shard it runs
  run lora_drop_tiled --adapter lora --lora_dropout 0.2 --tiled_mlp true --tiled_mlp_num_shards 3 &&
    near lora_drop_tiled lora_drop lora_ga lora
fi

# the output folder is the adapter: no base weights beside it, adapter_config.json names the base
if [ -f "$W/lora/adapter_config.json" ] && [ -f "$W/lora/adapter_model.safetensors" ] && [ ! -f "$W/lora/model.safetensors" ] &&
   grep -q '"peft_type": "LORA"' "$W/lora/adapter_config.json"; then ok; else bad "lora output: $(ls "$W/lora")"; fi
grep -q "qlora\|QLoRA\|4-bit" "$W/qlora.log" && grep -q "PEFT adapter" "$W/qlora.log" && ok || bad "qlora log: $(grep -i saved "$W/qlora.log")"
# the header says what the adapters are: r, alpha, dropout, PEFT's target names, and the trainable count, which is
# the number of floats the saved adapter holds
nst=$(python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); h=json.loads(f.read(struct.unpack("<Q",f.read(8))[0]))
import math; print(sum(math.prod(v["shape"]) for k,v in h.items() if k!="__metadata__"))' "$W/lora/adapter_model.safetensors")
grep -Eq "^  adapter +LoRA r=4, alpha 4 \(scale 1\), dropout 0, targets q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; $nst \(" "$W/lora.log" &&
  grep -Eq "^  adapter +LoRA on the 4-bit base, r=4" "$W/qlora.log" && ok ||
  bad "the adapter's header line (the saved adapter holds $nst floats): $(grep '^  adapter ' "$W/lora.log" "$W/qlora.log")"

# a base folder to adapt, merge into and generate from
"$SNUG" train $common --max_steps 2 --output_dir "$W/base" > "$W/base.log" 2>&1 || bad "base: $(tail -2 "$W/base.log")"
# an 8-bit run merges into the base's 8-bit round trip: what `snug merge --base_as int8` writes, not the plain merge
if run q8_merged $q8 --base_model "$W/base" --merge_lora true; then
  grep -q "its 8-bit round trip" "$W/q8_merged.log" &&
    "$SNUG" merge "$W/base" "$W/q8_merged" "$W/q8_by_hand" --base_as int8 > /dev/null 2>&1 &&
    "$SNUG" merge "$W/base" "$W/q8_merged" "$W/q8_plain" > /dev/null 2>&1 &&
    cmp -s "$W/q8_merged/merged/model.safetensors" "$W/q8_by_hand/model.safetensors" &&
    ! cmp -s "$W/q8_merged/merged/model.safetensors" "$W/q8_plain/model.safetensors" && ok ||
    bad "q8_merged: not merged into the 8-bit round trip"
fi
if run merged --adapter lora --base_model "$W/base" --merge_lora true; then
  [ -f "$W/merged/merged/config.json" ] && [ -f "$W/merged/merged/model.safetensors" ] && ok || bad "merge_lora wrote $(ls "$W/merged")"
  "$SNUG" generate "$W/merged" --prompt "The" --max_new_tokens 5 > "$W/gen.log" 2>&1 && ok || bad "generate ADAPTER: $(tail -2 "$W/gen.log")"
  "$SNUG" generate "$W/base" --adapter "$W/merged" --prompt "The" --max_new_tokens 5 --temperature 0 > "$W/gen2.log" 2>&1 &&
    "$SNUG" generate "$W/merged/merged" --prompt "The" --max_new_tokens 5 --temperature 0 > "$W/gen3.log" 2>&1 &&
    cmp -s "$W/gen2.log" "$W/gen3.log" && ok || bad "greedy text with --adapter differs from the merged model's: $(cat "$W/gen2.log" "$W/gen3.log")"
fi

# lora_modules_to_save on an untied copy of the base (lm_head a copy of the embedding, plain safetensors): both tables
# train in full in the adapter (PEFT's names), planned as allocated, and generation reads the trained copies
. "$SRC/tests/cli/untie.sh"
untie "$W/base" "$W/untied" || bad "the untied copy of the base"
if run saved_mods --adapter lora --base_model "$W/untied" --lora_modules_to_save embed_tokens,lm_head --bf16 true; then
  planned saved_mods
  python3 - "$W/saved_mods" <<'PY' && ok || bad "saved_mods: the adapter lacks the trained modules"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/adapter_config.json"))
blob = open(d + "/adapter_model.safetensors", "rb").read()
names = json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]])
ok = cfg["modules_to_save"] == ["embed_tokens", "lm_head"] and \
    {"base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"} <= set(names)
sys.exit(0 if ok else 1)
PY
  "$SNUG" generate "$W/untied" --adapter "$W/saved_mods" --prompt "The" --max_new_tokens 5 > "$W/gen4.log" 2>&1 && ok ||
    bad "generate with trained modules: $(tail -2 "$W/gen4.log")"
fi

# DoRA: the run starts as the base (the magnitudes its row norms: every gain exactly 1, so the first loss is LoRA's
# first, the base's) and learns; the levers give the bits of the run without them (checkpointing, offload_params, the
# step inside backward, a tiled MLP in one shard) in fp32, bf16 and on the 4-bit base, planned as allocated; the
# adapter holds each module's lora_magnitude_vector and says use_dora; merged, it gives the greedy text of the
# adapter beside its base
starts() { # A B: A's first loss is B's, and A's loss falls
  if python3 - "$W/$1" "$W/$2" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:3])
na, nb = (p.split('/')[-1] for p in sys.argv[1:3])
print(f"  {na:<18} first loss {a[0]:.6f} ({nb}: {b[0]:.6f}), last {a[-1]:.4f}")
sys.exit(0 if a[0] == b[0] and a[-1] < a[0] else 1)
PY
  then ok; else bad "$1 does not start as $2 or does not learn"; fi
}
dora="--adapter lora --peft_use_dora true"
run dora $dora && planned dora && starts dora lora
run dora_full $dora --gradient_checkpointing full && same dora_full dora
run dora_off $dora --offload_params true && same dora_off dora && planned dora_off
run dora_tiled1 $dora --tiled_mlp true --tiled_mlp_num_shards 1 && same dora_tiled1 dora
run dora_noclip $dora --max_grad_norm 0 && run dora_oib $dora --max_grad_norm 0 --optimizer_in_backward true &&
  same dora_oib dora_noclip
run dora_bf16 $dora --bf16 true && planned dora_bf16 && starts dora_bf16 lora_bf16
run dora_bf16_sel $dora --bf16 true --gradient_checkpointing selective && same dora_bf16_sel dora_bf16
run qdora --adapter qlora --peft_use_dora true && planned qdora && starts qdora qlora
run qdora_off --adapter qlora --peft_use_dora true --offload_params true --gradient_checkpointing full &&
  same qdora_off qdora && planned qdora_off
python3 - "$W/dora" <<'PY' && ok || bad "dora: the adapter lacks its magnitudes or use_dora"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/adapter_config.json"))
blob = open(d + "/adapter_model.safetensors", "rb").read()
head = json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]])
mags = [k for k in head if k.endswith(".lora_magnitude_vector")]
lay0 = [k for k in mags if ".layers.0." in k]
sys.exit(0 if cfg.get("use_dora") is True and len(lay0) == 7 and all(len(head[k]["shape"]) == 1 for k in mags) else 1)
PY
# a DoRA adapter as the start of another run (lora_model_dir): that run is DoRA too (use_dora, the magnitudes saved)
run dora_more --adapter lora --lora_model_dir "$W/dora" --max_steps 2 &&
  grep -q '"use_dora": true' "$W/dora_more/adapter_config.json" && grep -q "lora_magnitude_vector" \
  "$W/dora_more/adapter_model.safetensors" && ok || bad "dora_more: $(tail -1 "$W/dora_more.log")"
if run dora_merged $dora --base_model "$W/base" --merge_lora true; then
  "$SNUG" generate "$W/base" --adapter "$W/dora_merged" --prompt "The" --max_new_tokens 8 --temperature 0 \
    > "$W/gen5.log" 2>&1 &&
    "$SNUG" generate "$W/dora_merged/merged" --prompt "The" --max_new_tokens 8 --temperature 0 > "$W/gen6.log" 2>&1 &&
    cmp -s "$W/gen5.log" "$W/gen6.log" && ok ||
    bad "DoRA: greedy text with --adapter differs from the merged model's: $(cat "$W/gen5.log" "$W/gen6.log")"
fi
# with dropout: a row's mask is the same in whichever shard of a tiled MLP it runs, and in a checkpointed layer's
# recomputation
run dora_drop $dora --lora_dropout 0.2 && planned dora_drop &&
  run dora_drop_full $dora --lora_dropout 0.2 --gradient_checkpointing full && same dora_drop_full dora_drop &&
  run dora_drop_tiled $dora --lora_dropout 0.2 --tiled_mlp true --tiled_mlp_num_shards 3 &&
  near dora_drop_tiled dora_drop lora_ga lora
# adapters on some layers only: planned as allocated, the adapter holds those layers' tensors and names them in
# layers_to_transform, and a run from it (lora_model_dir) takes its layers; a layer the model lacks is refused
run layers13 --adapter lora --lora_layers_to_transform 1,3 --peft_layers_pattern layers && planned layers13 &&
  python3 - "$W/layers13" <<'PY' && ok || bad "layers13: the adapter's layers"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/adapter_config.json"))
blob = open(d + "/adapter_model.safetensors", "rb").read()
names = json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]])
layers = {int(k.split(".layers.")[1].split(".")[0]) for k in names if ".layers." in k}
sys.exit(0 if cfg["layers_to_transform"] == [1, 3] and layers == {1, 3} else 1)
PY
run layers13_more --adapter lora --lora_model_dir "$W/layers13" --max_steps 2 &&
  grep -q "layers_to_transform" "$W/layers13_more/adapter_config.json" && ok ||
  bad "layers13_more: $(tail -1 "$W/layers13_more.log")"
# an adapter as the start of a run (lora_model_dir): every adapter setting comes from its adapter_config.json, as PEFT
# and Axolotl take them (r, alpha and dropout here), whatever the configuration says; the header says so and names the
# configuration's values it overrode; the run is planned with the adapter's dropout, and saves the adapter's settings
if run drop4 --adapter lora --lora_alpha 8 --lora_dropout 0.1 --max_steps 2; then
  printf 'adapter: lora\nlora_r: 8\nlora_alpha: 16\nlora_dropout: 0.0\nlora_model_dir: %s\n' "$W/drop4" > "$W/from4.yml"
  "$SNUG" train "$W/from4.yml" ${common/--lora_r 4/} --max_steps 2 --output_dir "$W/from4" > "$W/from4.log" 2>&1 &&
    grep -q "LoRA r=4, alpha 8 (scale 2), dropout 0.1, targets .*every setting from the adapter (lora_model_dir's \
adapter_config.json), over the config's lora_r 8, lora_alpha 16, lora_dropout 0$" "$W/from4.log" && planned from4 &&
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1] + "/adapter_config.json"))
sys.exit(0 if (c["r"], c["lora_alpha"], c["lora_dropout"]) == (4, 8, 0.1) else 1)' "$W/from4" && ok ||
    bad "from4: the adapter's r 4, alpha 8, dropout 0.1 over the config's: $(grep -E 'adapter  |error' "$W/from4.log")"
fi
"$SNUG" train $common --adapter lora --lora_layers_to_transform 1,9 --output_dir "$W/l9" > "$W/l9.log" 2>&1
[ $? -eq 2 ] && grep -q "lora_layers_to_transform names '9'" "$W/l9.log" && grep -q "0 to 3" "$W/l9.log" && ok ||
  bad "a layer the model lacks: $(tail -1 "$W/l9.log")"
"$SNUG" train $common --adapter lora --peft_layers_pattern blocks --output_dir "$W/lp9" > "$W/lp9.log" 2>&1
[ $? -eq 2 ] && grep -q "peft_layers_pattern is 'blocks', but this model's blocks are in 'layers'" "$W/lp9.log" && ok ||
  bad "another layers_pattern: $(tail -1 "$W/lp9.log")"
# LoRA+: the header says what steps faster and that no weight decay applies; refused without an adapter
run loraplus $dora --loraplus_lr_ratio 16 --weight_decay 0.1 &&
  grep -q "LoRA+ *lora_B and the magnitudes at 16 x the learning rate; no weight decay" "$W/loraplus.log" && ok ||
  bad "loraplus: no LoRA+ line: $(grep -i lora "$W/loraplus.log" | head -3)"
"$SNUG" train $common --loraplus_lr_ratio 16 --output_dir "$W/lp" > "$W/lp.log" 2>&1
[ $? -eq 2 ] && grep -q "loraplus_lr_ratio is set but adapter is none" "$W/lp.log" && ok ||
  bad "loraplus alone: $(tail -1 "$W/lp.log")"
# refused: DoRA without an adapter
for args in "--peft_use_dora true:adapter: lora"; do
  "$SNUG" train $common ${args%%:*} --output_dir "$W/d" > "$W/d.log" 2>&1
  [ $? -eq 2 ] && grep -q "peft_use_dora" "$W/d.log" && grep -q "${args#*:}" "$W/d.log" && ok ||
    bad "${args%%:*}: $(tail -1 "$W/d.log")"
done

# refused: a module the model does not have; 4-bit weights without an adapter
"$SNUG" train $common --adapter lora --lora_target_modules query_key_value --output_dir "$W/x" > "$W/x.log" 2>&1
[ $? -eq 2 ] && grep -q "query_key_value" "$W/x.log" && grep -q "q_proj" "$W/x.log" && ok || bad "unknown module: $(tail -1 "$W/x.log")"
"$SNUG" train $common --load_in_4bit true --output_dir "$W/y" > "$W/y.log" 2>&1
[ $? -eq 2 ] && grep -q "adapter" "$W/y.log" && ok || bad "load_in_4bit without adapter: $(tail -1 "$W/y.log")"
# load_in_8bit without an adapter, beside load_in_4bit, with adapter: qlora
for args in "--load_in_8bit true:set adapter: lora" \
            "--adapter lora --load_in_8bit true --load_in_4bit true:one of them" \
            "--adapter qlora --load_in_8bit true:set adapter: lora for an 8-bit base"; do
  "$SNUG" train $common ${args%%:*} --output_dir "$W/y8" > "$W/y8.log" 2>&1
  [ $? -eq 2 ] && grep -q "${args#*:}" "$W/y8.log" && ok || bad "${args%%:*}: $(tail -1 "$W/y8.log")"
done
# lora_modules_to_save: a module snug does not train in full, and a tied embedding (one table for two modules)
"$SNUG" train $common --adapter lora --lora_modules_to_save norm --output_dir "$W/z" > "$W/z.log" 2>&1
[ $? -eq 2 ] && grep -q "'norm'" "$W/z.log" && grep -q "embed_tokens and lm_head" "$W/z.log" && ok ||
  bad "lora_modules_to_save norm: $(tail -1 "$W/z.log")"
"$SNUG" train $common --adapter lora --lora_modules_to_save lm_head --output_dir "$W/z2" > "$W/z2.log" 2>&1
[ $? -eq 2 ] && grep -q "ties embed_tokens to lm_head" "$W/z2.log" && ok ||
  bad "lora_modules_to_save on a tied model: $(tail -1 "$W/z2.log")"

finish
