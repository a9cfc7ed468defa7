#!/usr/bin/env bash
# Tensor parallelism over MPI ranks on the CPU (tensor_parallel_size: N, mpirun -np N) against one process.
# - Exact where the arithmetic is the same: with a learning rate of 1e-30 no update reaches a weight's last bit (for
#   |w| above 1e-22; none of these weights is that small), so the folder a tensor-parallel run saves (each rank's
#   slices gathered) is byte for byte the one process's, from a base model (each rank loads its slices) and from a
#   random init (each rank draws the whole model and keeps its slices); a run stopped at a checkpoint and resumed
#   on as many ranks is the run that never stopped, bit for bit.
# - Elsewhere within a bound from a noise floor measured here: the split changes the order of additions in the
#   row-parallel GEMMs and the sums over the ranks, a rounding-level change. The floor is one process started from
#   the base with every weight moved by one unit in the last place of the precision the run stores (fp32, or bf16):
#   how far a rounding-level change carries over the same steps. A tensor-parallel run's losses, gradient norms and
#   validation losses, and its final weights, must be within 10 times that floor of the one process's.
# - Each rank's arenas equal its plan, and its parameters, gradients and optimizer state are smaller than one
#   process's; the settings it cannot take are refused before anything is written.
# Skipped (77) without mpirun or an MPI build.
. "$(dirname "$0")/lib.sh"
need_mpi
. "$SRC/tests/cli/ranks.sh"
. "$SRC/tests/cli/noise_floor.sh"

text_data "$W/text.jsonl"
tok="--tokenizer $SRC/assets/tokenizer --sequence_len 48 --sample_tokens 0 --seed 5 --threads 1"
# the bases: tiny-llama (8 heads, 4 key/value heads, 768 MLP rows) after one step, tied, and with an untied lm_head
printf 'datasets:\n  - path: %s\n    type: completion\n' "$W/text.jsonl" > "$W/ids.yaml"
. "$SRC/tests/cli/untied_base.sh"

common="$W/ids.yaml $tok --base_model $W/base --max_steps 1 --micro_batch_size 2"
skip_without_mpi --tensor_parallel_size 2

# $W/biased: the untied base with attention_bias and mlp_bias: a random bias on every linear layer (q/k/v and
# gate/up biases are sliced with their rows; o_proj's and down_proj's stay whole, added once)
python3 - "$W/base" "$W/biased" <<'PY' || fatal "the biased base"
import array, json, os, random, shutil, struct, sys
src, dst = sys.argv[1:3]
shutil.copytree(src, dst)
cfg = json.load(open(os.path.join(dst, "config.json")))
cfg["attention_bias"] = cfg["mlp_bias"] = True
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
path = os.path.join(dst, "model.safetensors")
blob = open(path, "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
head, data = json.loads(blob[8:8 + n]), bytearray(blob[8 + n:])
random.seed(7)
for name, t in list(head.items()):
    if name.endswith("_proj.weight") and ".layers." in name:
        rows = t["shape"][0]
        b = array.array("f", [random.gauss(0, 0.05) for _ in range(rows)]).tobytes()
        head[name[:-len("weight")] + "bias"] = {"dtype": "F32", "shape": [rows],
                                                "data_offsets": [len(data), len(data) + len(b)]}
        data += b
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(data))
PY
# $W/v2050: the untied base with 2 more rows of vocabulary (as a padded vocabulary has): 2050 divides by 2, not by 4,
# so at 4 ranks the embedding and head stay whole on every rank
python3 - "$W/base" "$W/v2050" <<'PY' || fatal "the padded base"
import array, json, os, random, shutil, struct, sys
src, dst = sys.argv[1:3]
shutil.copytree(src, dst)
cfg = json.load(open(os.path.join(dst, "config.json")))
cfg["vocab_size"] += 2
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
path = os.path.join(dst, "model.safetensors")
blob = open(path, "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
head, data = json.loads(blob[8:8 + n]), blob[8 + n:]
random.seed(11)
out, new = bytearray(), {}
for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
    if name == "__metadata__":
        continue
    a, b = t["data_offsets"]
    raw = data[a:b]
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        raw += array.array("f", [random.gauss(0, 0.02) for _ in range(2 * t["shape"][1])]).tobytes()
        t = dict(t, shape=[t["shape"][0] + 2, t["shape"][1]])
    new[name] = dict(t, data_offsets=[len(out), len(out) + len(raw)])
    out += raw
h = json.dumps(new).encode()
h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(out))
PY
nudge "$W/base" "$W/base_f32" 0 || fatal "the nudged base"
nudge "$W/v2050" "$W/v2050_f32" 0 || fatal "the nudged base"
nudge "$W/biased" "$W/biased_f32" 0 || fatal "the nudged base"
nudge "$W/base" "$W/base_bf16" 16 || fatal "the nudged base"


common="$W/ids.yaml $tok --max_steps 6 --logging_steps 1 --learning_rate 3e-3 --lr_scheduler cosine
        --max_grad_norm 0.5 --micro_batch_size 2 --val_set_size 12 --eval_steps 3"
# fp32 from the untied base: 2 ranks (4 of 8 heads, 2 of 4 key/value heads each) and 4 (one key/value head each,
# with full checkpointing, whose recomputation repeats the sums, and accumulation)
run one 0 --base_model "$W/base" || bad "one did not train: $(tail -2 "$W/one.log")"
run one_nudged 0 --base_model "$W/base_f32" || bad "one_nudged did not train"
run tp2 2 --base_model "$W/base" --tensor_parallel_size 2 || bad "tp2 did not train: $(tail -2 "$W/tp2.log")"
near tp2 one one_nudged
run one_bias 0 --base_model "$W/biased" || bad "one_bias did not train: $(tail -2 "$W/one_bias.log")"
run one_bias_nudged 0 --base_model "$W/biased_f32" || bad "one_bias_nudged did not train"
run tp2_bias 2 --base_model "$W/biased" --tensor_parallel_size 2 ||
  bad "tp2_bias did not train: $(tail -2 "$W/tp2_bias.log")"
near tp2_bias one_bias one_bias_nudged
run one_ga 0 --base_model "$W/base" --gradient_accumulation_steps 2 || bad "one_ga did not train"
run one_ga_nudged 0 --base_model "$W/base_f32" --gradient_accumulation_steps 2 || bad "one_ga_nudged did not train"
run tp4 4 --base_model "$W/base" --tensor_parallel_size 4 --gradient_accumulation_steps 2 \
  --gradient_checkpointing true ||
  bad "tp4 did not train: $(tail -2 "$W/tp4.log")"
near tp4 one_ga one_ga_nudged
grep -q "tensor parallel *4 ranks (.*each holds 2 of 8 query heads, 1 of 4 key/value heads and 192 of 768 MLP rows" \
  "$W/tp4.log" && ok || bad "tp4: no tensor parallel line in the header: $(grep -a 'tensor parallel' "$W/tp4.log")"
[ "$(grep -c '^snug: training' "$W/tp4.log")" -eq 1 ] && ok || bad "tp4: more than one rank printed"
grep -q "vocabulary split: 1024 of 2048 rows per rank" "$W/tp2.log" && ok || bad "tp2: the vocabulary not split"
# a vocabulary that does not divide by the ranks: whole on each of them
run one_v 0 --base_model "$W/v2050" || bad "one_v did not train: $(tail -2 "$W/one_v.log")"
run one_v_nudged 0 --base_model "$W/v2050_f32" || bad "one_v_nudged did not train"
run tp4_v 4 --base_model "$W/v2050" --tensor_parallel_size 4 || bad "tp4_v did not train: $(tail -2 "$W/tp4_v.log")"
near tp4_v one_v one_v_nudged
grep -q "vocabulary whole on every rank (its size does not divide" "$W/tp4_v.log" && ok ||
  bad "tp4_v: not the whole vocabulary: $(grep -a vocabulary "$W/tp4_v.log")"
# GPT-2 (a tiny random one): its fused c_attn (file [in, out], transposed) split into the rank's q, k and v rows,
# c_fc by rows, both c_proj by columns, the position embedding and the LayerNorms whole
tiny_gpt2 "$W/gpt2" || fatal "the GPT-2 base"
nudge "$W/gpt2" "$W/gpt2_f32" 0 || bad "the nudged GPT-2 base"
run one_g 0 --base_model "$W/gpt2" || bad "one_g did not train: $(tail -2 "$W/one_g.log")"
run one_g_nudged 0 --base_model "$W/gpt2_f32" || bad "one_g_nudged did not train"
run tp2_g 2 --base_model "$W/gpt2" --tensor_parallel_size 2 || bad "tp2_g did not train: $(tail -2 "$W/tp2_g.log")"
near tp2_g one_g one_g_nudged
# bf16 with the fp32 master copy, on the tied base
run one_bf16 0 --base_model "$W/tied" --bf16 true || bad "one_bf16 did not train"
nudge "$W/tied" "$W/tied_bf16" 16 || bad "the nudged tied base"
run one_bf16_nudged 0 --base_model "$W/tied_bf16" --bf16 true || bad "one_bf16_nudged did not train"
run tp2_bf16 2 --base_model "$W/tied" --bf16 true --tensor_parallel_size 2 || bad "tp2_bf16 did not train"
near tp2_bf16 one_bf16 one_bf16_nudged

# learning_rate 1e-30: the weights as loaded (or drawn), sliced, gathered and saved: the one process's bytes
common="$W/ids.yaml $tok --max_steps 1 --learning_rate 1e-30 --micro_batch_size 2"
run load_one 0 --base_model "$W/base" || bad "load_one did not train"
run load_tp2 2 --base_model "$W/base" --tensor_parallel_size 2 || bad "load_tp2 did not train"
cmp -s "$W/load_one/model.safetensors" "$W/load_tp2/model.safetensors" && ok ||
  bad "the base loaded as 2 slices and gathered is not the base one process saves"
run load_g1 0 --base_model "$W/gpt2" || bad "load_g1 did not train"
run load_g4 4 --base_model "$W/gpt2" --tensor_parallel_size 4 || bad "load_g4 did not train"
cmp -s "$W/load_g1/model.safetensors" "$W/load_g4/model.safetensors" && ok ||
  bad "GPT-2 loaded as 4 slices (c_attn's q, k, v each split) and gathered is not the base one process saves"
# auto_fit's choice, made alike on every rank, leaves each rank its own slices
run load_fit 2 --base_model "$W/base" --tensor_parallel_size 2 --auto_fit true --memory_budget 2GB ||
  bad "load_fit did not train: $(tail -2 "$W/load_fit.log")"
cmp -s "$W/load_one/model.safetensors" "$W/load_fit/model.safetensors" && ok ||
  bad "under auto_fit the ranks did not load their own slices"
run init_one 0 --model_preset tiny-llama || bad "init_one did not train"
run init_tp4 4 --model_preset tiny-llama --tensor_parallel_size 4 || bad "init_tp4 did not train"
cmp -s "$W/init_one/model.safetensors" "$W/init_tp4/model.safetensors" && ok ||
  bad "the random init drawn as 4 slices is not one process's"
cmp -s "$W/init_one/config.json" "$W/init_tp4/config.json" && ok || bad "the saved config.json differs"

# each rank's arenas are its plan, and its share of the parameters, gradients and optimizer state smaller
python3 - "$W/tp2" "$W/one" <<'PY' && ok ||
  bad "tp2: a rank's memory is not its plan, or not smaller than one process's"
import json, sys
tp, one = sys.argv[1:3]
ref = json.load(open(f"{one}/memory.json"))
for f in ("memory.json", "memory.rank1.json"):
    m = json.load(open(f"{tp}/{f}"))
    if m["plan"] != m["measured"]:
        sys.exit(f"  {f}: planned {m['plan']} measured {m['measured']}")
    for c in ("parameters", "gradients", "optimizer state"):
        if not m["measured"][c] < ref["measured"][c]:
            sys.exit(f"  {f}: {c} {m['measured'][c]} not under one process's {ref['measured'][c]}")
print(f"  tp2 per rank: parameters {m['measured']['parameters']} bytes against {ref['measured']['parameters']}")
PY

# checkpoints keep each rank's slices: resumed on as many ranks, the run that never stopped, bit for bit; on
# another number of ranks or as one process, refused naming the setting
common="$W/ids.yaml $tok --base_model $W/base --max_steps 6 --logging_steps 1 --learning_rate 3e-3
        --micro_batch_size 2 --tensor_parallel_size 2"
run ck_full 2 || bad "ck_full did not train"
run ck 2 --save_steps 2 || bad "ck did not train: $(tail -2 "$W/ck.log")"
ls "$W/ck/checkpoint-2" | grep -q "state-params.rank1.bin" && [ ! -e "$W/ck/checkpoint-2/model.safetensors" ] && ok ||
  bad "checkpoint-2: not each rank's slices ($(ls "$W/ck/checkpoint-2" | tr '\n' ' '))"
rm -rf "$W/ck/checkpoint-4" "$W/ck/model.safetensors"
run ck 2 --save_steps 2 --resume_from_checkpoint latest &&
  grep -q "resumed from .*checkpoint-2 at step 2 of 6" "$W/ck.log" &&
  ok || bad "ck did not resume: $(tail -2 "$W/ck.log")"
cmp -s "$W/ck/model.safetensors" "$W/ck_full/model.safetensors" && ok || bad "the resumed run's weights differ"
cmp -s <(cut -d, -f1-5 "$W/ck/metrics.jsonl") <(cut -d, -f1-5 "$W/ck_full/metrics.jsonl") && ok ||
  bad "the resumed run's losses differ"
run ck4 4 --tensor_parallel_size 4 --resume_from_checkpoint "$W/ck/checkpoint-2"
[ $? -eq 2 ] &&
  grep -q "trained with tensor_parallel_size 2, this run has 4.*tensor_parallel_size: 2 on as many ranks" \
  "$W/ck4.log" && ok || bad "resume on 4 ranks of a 2-rank checkpoint: $(grep -a error "$W/ck4.log" | head -1)"
"$SNUG" train $common --tensor_parallel_size 1 --output_dir "$W/ck1" --resume_from_checkpoint "$W/ck/checkpoint-2" \
  > "$W/ck1.log" 2>&1
[ $? -eq 2 ] && grep -q "trained with tensor_parallel_size 2, this run has 1" "$W/ck1.log" && ok ||
  bad "resume as one process of a 2-rank checkpoint: $(tail -1 "$W/ck1.log")"

# data parallel beside tensor parallelism: 2 groups of 2 ranks (4 ranks) against one group accumulating both groups'
# micro-batches: the same bits (ddp_deterministic), on test_ddp's data, where every gradient element receives one
# addition per micro-batch (each id once, an untied model: see test_ddp.sh); with evaluation split over the groups.
# Its checkpoint (every rank's slices) resumes on as many ranks to the same bits, and on 2 is refused
. "$SRC/tests/cli/ids_data.sh"
common="$W/ids.yaml $tok --base_model $W/base --max_steps 6 --logging_steps 1 --learning_rate 3e-3
        --max_grad_norm 0.5 --micro_batch_size 2 --tensor_parallel_size 2 --val_set_size 8 --eval_steps 3"
run g1 2 --gradient_accumulation_steps 2 || bad "g1 did not train: $(tail -2 "$W/g1.log")"
run g2 4 --ddp_deterministic true || bad "g2 did not train: $(tail -2 "$W/g2.log")"
cmp -s "$W/g1/model.safetensors" "$W/g2/model.safetensors" && ok || bad "g2: the weights differ from g1's"
cmp -s <(cut -d, -f1-5 "$W/g1/metrics.jsonl") <(cut -d, -f1-5 "$W/g2/metrics.jsonl") &&
  [ "$(grep -c val_loss "$W/g2/metrics.jsonl")" -eq 2 ] && ok || bad "g2: the losses differ from g1's"
grep -q "data parallel *2 ranks" "$W/g2.log" && grep -q "tensor parallel *2 ranks" "$W/g2.log" && ok ||
  bad "g2: not 2 data-parallel groups of 2 tensor-parallel ranks"
run g2ck 4 --ddp_deterministic true --save_steps 2 || bad "g2ck did not train: $(tail -2 "$W/g2ck.log")"
rm -rf "$W/g2ck/checkpoint-4" "$W/g2ck/model.safetensors"
run g2ck 4 --ddp_deterministic true --save_steps 2 --resume_from_checkpoint latest &&
  cmp -s "$W/g2ck/model.safetensors" "$W/g2/model.safetensors" && ok || bad "g2ck did not resume to g2's weights"
# ZeRO over the data-parallel groups beside tensor parallelism: stages 1 to 3 (each rank's slices' optimizer state,
# from stage 2 their gradients, at stage 3 their parameters, sharded over its data-parallel group) give DDP's bits,
# in fp32 and in bf16 with the master copy sharded too (the final save gathers each slice from the shards, then the
# slices), with evaluation; each rank's arenas are its plan, its optimizer state about half DDP's (and at stage 3 its
# parameters less); a stage-2 checkpoint resumes to the same bits
for dt in f32 bf16; do
  x=()
  [ $dt = bf16 ] && x=(--bf16 true)
  run zddp_$dt 4 --ddp_deterministic true "${x[@]}" || bad "zddp_$dt did not train"
  for z in 1 2 3; do
    run z${z}_$dt 4 --ddp_deterministic true "${x[@]}" --zero_stage $z ||
      bad "z${z}_$dt did not train: $(tail -2 "$W/z${z}_$dt.log")"
    cmp -s "$W/z${z}_$dt/model.safetensors" "$W/zddp_$dt/model.safetensors" &&
      cmp -s <(cut -d, -f1-5 "$W/z${z}_$dt/metrics.jsonl") <(cut -d, -f1-5 "$W/zddp_$dt/metrics.jsonl") && ok ||
      bad "z${z}_$dt: not DDP's bits beside tensor parallelism"
  done
done
python3 - "$W" <<'PY' && ok || bad "ZeRO beside tensor parallelism: a rank's memory is not its plan, or not sharded"
import json, sys
w = sys.argv[1]
for r in range(4):
    f = "memory.json" if r == 0 else f"memory.rank{r}.json"
    ddp, z = (json.load(open(f"{w}/{run}/{f}")) for run in ("zddp_f32", "z2_f32"))
    if z["plan"] != z["measured"]:
        sys.exit(f"  rank {r}: planned {z['plan']} measured {z['measured']}")
    o, od = z["measured"]["optimizer state"], ddp["measured"]["optimizer state"]
    if not 0.45 * od < o < 0.55 * od or not z["measured"]["gradients"] < ddp["measured"]["gradients"]:
        sys.exit(f"  rank {r}: optimizer state {o} against DDP's {od}")
    z3 = json.load(open(f"{w}/z3_f32/{f}"))
    if z3["plan"] != z3["measured"] or not z3["measured"]["parameters"] < ddp["measured"]["parameters"]:
        sys.exit(f"  rank {r}: stage 3 planned {z3['plan']} measured {z3['measured']}")
print(f"  ZeRO-2 beside tensor parallelism: optimizer state {o} bytes per rank against DDP's {od}")
PY
run zck 4 --ddp_deterministic true --bf16 true --zero_stage 2 --save_steps 2 || bad "zck did not train"
[ -f "$W/zck/checkpoint-2/state-optim.rank3.bin" ] && ok || bad "zck: not every rank's shard of its slices' state"
rm -rf "$W/zck/checkpoint-4" "$W/zck/model.safetensors"
run zck 4 --ddp_deterministic true --bf16 true --zero_stage 2 --save_steps 2 --resume_from_checkpoint latest &&
  cmp -s "$W/zck/model.safetensors" "$W/z2_bf16/model.safetensors" && ok ||
  bad "zck did not resume to z2_bf16's weights"
# SIGTERM to every rank of 2 groups of 2 (bf16 with the fp32 master copy): the ranks finish the step together, the
# first group's ranks write their slices' state (the second group's is the same bytes: written once), every rank
# exits 0, and the resumed run is the run that never stopped
run sig_full 4 --bf16 true --max_steps 200 --val_set_size 0 || bad "sig_full did not train"
stopped sig 4 --bf16 true --max_steps 200 --val_set_size 0
st=$?
step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\) of 200.*/\1/p' "$W/sig.log")
ck="$W/sig/checkpoint-$step"
if [ $st -eq 0 ] && [ -n "$step" ] && [ -f "$ck/state-master.rank1.bin" ] && [ ! -e "$ck/state-master.rank2.bin" ]; then
  ok
  run sig 4 --bf16 true --max_steps 200 --val_set_size 0 --resume_from_checkpoint latest ||
    bad "sig did not resume: $(tail -2 "$W/sig.log")"
  cmp -s "$W/sig/model.safetensors" "$W/sig_full/model.safetensors" &&
    cmp -s <(cut -d, -f1-5 "$W/sig/metrics.jsonl") <(cut -d, -f1-5 "$W/sig_full/metrics.jsonl") && ok ||
    bad "the run resumed after SIGTERM is not the run that never stopped"
else
  bad "SIGTERM to 4 ranks: exit $st, $(tail -5 "$W/sig.log")"
fi
# the optimizer step inside backward (each layer stepped as its backward ends; no clipping): the bits of the step
# after backward, for one group and for two
for np in 2 4; do
  run oib_ref$np $np --ddp_deterministic true --max_grad_norm 0 || bad "oib_ref$np did not train"
  run oib$np $np --ddp_deterministic true --max_grad_norm 0 --optimizer_in_backward true ||
    bad "oib$np did not train: $(tail -2 "$W/oib$np.log")"
  cmp -s "$W/oib$np/model.safetensors" "$W/oib_ref$np/model.safetensors" &&
    cmp -s <(cut -d, -f1-5 "$W/oib$np/metrics.jsonl") <(cut -d, -f1-5 "$W/oib_ref$np/metrics.jsonl") && ok ||
    bad "oib$np: not the bits of the step after backward"
done
run g1ck 2 --gradient_accumulation_steps 2 --resume_from_checkpoint "$W/g2ck/checkpoint-2"
[ $? -eq 2 ] && grep -q "trained as 2 data-parallel groups of tensor_parallel_size 2 ranks, this run has 1" \
  "$W/g1ck.log" && ok || bad "a 4-rank checkpoint resumed on 2: $(grep -a error "$W/g1ck.log" | head -1)"

# refused on every rank before anything is written (exit 2), naming the setting
common="$W/ids.yaml $tok --max_steps 1 --micro_batch_size 2"
refused heads3 3 "tensor_parallel_size 3 does not divide the model's num_attention_heads (8)" \
  --model_preset tiny-llama --tensor_parallel_size 3
refused world 3 "tensor_parallel_size is 2 but 3 ranks run: launch a multiple of it (mpirun -np 2" \
  --model_preset tiny-llama --tensor_parallel_size 2
refused noddp 4 "4 ranks with tensor_parallel_size 2 form 2 data-parallel groups, but ddp is false" \
  --model_preset tiny-llama --tensor_parallel_size 2 --ddp false
refused alone 0 "tensor_parallel_size is 2 but 1 rank runs" --model_preset tiny-llama --tensor_parallel_size 2
refused lora 2 "tensor_parallel_size 2 with adapter lora is not supported" --base_model "$W/tied" --adapter lora \
  --tensor_parallel_size 2
refused zero 4 "tensor_parallel_size 2 with zero_stage 3 and optimizer_in_backward is not supported yet" \
  --model_preset tiny-llama --tensor_parallel_size 2 --zero_stage 3 --optimizer_in_backward true --max_grad_norm 0

finish
