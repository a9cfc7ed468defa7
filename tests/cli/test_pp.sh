#!/usr/bin/env bash
# Pipeline parallelism over MPI ranks on the CPU (pipeline_parallel_size: N, mpirun -np N) against one process.
# - Bit for bit where the arithmetic is the same: each stage runs its layers' ops unchanged and accumulates its
#   gradients over the micro-batches in their order, so with an untied head and no clipping (whose norm sums the
#   stages' squares in another order) the losses, validation losses and final weights are one process's accumulating
#   the same micro-batches, at 2, 3 and 4 stages, with pipeline_recompute and pipeline_layers, with fewer
#   micro-batches than stages, under bf16, fp16 and checkpointing, for LoRA and QLoRA adapters; data parallel groups
#   of pipelines are data parallelism's bits, with ZeRO-1 and 2 too; the weights as loaded or drawn and gathered back
#   are the one process's bytes; a run stopped (at a checkpoint, or by SIGTERM) and resumed is the run that never
#   stopped.
# - Within 10 times a noise floor measured here (noise_floor.sh) where the order of additions changes: a tied head
#   (its gradient summed from the first and last stages) with clipping, on Llama and GPT-2.
# - Each rank's arenas equal its plan and `snug plan`'s stage; the settings it cannot take are refused before
#   anything is written.
# Skipped (77) without mpirun or an MPI build.
. "$(dirname "$0")/lib.sh"
need_mpi
. "$SRC/tests/cli/ranks.sh"
. "$SRC/tests/cli/noise_floor.sh"

text_data "$W/text.jsonl"
tok="--tokenizer $SRC/assets/tokenizer --sequence_len 48 --sample_tokens 0 --seed 5 --threads 1"
# the bases: tiny-llama (4 layers) after one step, tied ($W/tied), and with an untied lm_head ($W/base)
printf 'datasets:\n  - path: %s\n    type: completion\n' "$W/text.jsonl" > "$W/ids.yaml"
. "$SRC/tests/cli/untied_base.sh"
common="$W/ids.yaml $tok --base_model $W/base --max_steps 1 --micro_batch_size 2"
skip_without_mpi --pipeline_parallel_size 2

# same RUN REF: RUN's logged losses and validation losses are REF's, its gradient norms within 1e-6 (the stages' sums
# of squares added in another order), and its weights (or adapter) REF's bytes
same() {
  local f=model.safetensors
  [ -e "$W/$2/$f" ] || f=adapter_model.safetensors
  cmp -s "$W/$1/$f" "$W/$2/$f" &&
    python3 - "$W/$1/metrics.jsonl" "$W/$2/metrics.jsonl" <<'PY' && ok || bad "$1: not the bits of $2"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) and a, (len(a), len(b))
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x.get("val_loss") == y.get("val_loss"), (x, y)
    assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-6 * y["grad_norm"], (x, y)
PY
}

common="$W/ids.yaml $tok --base_model $W/base --max_steps 4 --logging_steps 1 --learning_rate 3e-3
        --max_grad_norm 0 --micro_batch_size 2 --gradient_accumulation_steps 4 --val_set_size 12 --eval_steps 2"
run one 0 || bad "one did not train: $(tail -2 "$W/one.log")"
for np in 2 3 4; do
  run pp$np $np --pipeline_parallel_size $np || bad "pp$np did not train: $(tail -2 "$W/pp$np.log")"
  same pp$np one
done
# pipeline_recompute: each stage before the last keeps its inputs alone and runs its forward again: the same bits,
# its saved activations one micro-batch's instead of one per micro-batch in flight (3 on the first of 3 stages)
run pp3_r 3 --pipeline_parallel_size 3 --pipeline_recompute true || bad "pp3_r did not train: $(tail -2 "$W/pp3_r.log")"
same pp3_r one
python3 - "$W/pp3" "$W/pp3_r" <<'PY' && ok || bad "pipeline_recompute: not the saved activations it should keep"
import json, sys
keep, rec = sys.argv[1:3]
for f, ratio in (("memory.json", 3), ("memory.rank1.json", 2), ("memory.rank2.json", 1)):
    a, b = (json.load(open(f"{d}/{f}")) for d in (keep, rec))
    assert a["plan"] == a["measured"] and b["plan"] == b["measured"], f
    x, y = a["measured"]["saved activations"], b["measured"]["saved activations"]
    # the first stage's are its sets alone (3 against 1); a later one's also hold the inputs received, either way
    assert (x == 3 * y) if ratio == 3 else (x > y) if ratio == 2 else (x == y), (f, x, y)
    print(f"  {f}: saved activations {x} kept, {y} recomputed")
PY
grep -q "pipeline parallel *2 stages (.*1F1B over each step's 4 micro-batches (the bubble: 1 of every 5" "$W/pp2.log" &&
  grep -q "stage 0: layers 0-1, the embedding" "$W/pp2.log" &&
  grep -q "stage 1: layers 2-3, the final norm, the head$" "$W/pp2.log" && ok ||
  bad "pp2: no pipeline lines in the header: $(grep -a -A2 'pipeline parallel' "$W/pp2.log")"
grep -q "stage 1: layers 1-2$" "$W/pp3.log" && ok || bad "pp3: the 4 layers not split 1, 2, 1"
[ "$(grep -c '^snug: training' "$W/pp4.log")" -eq 1 ] && ok || bad "pp4: more than one rank printed"
# pipeline_layers: the stages as listed (3 layers and 1): the same bits
run pp2_31 2 --pipeline_parallel_size 2 --pipeline_layers 3,1 || bad "pp2_31 did not train: $(tail -2 "$W/pp2_31.log")"
same pp2_31 one
grep -q "stage 0: layers 0-2, the embedding" "$W/pp2_31.log" && grep -q "stage 1: layer 3, the final norm" \
  "$W/pp2_31.log" && ok || bad "pp2_31: not the listed split: $(grep -a 'stage [01]:' "$W/pp2_31.log")"
# bf16 with full checkpointing and packing, 2 micro-batches through 3 stages (the first stage's 2 forwards before any
# backward); fp16 with 8-bit AdamW and the layer inputs offloaded
lv="--gradient_accumulation_steps 2 --bf16 true --gradient_checkpointing true --sample_packing true"
run one_b 0 $lv || bad "one_b did not train"
run pp3_b 3 $lv --pipeline_parallel_size 3 || bad "pp3_b did not train: $(tail -2 "$W/pp3_b.log")"
same pp3_b one_b
lv="--fp16 true --optimizer adamw_8bit --gradient_checkpointing offload"
run one_h 0 $lv || bad "one_h did not train"
run pp2_h 2 $lv --pipeline_parallel_size 2 || bad "pp2_h did not train: $(tail -2 "$W/pp2_h.log")"
same pp2_h one_h
grep -q "gradient_accumulation_steps 2 < 3 stages: some stage is always idle" "$W/pp3_b.log" && ok ||
  bad "pp3_b: no note of the idle stage"

# LoRA (dropout's masks drawn by the whole model's layer index) and QLoRA (each stage's 4-bit matrices) on the
# stages' layers, the adapters gathered into one PEFT folder: one process's bits; lora_modules_to_save's copies on the
# first and last stages; merge_lora from the gathered adapter; a resumed run the run that never stopped
lv="--adapter lora --lora_r 4 --lora_dropout 0.1 --lora_target_linear true"
run one_l 0 $lv --merge_lora true || bad "one_l did not train: $(tail -2 "$W/one_l.log")"
run pp3_l 3 $lv --merge_lora true --pipeline_parallel_size 3 || bad "pp3_l did not train: $(tail -2 "$W/pp3_l.log")"
same pp3_l one_l
cmp -s "$W/one_l/merged/model.safetensors" "$W/pp3_l/merged/model.safetensors" && ok ||
  bad "pp3_l: the merged model is not one process's"
lv="--adapter qlora --lora_r 4 --lora_target_linear true --bf16 true --lora_modules_to_save embed_tokens,lm_head"
run one_q 0 $lv || bad "one_q did not train: $(tail -2 "$W/one_q.log")"
run pp2_q 2 $lv --pipeline_parallel_size 2 || bad "pp2_q did not train: $(tail -2 "$W/pp2_q.log")"
same pp2_q one_q
lv="--adapter lora --lora_r 4 --lora_dropout 0.1 --max_steps 4 --val_set_size 0"
run lck_full 2 $lv --pipeline_parallel_size 2 || bad "lck_full did not train"
run lck 2 $lv --pipeline_parallel_size 2 --save_steps 2 || bad "lck did not train: $(tail -2 "$W/lck.log")"
rm -rf "$W/lck/checkpoint-4" "$W/lck/adapter_model.safetensors" "$W/lck/adapter_config.json"
run lck 2 $lv --pipeline_parallel_size 2 --save_steps 2 --resume_from_checkpoint latest &&
  cmp -s "$W/lck/adapter_model.safetensors" "$W/lck_full/adapter_model.safetensors" && ok ||
  bad "the resumed LoRA pipeline is not the run that never stopped: $(tail -2 "$W/lck.log")"

# each rank's arenas are its plan and `snug plan`'s for its stage; its parameters, gradients and optimizer state
# smaller than one process's
"$SNUG" plan $common --pipeline_parallel_size 3 --backend cpu --json > "$W/plan3.json" 2> "$W/plan3.err" ||
  bad "snug plan with pipeline_parallel_size 3: $(tail -1 "$W/plan3.err")"
python3 - "$W/pp3" "$W/one" "$W/plan3.json" <<'PY' && ok || bad "pp3: a rank's memory is not its stage's plan"
import json, sys
pp, one, plan = sys.argv[1:4]
ref = json.load(open(f"{one}/memory.json"))
stages = json.load(open(plan))["pipeline_parallel"]["per_stage"]
assert len(stages) == 3 and [s["layers"] for s in stages] == [1, 2, 1], stages
for q, f in enumerate(("memory.json", "memory.rank1.json", "memory.rank2.json")):
    m = json.load(open(f"{pp}/{f}"))
    assert m["plan"] == m["measured"], (f, m["plan"], m["measured"])
    assert sum(m["measured"].values()) == stages[q]["bytes"], (f, sum(m["measured"].values()), stages[q])
    for c in ("parameters", "gradients", "optimizer state"):
        assert m["measured"][c] < ref["measured"][c], (f, c)
print("  pp3 stages:", [s["bytes"] for s in stages], "bytes, one process:", sum(ref["measured"].values()))
PY
"$SNUG" plan $common --pipeline_parallel_size 3 --backend cpu > "$W/plan3.txt" 2>&1 &&
  grep -q "the memory below is stage [0-2]'s, the heaviest" "$W/plan3.txt" && ok ||
  bad "snug plan: no stage lines: $(grep -a -A1 pipeline "$W/plan3.txt")"

# a tied head (the embedding on the first and last stages, its gradient summed) with clipping: within 10 times the
# floor, on tiny-llama and on a tiny GPT-2 (its position embedding on the first stage alone)
common="$W/ids.yaml $tok --max_steps 6 --logging_steps 1 --learning_rate 3e-3 --max_grad_norm 0.5
        --micro_batch_size 2 --gradient_accumulation_steps 3 --val_set_size 12 --eval_steps 3"
nudge "$W/tied" "$W/tied_f32" 0 || bad "the nudged tied base"
run one_t 0 --base_model "$W/tied" || bad "one_t did not train"
run one_t_nudged 0 --base_model "$W/tied_f32" || bad "one_t_nudged did not train"
run pp3_t 3 --base_model "$W/tied" --pipeline_parallel_size 3 || bad "pp3_t did not train: $(tail -2 "$W/pp3_t.log")"
near pp3_t one_t one_t_nudged
grep -q "stage 2: layer 3, the final norm, the tied head (the embedding again" "$W/pp3_t.log" && ok ||
  bad "pp3_t: the last stage does not say it holds the tied head"
tiny_gpt2 "$W/gpt2" || fatal "the GPT-2 base"
nudge "$W/gpt2" "$W/gpt2_f32" 0 || bad "the nudged GPT-2 base"
run one_g 0 --base_model "$W/gpt2" || bad "one_g did not train: $(tail -2 "$W/one_g.log")"
run one_g_nudged 0 --base_model "$W/gpt2_f32" || bad "one_g_nudged did not train"
run pp2_g 2 --base_model "$W/gpt2" --pipeline_parallel_size 2 || bad "pp2_g did not train: $(tail -2 "$W/pp2_g.log")"
near pp2_g one_g one_g_nudged

# learning_rate 1e-30: the weights as loaded (each stage its tensors) or drawn (each tensor from its own stream, as
# one process draws it), gathered and saved: the one process's bytes
common="$W/ids.yaml $tok --max_steps 1 --learning_rate 1e-30 --micro_batch_size 2"
run load_one 0 --base_model "$W/base" || bad "load_one did not train"
run load_pp3 3 --base_model "$W/base" --pipeline_parallel_size 3 || bad "load_pp3 did not train"
cmp -s "$W/load_one/model.safetensors" "$W/load_pp3/model.safetensors" && ok ||
  bad "the base loaded as 3 stages and gathered is not the base one process saves"
# auto_fit plans every stage and chooses for the heaviest, alike on every rank; each keeps its own stage
run load_fit 3 --base_model "$W/base" --pipeline_parallel_size 3 --auto_fit true --memory_budget 2GB ||
  bad "load_fit did not train: $(tail -2 "$W/load_fit.log")"
cmp -s "$W/load_one/model.safetensors" "$W/load_fit/model.safetensors" && ok ||
  bad "under auto_fit the stages did not load their own layers"
run load_g1 0 --base_model "$W/gpt2" || bad "load_g1 did not train"
run load_g2 2 --base_model "$W/gpt2" --pipeline_parallel_size 2 || bad "load_g2 did not train"
cmp -s "$W/load_g1/model.safetensors" "$W/load_g2/model.safetensors" && ok ||
  bad "GPT-2 loaded as 2 stages and gathered is not the base one process saves"
run init_one 0 --model_preset tiny-llama || bad "init_one did not train"
run init_pp4 4 --model_preset tiny-llama --pipeline_parallel_size 4 || bad "init_pp4 did not train"
cmp -s "$W/init_one/model.safetensors" "$W/init_pp4/model.safetensors" && ok ||
  bad "the random init drawn as 4 stages is not one process's"
cmp -s "$W/init_one/config.json" "$W/init_pp4/config.json" && ok || bad "the saved config.json differs"

# data parallel beside the pipeline: 2 groups of 2 stages (4 ranks) against data parallelism over 2 ranks, on
# test_ddp's data (each id once: every gradient element one addition per micro-batch), with evaluation split over
# the groups: the same bits
. "$SRC/tests/cli/ids_data.sh"
common="$W/ids.yaml $tok --base_model $W/base --max_steps 4 --logging_steps 1 --learning_rate 3e-3
        --max_grad_norm 0 --micro_batch_size 2 --gradient_accumulation_steps 2 --ddp_deterministic true
        --val_set_size 8 --eval_steps 2"
run ddp2 2 || bad "ddp2 did not train"
run g2 4 --pipeline_parallel_size 2 || bad "g2 did not train: $(tail -2 "$W/g2.log")"
same g2 ddp2
grep -q "data parallel *2 ranks" "$W/g2.log" && ok || bad "g2: no data parallel line"
# ZeRO over each stage's data-parallel group: stage 1 (the optimizer state sharded) DDP's bits; stage 2 (gradients
# reduce-scattered every micro-batch) DDP's bits at one micro-batch per rank, in bf16 with the fp32 master copy
# sharded (the final save gathers it from the shards); a stage-2 checkpoint resumes to the same bits
run g2z1 4 --pipeline_parallel_size 2 --zero_stage 1 || bad "g2z1 did not train: $(tail -2 "$W/g2z1.log")"
same g2z1 g2
lv="--gradient_accumulation_steps 1 --bf16 true --pipeline_parallel_size 2"
run g1b 4 $lv || bad "g1b did not train"
run g1bz2 4 $lv --zero_stage 2 || bad "g1bz2 did not train: $(tail -2 "$W/g1bz2.log")"
same g1bz2 g1b
# an epoch's end: 19 micro-batches of 7 rows, the last step's one for the first pipeline alone (the second's stages
# join ZeRO-2's reduce-scatters with zero gradients): DDP's bits
lv2="--gradient_accumulation_steps 1 --micro_batch_size 7 --max_steps -1 --val_set_size 0 --pipeline_parallel_size 2"
run ep 4 $lv2 || bad "ep did not train"
run epz2 4 $lv2 --zero_stage 2 || bad "epz2 did not train: $(tail -2 "$W/epz2.log")"
grep -q "10 steps (19 micro-batches per epoch)" "$W/ep.log" && same epz2 ep ||
  bad "ep: not an epoch whose last step leaves the second pipeline without a micro-batch"
run g1bz2ck 4 $lv --zero_stage 2 --save_steps 2 --val_set_size 0 || bad "g1bz2ck did not train"
rm -rf "$W/g1bz2ck/checkpoint-4" "$W/g1bz2ck/model.safetensors"
run g1bz2ck 4 $lv --zero_stage 2 --save_steps 2 --val_set_size 0 --resume_from_checkpoint latest &&
  run g1bz2nv 4 $lv --zero_stage 2 --val_set_size 0 &&
  cmp -s "$W/g1bz2ck/model.safetensors" "$W/g1bz2nv/model.safetensors" && ok ||
  bad "a ZeRO-2 pipeline checkpoint did not resume to the run that never stopped: $(tail -2 "$W/g1bz2ck.log")"

# checkpoints keep each stage's state: resumed on as many ranks, the run that never stopped, bit for bit; on another
# number of stages, refused naming the setting
common="$W/ids.yaml $tok --base_model $W/tied --max_steps 6 --logging_steps 1 --learning_rate 3e-3
        --micro_batch_size 2 --gradient_accumulation_steps 3 --pipeline_parallel_size 3"
run ck_full 3 || bad "ck_full did not train"
run ck 3 --save_steps 2 || bad "ck did not train: $(tail -2 "$W/ck.log")"
ls "$W/ck/checkpoint-2" | grep -q "state-params.rank2.bin" && [ ! -e "$W/ck/checkpoint-2/model.safetensors" ] && ok ||
  bad "checkpoint-2: not each stage's state ($(ls "$W/ck/checkpoint-2" | tr '\n' ' '))"
rm -rf "$W/ck/checkpoint-4" "$W/ck/model.safetensors"
run ck 3 --save_steps 2 --resume_from_checkpoint latest &&
  grep -q "resumed from .*checkpoint-2 at step 2 of 6" "$W/ck.log" && ok ||
  bad "ck did not resume: $(tail -2 "$W/ck.log")"
cmp -s "$W/ck/model.safetensors" "$W/ck_full/model.safetensors" &&
  cmp -s <(cut -d, -f1-5 "$W/ck/metrics.jsonl") <(cut -d, -f1-5 "$W/ck_full/metrics.jsonl") && ok ||
  bad "the resumed run is not the run that never stopped"
run ck2 2 --pipeline_parallel_size 2 --resume_from_checkpoint "$W/ck/checkpoint-2"
[ $? -eq 2 ] && grep -q "trained with pipeline_parallel_size 3, this run has 2.*pipeline_parallel_size: 3 on as many" \
  "$W/ck2.log" && ok || bad "resume on 2 stages of a 3-stage checkpoint: $(grep -a error "$W/ck2.log" | head -1)"

# SIGTERM to every rank of 2 groups of 2 stages (bf16 with the fp32 master copy): the ranks finish the step together,
# the first group's stages write their state (the second group's is the same bytes: written once), every rank exits
# 0, and the resumed run is the run that never stopped
common="$W/ids.yaml $tok --base_model $W/base --logging_steps 1 --learning_rate 3e-3 --micro_batch_size 2
        --gradient_accumulation_steps 2 --pipeline_parallel_size 2 --ddp_deterministic true"
run sig_full 4 --bf16 true --max_steps 200 || bad "sig_full did not train"
stopped sig 4 --bf16 true --max_steps 200
st=$?
step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\) of 200.*/\1/p' "$W/sig.log")
ck="$W/sig/checkpoint-$step"
if [ $st -eq 0 ] && [ -n "$step" ] && [ -f "$ck/state-master.rank1.bin" ] && [ ! -e "$ck/state-master.rank2.bin" ]; then
  ok
  run sig 4 --bf16 true --max_steps 200 --resume_from_checkpoint latest ||
    bad "sig did not resume: $(tail -2 "$W/sig.log")"
  cmp -s "$W/sig/model.safetensors" "$W/sig_full/model.safetensors" &&
    cmp -s <(cut -d, -f1-5 "$W/sig/metrics.jsonl") <(cut -d, -f1-5 "$W/sig_full/metrics.jsonl") && ok ||
    bad "the run resumed after SIGTERM is not the run that never stopped"
else
  bad "SIGTERM to 4 ranks: exit $st, $(tail -5 "$W/sig.log")"
fi

# refused on every rank before anything is written (exit 2), naming the setting
common="$W/ids.yaml $tok --max_steps 1 --micro_batch_size 2"
refused world 3 "pipeline_parallel_size is 2 but 3 ranks run: launch a multiple of it (mpirun -np 2" \
  --model_preset tiny-llama --pipeline_parallel_size 2
refused noddp 4 "4 ranks with pipeline_parallel_size 2 form 2 data-parallel groups, but ddp is false" \
  --model_preset tiny-llama --pipeline_parallel_size 2 --ddp false
refused alone 0 "pipeline_parallel_size is 2 but 1 rank runs" --model_preset tiny-llama --pipeline_parallel_size 2
refused layers 5 "pipeline_parallel_size 5 is more than the model's 4 layers" --model_preset tiny-llama \
  --pipeline_parallel_size 5
refused split 2 "pipeline_layers '2,1' does not split the model's 4 layers into 2 stages: list 2 counts of at least" \
  --model_preset tiny-llama --pipeline_parallel_size 2 --pipeline_layers 2,1
refused split3 2 "pipeline_layers is '1,1,2'; list 2 counts of layers" --model_preset tiny-llama \
  --pipeline_parallel_size 2 --pipeline_layers 1,1,2
refused tp 4 "pipeline_parallel_size 2 with tensor_parallel_size 2 is not supported yet" --model_preset tiny-llama \
  --pipeline_parallel_size 2 --tensor_parallel_size 2
refused z3 4 "pipeline_parallel_size 2 with zero_stage 3 is not supported yet" --model_preset tiny-llama \
  --pipeline_parallel_size 2 --zero_stage 3
refused ztied 4 "pipeline_parallel_size 2 with zero_stage 1 and a tied head (tie_word_embeddings) is not supported" \
  --model_preset tiny-llama --pipeline_parallel_size 2 --zero_stage 1
refused oib 2 "pipeline_parallel_size 2 with optimizer_in_backward is not supported" --model_preset tiny-llama \
  --pipeline_parallel_size 2 --optimizer_in_backward true --max_grad_norm 0
"$SNUG" plan $common --model_preset tiny-llama --pipeline_parallel_size 2 --backend cuda > "$W/plan_gpu.log" 2>&1
[ $? -eq 2 ] && grep -q "pipeline parallelism runs on CPU ranks only for now" "$W/plan_gpu.log" && ok ||
  bad "snug plan of a pipeline on a GPU: $(tail -1 "$W/plan_gpu.log")"

finish
