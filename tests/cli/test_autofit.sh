#!/usr/bin/env bash
# auto_fit is the configuration it prints (and auto_find_batch_size, below, the first halving that fits): a fitted run
# and the same settings written by hand train the same bits and plan the same memory. The run of the report that found
# it: bf16, micro_batch_size 8, memory_budget 140MB on the default job, where auto_fit chooses a smaller micro-batch
# with gradient accumulation (whose 16-bit layer gradients must then be accumulated in fp32, as the hand-written run's
# are). Over two MPI ranks it also chooses the ZeRO stage, and auto_find_batch_size the size every rank fits (skipped
# without mpirun or an MPI build).
. "$(dirname "$0")/lib.sh"
common="$SRC/configs/default.yaml --max_steps 12 --sample_tokens 0 --eval_steps 0 --val_set_size 0
        --dataset_prepared_path $W/prepared"
. "$(dirname "$0")/losses.sh"

# the sanitizer build (several times slower) checks the case of the report only
precisions=("--bf16 true" "--fp16 true" "")
[ "${SNUG_SANITIZED:-0}" = 1 ] && precisions=("--bf16 true")
for precision in "${precisions[@]}"; do
  name=fit${precision:+_${precision:2:4}}
  train "$name" $precision --micro_batch_size 8 --auto_fit true --memory_budget 140MB || continue
  grep -q "auto_fit: chose" "$W/$name.log" || { bad "$name: auto_fit kept the configuration"; continue; }
  # the hand-written configuration of what auto_fit chose, read from the memory.json it left
  flags=$(python3 - "$W/$name/memory.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
lv = m["levers"]
out = ["--micro_batch_size", m["micro_batch_size"], "--gradient_accumulation_steps", m["gradient_accumulation_steps"],
       "--gradient_checkpointing", lv["gradient_checkpointing"], "--gradient_checkpointing_every_n_layers",
       lv["gradient_checkpointing_every_n_layers"], "--flash_attention", str(lv["flash_attention"]).lower(),
       "--optimizer", lv["optimizer"]]
if lv["xent_chunk_tokens"] and lv["xent_chunk_tokens"] < m["micro_batch_size"] * m["sequence_len"]:
    out += ["--chunked_cross_entropy", "true", "--cross_entropy_chunk_tokens", lv["xent_chunk_tokens"]]
print(" ".join(str(x) for x in out))
PY
)
  echo "  $name chose: $flags"
  train "${name}_by_hand" $precision $flags --memory_budget 140MB || continue
  compare "${name}_by_hand" "$name" 0
  # the same plan, category by category, and the same layer-gradient precision
  if python3 - "$W/$name/memory.json" "$W/${name}_by_hand/memory.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["plan"] == b["plan"] and a["levers"] == b["levers"] and a["measured"] == b["measured"]
print(f"  plans equal: {same}; gradients {a['plan']['gradients']} vs {b['plan']['gradients']} bytes;"
      f" fp32 layer gradients: {a['levers']['fp32_layer_gradients']}")
sys.exit(0 if same and (a["gradient_accumulation_steps"] == 1 or a["levers"]["fp32_layer_gradients"]) else 1)
PY
  then ok; else bad "$name: the fitted plan is not the hand-written configuration's plan"; fi
done

# a configuration auto_fit may not produce: the step inside backward never gets accumulation
train oib --micro_batch_size 8 --max_grad_norm 0 --optimizer_in_backward true --auto_fit true --memory_budget 140MB
if [ -f "$W/oib/memory.json" ]; then
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); sys.exit(m['gradient_accumulation_steps'] != 1)" \
    "$W/oib/memory.json" && ok || bad "auto_fit gave optimizer_in_backward gradient accumulation"
elif grep -q "nothing fits" "$W/oib.log"; then ok; else bad "optimizer_in_backward with auto_fit: $(tail -1 "$W/oib.log")"; fi

# auto_find_batch_size: micro_batch_size is the most, and the run takes the first of it, its half, its quarter, ...
# whose plan fits (memory_budget here, below the host's memory): `snug plan`'s total of the size taken fits 150MB,
# that of twice it does not; the run is the hand-written run of that size, bit for bit, accumulation unchanged (as
# transformers' Trainer). A resumed run takes the checkpoint's size even where a larger one fits now, and continues
# the same run. Refused beside auto_fit, and where not even 1 fits. Over several ranks, below.
train afb --micro_batch_size 32 --gradient_accumulation_steps 2 --auto_find_batch_size true --memory_budget 150MB &&
  python3 - "$W/afb/memory.json" "$SNUG" "$SRC/configs/default.yaml" <<'PY' && ok ||
  bad "afb: not the first halving that fits"
import json, subprocess, sys
m = json.load(open(sys.argv[1]))
B, GA = m["micro_batch_size"], m["gradient_accumulation_steps"]
need = lambda b: json.loads(subprocess.run([sys.argv[2], "plan", sys.argv[3], "--micro_batch_size", str(b),
                                            "--gradient_accumulation_steps", "2", "--json"], capture_output=True,
                                           text=True).stdout)["memory"]["total"]
budget = 150e6
print(f"  auto_find_batch_size took {B} of 32 (x {GA} accumulation): {need(B) / 2**20:.1f} MiB fits "
      f"{budget / 2**20:.1f} MiB, {2 * B} needs {need(2 * B) / 2**20:.1f} MiB")
sys.exit(0 if GA == 2 and B < 32 and 32 % B == 0 and need(B) <= budget < need(2 * B) else 1)
PY
mbs() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["micro_batch_size"])' "$1" 2>/dev/null; }
B=$(mbs "$W/afb/memory.json")
train afb_by_hand --micro_batch_size "${B:-0}" --gradient_accumulation_steps 2 --memory_budget 150MB &&
  compare afb_by_hand afb 0
grep -q "auto_find_batch_size: micro_batch_size $B, halved from 32" "$W/afb.log" && ok || bad "afb: no header line"
# (checkpoints take a snapshot arena, so this run fits a smaller micro-batch than afb)
train afb_ck --micro_batch_size 32 --gradient_accumulation_steps 2 --auto_find_batch_size true --memory_budget 150MB \
  --save_steps 6 && rm -rf "$W/afb_ck/checkpoint-12" &&
  Bck=$(mbs "$W/afb_ck/memory.json") &&
  "$SNUG" train $common --output_dir "$W/afb_ck" --micro_batch_size 32 --gradient_accumulation_steps 2 \
    --auto_find_batch_size true --memory_budget 4GB --save_steps 6 --resume_from_checkpoint "$W/afb_ck/checkpoint-6" \
    > "$W/afb_ck.resume.log" 2>&1 && [ "$Bck" -lt 32 ] &&
  grep -q "auto_find_batch_size: micro_batch_size $Bck, the checkpoint's" "$W/afb_ck.resume.log" &&
  python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" \
    "$W/afb_ck/metrics.jsonl" > "$W/afb_resumed.loss" && compare afb_resumed afb_ck 0 ||
  bad "afb_ck: the resumed run did not take the checkpoint's size: $(grep -h 'auto_find\|error' "$W/afb_ck.resume.log")"
for args in "--auto_fit true --memory_budget 150MB:auto_fit and auto_find_batch_size are both true" \
            "--memory_budget 10MB:not even micro_batch_size 1 fits the 9.54 MiB memory_budget"; do
  "$SNUG" train $common --auto_find_batch_size true ${args%%:*} --output_dir "$W/afb_bad" > "$W/afb_bad.log" 2>&1
  [ $? -eq 2 ] && grep -q "${args#*:}" "$W/afb_bad.log" && ok || bad "${args%%:*}: $(tail -1 "$W/afb_bad.log")"
done

# over several ranks auto_fit also chooses the ZeRO stage: every rank searches the same space with the largest rank's
# plan of each setting, so all choose alike; the fitted run is the hand-written one (losses bitwise, each rank's plan
# the same), and a budget DDP fits keeps DDP
if ! mpi_setup; then
  echo "  the ranks' cases skipped: no mpirun"
else
  . "$SRC/tests/cli/ids_data.sh"
  mpi=("${MPI[@]}" -np 2)
  [ "${SNUG_SANITIZED:-0}" = 1 ] && mpi=(env ASAN_OPTIONS=detect_leaks=0 "${mpi[@]}")
  ranks() { # ranks NAME ARGS...: two ranks of a small run into $W/NAME
    local name=$1; shift
    if ! OMP_NUM_THREADS=1 "${mpi[@]}" "$SNUG" train "$W/ids.yaml" --tokenizer "$SRC/assets/tokenizer" \
        --sequence_len 32 --sample_tokens 0 --seed 5 --threads 1 --max_steps 2 --logging_steps 1 \
        --micro_batch_size 2 --ddp_deterministic true --output_dir "$W/$name" "$@" > "$W/$name.log" 2>&1; then
      grep -q "built without MPI" "$W/$name.log" && { echo "  $name skipped: built without MPI"; return 1; }
      bad "$name did not train"; tail -3 "$W/$name.log"; return 1
    fi
    python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" \
      "$W/$name/metrics.jsonl" > "$W/$name.loss"
  }
  if ranks zfit --auto_fit true --memory_budget 62MB; then
    zflags=$(python3 - "$W/zfit/memory.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
lv = m["levers"]
print(" ".join(str(x) for x in ["--zero_stage", m["ranks"]["zero_stage"], "--micro_batch_size", m["micro_batch_size"],
      "--gradient_accumulation_steps", m["gradient_accumulation_steps"], "--gradient_checkpointing",
      lv["gradient_checkpointing"], "--optimizer", lv["optimizer"]]))
PY
)
    echo "  zfit chose: $zflags"
    case "$zflags" in "--zero_stage 0 "*) bad "2 ranks over 62MB: auto_fit kept DDP, which needs more";; *) ok;; esac
    if ranks zfit_by_hand $zflags --memory_budget 62MB; then
      compare zfit_by_hand zfit 0
      for f in memory.json memory.rank1.json; do
        python3 - "$W/zfit/$f" "$W/zfit_by_hand/$f" <<'PY' && ok || bad "zfit: $f is not the hand-written run's"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(not (a["plan"] == b["plan"] == a["measured"] and a["ranks"] == b["ranks"]))
PY
      done
    fi
  fi
  # under LoRA only stage 3 runs (it shards the frozen base): a budget below DDP's needs never yields stage 1 or 2
  if ranks lfit --adapter lora --bf16 true --auto_fit true --memory_budget 24MB; then
    z=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"]["zero_stage"])' "$W/lfit/memory.json")
    echo "  lfit (LoRA, 2 ranks, 24MB) chose zero_stage $z"
    case "$z" in 0|3) ok ;; *) bad "lfit: auto_fit chose zero_stage $z under LoRA" ;; esac
  fi
  if ranks zkeep --auto_fit true --memory_budget 10GB; then
    grep -q "auto_fit: kept the configuration" "$W/zkeep.log" && ok || bad "zkeep: $(grep auto_fit "$W/zkeep.log")"
  fi
  # auto_find_batch_size over several ranks: each rank halves against its own plan (its stage, its shard), and all
  # take the smallest size found; data parallel ranks find the same one. A pipeline whose second stage holds 3 of the
  # 4 layers fits less there than on the first: rank 0 takes rank 1's size, smaller than its own.
  afb_ranks() { # afb_ranks NAME BUDGET ARGS...
    local name=$1 budget=$2; shift 2
    OMP_NUM_THREADS=1 "${mpi[@]}" "$SNUG" train "$W/ids.yaml" --tokenizer "$SRC/assets/tokenizer" --sequence_len 32 \
      --sample_tokens 0 --threads 1 --max_steps 2 --micro_batch_size 32 --gradient_accumulation_steps 2 \
      --auto_find_batch_size true --memory_budget "$budget" --output_dir "$W/$name" "$@" > "$W/$name.log" 2>&1
  }
  same_size() { # same_size NAME: both ranks run the same size below 32, each within its plan (data parallel ranks,
    # whose plans are one, write rank 0's alone)
    python3 - "$W/$1" <<'PY'
import json, os, sys
one = f"{sys.argv[1]}/memory.rank1.json"
a, b = (json.load(open(f)) for f in (f"{sys.argv[1]}/memory.json", one if os.path.exists(one) else
                                     f"{sys.argv[1]}/memory.json"))
print(f"  {sys.argv[1].split('/')[-1]}: micro_batch_size {a['micro_batch_size']} on rank 0, {b['micro_batch_size']} on 1")
sys.exit(0 if a["micro_batch_size"] == b["micro_batch_size"] < 32 and a["plan"] == a["measured"] and
         b["plan"] == b["measured"] else 1)
PY
  }
  if afb_ranks afb_ddp 150MB; then
    same_size afb_ddp && grep -q "every one of the 2 ranks fits it" "$W/afb_ddp.log" && ok ||
      bad "afb_ddp: $(grep auto_find "$W/afb_ddp.log")"
  elif ! grep -q "built without MPI" "$W/afb_ddp.log"; then
    bad "afb_ddp did not train: $(grep error "$W/afb_ddp.log" | head -1)"
  fi
  if afb_ranks afb_pp 80MB --pipeline_parallel_size 2 --pipeline_layers 1,3; then
    same_size afb_pp && grep -q "the largest every rank fits (rank 1's; this rank fits" "$W/afb_pp.log" && ok ||
      bad "afb_pp: $(grep auto_find "$W/afb_pp.log")"
  elif ! grep -q "built without MPI" "$W/afb_pp.log"; then
    bad "afb_pp did not train: $(grep error "$W/afb_pp.log" | head -1)"
  fi
fi

finish
