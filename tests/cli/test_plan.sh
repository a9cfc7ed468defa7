#!/usr/bin/env bash
# `snug plan`: plans of models this machine cannot hold from their config.json alone (Llama 2 7B/13B/70B, Llama 3.1
# 8B: no weights, no tokenizer), the JSON report, the chart, auto_fit in the plan, and bad input (a broken or
# inconsistent config.json, an unknown GPU, a malformed budget or flag) as one clear error line with exit status 2.
. "$(dirname "$0")/lib.sh"
CFG=$SRC/tests/data/configs

# expect_error NAME PATTERN CMD...: exit status 2 and one "snug: error:" line on stderr matching PATTERN
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$@" >"$W/stdout" 2>"$W/stderr"
  local rc=$? lines
  lines=$(grep -c "snug: error:" "$W/stderr")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -Eq -- "$pattern" "$W/stderr"; then ok; else
    bad "$name: rc=$rc, error lines=$lines"; echo "  stderr: $(head -c 400 "$W/stderr")"; fi
}

# expect_out NAME PATTERN... -- CMD...: exit status 0 and every PATTERN in stdout
expect_out() {
  local name=$1; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  "$@" >"$W/stdout" 2>"$W/stderr"
  local rc=$?
  if [ $rc -ne 0 ]; then bad "$name: rc=$rc: $(head -c 300 "$W/stderr")"; return; fi
  for p in "${pats[@]}"; do
    if ! grep -Eq -- "$p" "$W/stdout"; then bad "$name: no '$p' in the output"; return; fi
  done
  ok
}

# plans from config.json alone, for models far larger than this machine
expect_out llama2-7b "6\.74B parameters" "parameters +25\.10 GiB +4\.00" "optimizer state +50\.2[01] GiB +8\.00" \
  "fit on common GPUs" "H200 141GB" -- "$SNUG" plan --base_model "$CFG/llama-2-7b"
expect_out llama2-13b "13\.02B parameters" "gradients +48\.49 GiB" -- "$SNUG" plan --base_model "$CFG/llama-2-13b"
# the optimizer step inside backward leaves the embedding and head gradients (2 x 525M) plus one 218M layer: 4.73 GiB
expect_out in-backward "optimizer_in_backward \(max_grad_norm: 0, GA 1\) +25\.19 GiB" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b"
expect_out llama2-70b "68\.98B parameters" "does not fit .* whatever the levers" -- \
  "$SNUG" plan --base_model "$CFG/llama-2-70b" --sequence_len 4096 --micro_batch_size 1
expect_out llama31-8b "8\.03B parameters" "vocab 128256" "gradient_checkpointing: full +[0-9.]+ GiB .*\+33%" \
  "time and cost" "cheapest: " -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --sequence_len 2048 --micro_batch_size 2 --gpu h100
# tensor parallelism: one rank's plan (the layers' matrices / 8, the embedding and head whole) and its all-reduces
expect_out tp8 "8\.03B parameters" "1\.92B of the 8\.03B parameters" "192 all-reduces of 32\.00 MiB" \
  "ms of collectives at 370 GB/s" "H100 80GB \(79\.65 GiB\): fits" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu h100 \
  --gradient_checkpointing true --tensor_parallel_size 8
expect_out target-fits "H200 141GB \(140\.40 GiB\): fits" -- "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --gpu h200
expect_out target-budget "memory_budget \(37\.25 GiB\): does not fit" "cheapest setting that fits: .*optimizer" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --memory_budget 40GB --backend cuda
expect_out budget-gib "memory_budget \(40\.00 GiB\)" -- "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --memory_budget "40 GiB"
expect_out budget-mb "memory_budget \(37\.25 GiB\)" -- "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --memory_budget 40000MB
expect_out auto-fit "auto_fit: chose .* needs .* of memory_budget 37\.25 GiB" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --auto_fit true --memory_budget 40GB --backend cuda
expect_out measured-tps "the measured 3000 on --gpu's GPU" "--price_per_hour" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --gpu a100-80gb --tokens_per_s 3000 --price_per_hour 1.5
# the peak named is the one priced: exact fp32 GEMMs at the FP32 (CUDA-core) peak, 16-bit at the tensor cores' bf16
expect_out peak-fp32 "estimated as the FP32 \(CUDA-core\) peak x" -- "$SNUG" plan --base_model "$CFG/llama-3.2-3b"
expect_out peak-bf16 "estimated as the bf16 tensor-core peak x" -- "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --bf16 true
expect_out measured-peaks "scaled to the others by their FP32 \(CUDA-core\) peaks" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --gpu a100-80gb --tokens_per_s 3000
"$SNUG" plan --base_model "$CFG/llama-3.2-3b" | grep -q "TF32" && bad "the plan names TF32, which snug never prices" || ok
default_steps=$(sed -n 's/^max_steps: *\([0-9]*\).*/\1/p' "$SRC/configs/default.yaml")
expect_out default-job "tiny-llama" "max_steps $default_steps x 1024 tokens per step" -- bash -c "cd '$W' && '$SNUG' plan"
printf '{"text": "hello world, this is a small dataset line that repeats."}\n%.0s' $(seq 200) > "$W/data.jsonl"
expect_out epochs "num_epochs 2 x [0-9]+ dataset tokens" -- bash -c "cd '$W' && '$SNUG' plan --dataset data.jsonl \
  --tokenizer '$SRC/assets/tokenizer' --num_epochs 2 --sequence_len 32"
expect_out no-data "assumed 1000 steps" "missing.jsonl: cannot open" -- \
  bash -c "cd '$W' && '$SNUG' plan --dataset missing.jsonl --base_model '$CFG/llama-2-7b'"

# JSON: every category, the GPU table, and the numbers adding up
if "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --json --gpu a100 > "$W/plan.json" 2>"$W/stderr" &&
   python3 - "$W/plan.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
cats = j["memory"]["categories"]
assert len(cats) == 10 and j["model"]["parameters"] == 8030261248, cats
assert sum(c["bytes"] for c in cats.values()) == j["memory"]["arenas"] + j["memory"]["host_arenas"]
assert abs(j["memory"]["total"] - j["memory"]["arenas"] - j["memory"]["runtime_overhead"]["total"]) < 1
assert [g["id"] for g in j["gpus"]] == ["rtx4090", "a100-40gb", "a6000", "l40s", "a100-80gb", "h100", "h200"]
assert j["backend"] == "cuda" and j["target"]["name"] == "A100 80GB" and not j["target"]["fits"]
assert any(l["lever"] == "gradient_checkpointing: full" for l in j["levers_toggled"])
meth = j["methods"]  # full fine-tuning, LoRA and QLoRA with the same levers, each planned
assert [m["method"].split()[0] for m in meth] == ["full", "LoRA", "QLoRA"], meth
assert meth[2]["needs"] < meth[1]["needs"] < meth[0]["needs"] and "rtx4090" in meth[2]["fits"], meth
for g in j["gpus"]:
    assert g["fits"] == (g["needs"] <= g["memory"])
    if g["cheapest_fit"]:
        assert g["cheapest_fit"]["needs"] <= g["memory"] and g["cost_usd"] > 0
PY
then ok; else bad "json: $(head -c 300 "$W/stderr")"; fi

# the plan per rank (--gpus): Llama-3.1-8B full fine-tune, bf16, T=2048, on 8 x H100: DDP does not fit, ZeRO-1's
# optimizer arena is DDP's split 8 ways (the layout code's, to within a block of 256 per rank), ZeRO-3 (laid out
# too) fits with a
# predicted step within 10% of the compute; the communication is the ring formulas' (src/plan/ranks.h)
if "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu h100 \
     --gpus 8 --json > "$W/ranks.json" 2>"$W/stderr" && python3 - "$W/ranks.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["ranks"]
ddp, z1, z2, z3 = j["modes"]
P, f = 8030261248, 7 / 8
assert j["gpus"] == 8 and [m["mode"] for m in j["modes"]] == ["ddp", "zero-1", "zero-2", "zero-3"]
assert not ddp["fits"] and z3["fits"] and not any("estimated" in m for m in j["modes"]), j
# ZeRO-3 from the layout: the parameters arena is the rank's shard of the bf16 copy (1/8, to within a block of 256)
# and the gather region: the head is untied, so the embedding and the final norm + head take turns in it, each
# larger than two layers
p0, p3 = ddp["bytes"]["parameters"], z3["bytes"]["parameters"]
post = 128256 * 4096 + 4096
region = 2 * post
assert abs(p3 - region - p0 / 8) <= 257 * 2 + 128, (p0, p3, region)
# ZeRO-2/3's gradients: the rank's fp32 shard and one buffer of max(embedding, final norm + head, layer) floats
for z in (z2, z3):
    g = z["bytes"]["gradients"]
    assert abs(g - 4 * post - P * 4 / 8) <= 257 * 4 + 128, (g, post)
o0, o1 = ddp["bytes"]["optimizer state"], z1["bytes"]["optimizer state"]
assert abs(o1 - o0 / 8) <= 257 * 8, (o0, o1)
assert z3["step_s"] <= 1.10 * z3["compute_s"], z3
assert abs(ddp["comm_bytes"] - 2 * f * P * 4) < 1 and abs(z1["comm_bytes"] - f * P * (4 + 2)) < 1
assert abs(z3["comm_bytes"] - f * P * (2 * 2 + 4)) < 1, z3
assert z3["total"] < z2["total"] < z1["total"] < ddp["total"]
assert j["chosen"] in ("zero-2", "zero-3") and j["modes"][int(j["chosen"][-1])]["fits"]
PY
then ok; else bad "ranks: $(head -c 300 "$W/stderr")"; fi
# zero_overlap_comm (auto: on for GPUs): off, ZeRO-2/3's reduce-scatters run in line, so their predicted steps are
# longer by the reduce-scatter's time less the share of layer 0 that was exposed anyway, DDP's and ZeRO-1's are the
# same; on, the second layer buffer fits inside the head's buffer (525M floats against two layers of 218M): the
# memory is the same either way
if "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu h100 \
     --gpus 8 --zero_overlap_comm false --json > "$W/ranks_off.json" 2>"$W/stderr" &&
   python3 - "$W/ranks.json" "$W/ranks_off.json" <<'PY'
import json, sys
on, off = (json.load(open(p))["ranks"]["modes"] for p in sys.argv[1:3])
P, f, L = 8030261248, 7 / 8, 32
for a, b in zip(on, off):
    assert a["bytes"] == b["bytes"], (a["mode"], a["bytes"], b["bytes"])
for z in (0, 1):
    assert on[z]["step_s"] == off[z]["step_s"], (on[z], off[z])
rs = f * P * 4 / (370 * 1e9)  # one reduce-scatter of the fp32 gradients at the H100's 370 GB/s (gpus.c)
assert abs(off[2]["step_s"] - on[2]["step_s"] - rs * (1 - 1 / L)) < 1e-6, (on[2], off[2], rs)
assert off[3]["step_s"] > on[3]["step_s"] + 0.5 * rs, (on[3], off[3], rs)
print(f"  zero_overlap_comm off: zero-2 step {off[2]['step_s']:.3f} s against {on[2]['step_s']:.3f} s, zero-3 "
      f"{off[3]['step_s']:.3f} s against {on[3]['step_s']:.3f} s")
PY
then ok; else bad "ranks, zero_overlap_comm false: $(head -c 300 "$W/stderr")"; fi
# a tied head (Llama-3.2-3B) over 8 CPU ranks: loss_vocab_block (auto) splits the embedding by rows, so ZeRO-2/3's
# gradients are the shard beside one layer buffer and the looked-up rows (8 ranks x 2048 tokens), not the embedding's
# gradient whole, and ZeRO-3's region is two layers; off (-1), the embedding is in both
for vb in 0 -1; do
  if "$SNUG" plan --base_model "$CFG/llama-3.2-3b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --backend cpu \
       --gpus 8 --loss_vocab_block $vb --json > "$W/tied$vb.json" 2>"$W/stderr" && python3 - "$W/tied$vb.json" "$vb" "$CFG/llama-3.2-3b/config.json" <<'PY'
import json, sys
j, on, cfg = json.load(open(sys.argv[1]))["ranks"], sys.argv[2] == "0", json.load(open(sys.argv[3]))
C, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
kv = C // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
layer = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * I
P = V * C + C + L * layer
ddp, z1, z2, z3 = j["modes"]
rows = min(V, 8 * 2048)
for z in (z2, z3):
    g = z["bytes"]["gradients"] - P * 4 / 8
    want = (layer + rows * C) * 4 if on else (V * C + layer) * 4
    assert abs(g - want) <= 257 * 4 + 4096, (z["mode"], g, want)
region = z3["bytes"]["parameters"] - P * 2 / 8
want = 2 * layer * 2 if on else (V * C + C) * 2
assert abs(region - want) <= 257 * 2 + 4096, (region, want)
print(f"  llama-3.2-3b, loss_vocab_block {sys.argv[2]}: zero-3 gradients {z3['bytes']['gradients'] / 2**30:.3f} GiB, "
      f"parameters {z3['bytes']['parameters'] / 2**30:.3f} GiB per rank")
PY
  then ok; else bad "tied head over 8 cpu ranks, loss_vocab_block $vb: $(head -c 300 "$W/stderr")"; fi
done
# 2 x RTX 4090 with the 8-bit paged optimizer: the plan says which mode fits, in text
expect_out ranks-4090 "per rank over 2 GPUs of RTX 4090" "zero-3 " "(chosen: zero-|no mode fits in)" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu rtx4090 \
  --gpus 2 --optimizer paged_adamw_8bit --gradient_checkpointing true
# ... and where none fits, over how many GPUs one would: that many fit (the same mode and memory), one fewer does not
r4090=(plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu rtx4090
  --optimizer paged_adamw_8bit --gradient_checkpointing true --json)
if "$SNUG" "${r4090[@]}" --gpus 2 > "$W/f2.json" 2>"$W/stderr" &&
   n=$(python3 -c 'import json,sys; f = json.load(open(sys.argv[1]))["ranks"]["fits_from"]; print(f["gpus"])' "$W/f2.json") &&
   "$SNUG" "${r4090[@]}" --gpus "$n" > "$W/fn.json" 2>>"$W/stderr" &&
   "$SNUG" "${r4090[@]}" --gpus $((n - 1)) > "$W/fm.json" 2>>"$W/stderr" &&
   python3 - "$W/f2.json" "$W/fn.json" "$W/fm.json" <<'PY'
import json, sys
two, at, below = (json.load(open(p))["ranks"] for p in sys.argv[1:4])
f = two["fits_from"]
assert two["chosen"] is None and f["gpus"] > 2, two
assert at["chosen"] == f["mode"] and at["fits_from"] is None, at
mode = next(m for m in at["modes"] if m["mode"] == f["mode"])
assert mode["need"] == f["need"], (mode, f)
assert below["chosen"] is None, below
print(f"  llama-3.1-8b on rtx4090 x 2 fits nowhere; {f['mode']} fits from {f['gpus']} GPUs ({f['need'] / 2**30:.2f} GiB)")
PY
then ok; else bad "fewest GPUs: $(head -c 300 "$W/stderr")"; fi
expect_out ranks-4090-text "no mode fits in 23.99 GiB per GPU; over [0-9]+ GPUs zero-3 fits" -- \
  "$SNUG" "${r4090[@]:0:${#r4090[@]}-1}" --gpus 2
# QLoRA over 2 GPUs: DDP sums the adapters' 13 MiB of gradients and is chosen; stage 3 shards the 4-bit matrices
# (less memory, their gathers' traffic); LoRA over 8: stage 3 shards the frozen base and fits where DDP does not
expect_out ranks-lora "ddp .* no " "zero-1   not built with an adapter: only stage 3" "zero-3 .* yes .*<- chosen" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu rtx4090 \
  --gpus 8 --adapter lora --lora_target_linear true
expect_out ranks-qlora "ddp +5\.31 GiB .* 13\.00 MiB +[0-9.]+ +[0-9.]+  <- chosen" "zero-3 +3\.84 GiB .* yes +3\.37 GiB" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 --gpu rtx4090 \
  --gpus 2 --adapter qlora
# FSDP-QLoRA's case: Llama-2-70B on 2 x RTX 4090, every linear module adapted, checkpointing: DDP holds the 4-bit
# base whole (42 GiB per rank), stage 3 half of its 4-bit matrices plus two layers' (26 GiB); neither fits, and 3 GPUs
# would at stage 3
expect_out ranks-qlora-70b "parameters +33\.87 GiB .* NF4 block matrices, bf16 embeddings, norms, head" \
  "ddp +33\.87 GiB .* 42\.00 GiB  no" "zero-3 +18\.24 GiB .* 26\.22 GiB  no" \
  "over 3 GPUs zero-3 fits \(20\.69 GiB per rank" -- \
  "$SNUG" plan --base_model "$CFG/llama-2-70b" --adapter qlora --bf16 true --sequence_len 2048 --micro_batch_size 1 \
  --gradient_checkpointing true --gpu rtx4090 --gpus 2 --lora_target_linear true
# FSDP-QLoRA's CPU offload: the same 70B on one RTX 4090 with offload_params, the 4-bit base in host memory; and the
# lever offered where the run does not fit
expect_out qlora-70b-offload "offloaded to host +32\.89 GiB .*offload_params" "total +8\.99 GiB" \
  "training +QLoRA r=8 .* the NF4 base \(bf16 embeddings, norms, head\) frozen" \
  "parameters +1\.80 GiB .* bf16 embeddings, norms, head; two layers' NF4 matrices" \
  "RTX 4090 24GB .* fits: needs 8\.99 GiB" -- \
  "$SNUG" plan --base_model "$CFG/llama-2-70b" --adapter qlora --bf16 true --sequence_len 2048 --micro_batch_size 1 \
  --gradient_checkpointing true --gpu rtx4090 --lora_target_linear true --offload_params true
expect_out qlora-70b-lever "offload_params: true +32\.38 GiB +8\.99 GiB +\+1%" -- \
  "$SNUG" plan --base_model "$CFG/llama-2-70b" --adapter qlora --bf16 true --sequence_len 2048 --micro_batch_size 1 \
  --gradient_checkpointing true --gpu rtx4090 --lora_target_linear true
# ZeRO-3 with the step inside backward keeps no shard of the summed gradients, only one layer's buffer (which the
# untied embedding and head share): less memory per rank, each layer's reduce-scatter in line
expect_out ranks-z3-oib "zero-3 +2\.85 GiB +3\.74 GiB +1\.96 GiB +7\.48 GiB .* 20\.80 GiB  yes .*<- chosen" -- \
  "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --bf16 true --sequence_len 2048 --micro_batch_size 1 \
  --gradient_checkpointing true --gpu h100 --gpus 8 --optimizer_in_backward true --max_grad_norm 0
expect_error gpus-0 "gpus is 0; it must be at least 1" "$SNUG" plan --base_model "$CFG/llama-3.1-8b" --gpus 0

# the chart: SVG always, PNG when a converter is installed
if "$SNUG" plan --base_model "$CFG/llama-2-7b" --svg "$W/plan.svg" > "$W/stdout" 2>"$W/stderr" &&
   grep -q "</svg>" "$W/plan.svg" && grep -q "gradient_checkpointing: full" "$W/plan.svg" &&
   { [ -f "$W/plan.png" ] || grep -q "no PNG" "$W/stdout"; }; then ok; else bad "svg: $(head -c 300 "$W/stderr")"; fi

# bad input
mkdir -p "$W/nohidden" "$W/heads" "$W/broken" "$W/empty"
python3 - "$CFG/llama-2-7b/config.json" "$W" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); w = sys.argv[2]
d = dict(c); del d["hidden_size"]; json.dump(d, open(w + "/nohidden/config.json", "w"))
d = dict(c); d["num_key_value_heads"] = 5; json.dump(d, open(w + "/heads/config.json", "w"))
open(w + "/broken/config.json", "w").write(json.dumps(c)[:200])
PY
expect_error missing-key "nohidden/config.json.*hidden_size.*missing" "$SNUG" plan --base_model "$W/nohidden"
expect_error inconsistent "heads/config.json.*num_key_value_heads" "$SNUG" plan --base_model "$W/heads"
expect_error broken-json "broken/config.json:[0-9]+:[0-9]+: invalid JSON" "$SNUG" plan --base_model "$W/broken"
expect_error no-config "empty/config.json: not found" "$SNUG" plan --base_model "$W/empty"
expect_error unknown-gpu "unknown GPU 'v100'; snug plan knows rtx4090, a100-40gb, a6000, l40s, a100-80gb, h100, h200" \
  "$SNUG" plan --base_model "$CFG/llama-2-7b" --gpu v100
expect_error bad-budget "memory_budget must be a size such as 40GB.*got 'forty'" \
  "$SNUG" plan --base_model "$CFG/llama-2-7b" --memory_budget forty
expect_error bad-backend "--backend must be one of auto, cpu, cuda, got 'tpu'" "$SNUG" plan --base_model "$CFG/llama-2-7b" --backend tpu
expect_error bad-tps "--tokens_per_s must be a positive number.*got 'fast'" \
  "$SNUG" plan --base_model "$CFG/llama-2-7b" --tokens_per_s fast
expect_error gpu-on-cpu "--gpu plans for the cuda backend" "$SNUG" plan --base_model "$CFG/llama-2-7b" --gpu h100 --backend cpu
expect_error no-value "--gpu needs a value" "$SNUG" plan --base_model "$CFG/llama-2-7b" --gpu
expect_error fit-no-budget "auto_fit is true but memory_budget is not set" \
  "$SNUG" plan --base_model "$CFG/llama-2-7b" --auto_fit true
expect_error fit-nothing "auto_fit: nothing fits memory_budget 7\.45 GiB.*smallest setting" \
  "$SNUG" plan --base_model "$CFG/llama-2-7b" --auto_fit true --memory_budget 8GB --backend cuda

# text and JSON are one report: every lever row of the text (searched and listed) is in the JSON, and the levers
# are named as the configuration writes them (offload is "offload" in both outputs and in memory.json)
"$SNUG" plan --base_model "$CFG/llama-2-7b" --backend cuda --gradient_checkpointing offload > "$W/plan.txt" 2>&1
"$SNUG" plan --base_model "$CFG/llama-2-7b" --backend cuda --gradient_checkpointing offload --json > "$W/plan.json" 2>&1
if python3 - "$W/plan.txt" "$W/plan.json" <<'PY'
import json, re, sys
text, j = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
names = [l["lever"] for l in j["levers_toggled"]] + [l["lever"] for l in j["levers_listed"]]
missing = [n for n in names if n not in text]
rows = re.findall(r"^  (\S.*?)\s{2,}[0-9.]+ [KMGT]?i?B\s+[0-9.]+ [KMGT]?i?B\s+[+-][0-9]+%", text, re.M)
extra = [r for r in rows if r.strip() not in names]
ok = not missing and not extra and j["levers"]["gradient_checkpointing"] == "offload" and j["levers_listed"]
print(f"  {len(names)} lever rows in JSON; missing in text {missing}; text rows not in JSON {extra}; "
      f"checkpointing named {j['levers']['gradient_checkpointing']!r}")
sys.exit(0 if ok else 1)
PY
then ok; else bad "plan text and --json disagree"; fi

# training refuses a plan over memory_budget before allocating or writing anything (exit status 2: a config that
# cannot fit is for the user to change)
(cd "$W" && "$SNUG" train --dataset data.jsonl --tokenizer "$SRC/assets/tokenizer" --model_preset llama-30m \
  --sequence_len 64 --max_steps 1 --memory_budget 200MiB --output_dir "$W/over" > "$W/stdout" 2> "$W/stderr")
rc=$?
if [ $rc -eq 2 ] && [ ! -e "$W/over" ] &&
   grep -Eq "snug: error: the memory plan needs .* over memory_budget 200\.00 MiB .*largest: .*auto_fit: true" "$W/stderr"
then ok; else bad "over-budget: rc=$rc: $(head -c 300 "$W/stderr")"; fi

finish
