#!/usr/bin/env bash
# ZeRO over MPI ranks on the CPU against DDP at the same ranks, with the gradients summed in rank order
# (ddp_deterministic). Stage 1 (optimizer state sharded): the logged losses and gradient norms and the final weights
# are DDP's bits at 2 and 3 ranks, with AdamW, 8-bit AdamW (paged and not), bf16 storage (with the fp32 master copy
# sharded, and without one), fp16 and accumulation. Stage 2
# (gradients too, reduce-scattered layer by layer in every micro-batch's backward): DDP's bits without accumulation,
# also over a whole epoch whose last step leaves ranks without a micro-batch; with accumulation each rank's shard
# sums micro-batch by micro-batch ((g0a + g1a) + (g0b + g1b)) where DDP sums each rank's first, so the two differ by
# fp32 rounding, bounded by the rounding of another reordering of the same sums measured here (one process
# accumulating all the micro-batches against DDP). Each rank's measured arenas equal its plan (memory.json for rank 0,
# memory.rankR.json for the others); the optimizer arena is DDP's split N ways (exactly for fp32 state; with 8-bit
# state plus each rank's copy of the quantization maps and its buffers' alignment), and at stage 2 the gradients
# arena is the shared layer buffer, the global tensors' and the rank's shard, less than DDP's. Checkpoints: every
# rank writes its shard files, and a run saved and resumed (or stopped by SIGTERM to every rank and resumed) on as
# many ranks at the same stage is the run that never stopped, bit for bit, at stages 1 and 2 with AdamW, 8-bit (paged)
# AdamW and bf16 with the sharded master copy. On another split of the ranks (another number of ranks at the same
# micro-batches per step, one process, another of stages 0 to 2) each rank assembles its shard from the files that
# hold its range: the runs resumed from a ZeRO checkpoint and from DDP's are the same bits, stage 3 from 3 ranks to 2
# stage 2's; a split that would change the data per step, stage 3 to another stage and a 16-bit DDP checkpoint's
# master copy under ZeRO, and a damaged or missing shard file are refused (exit 2) on every rank. Stage 3 (the parameters too: each layer
# all-gathered before its forward and backward, the global tensors before the embedding and the loss): DDP's bits at
# 2 and 3 ranks, fp32 and bf16 with the master copy, with gradient checkpointing, with evaluation and over the epoch
# whose last step leaves ranks idle (they join the gathers), and loading a Hugging Face folder; with accumulation
# stage 2's bits (the same sums in the same order); the parameters arena of each rank is its shard plus the gather
# region the header names, the shards summing to DDP's arena. Stage-3 checkpoints hold each rank's shard of the
# parameters too (and no model files): saved and resumed (or stopped by SIGTERM and resumed) on as many ranks, the run
# that never stopped, bit for bit, fp32 at 2 and 3 ranks and bf16 with the master copy at 3. The final save failing on rank 0 alone (the disk full mid-stream, a folder where a file goes)
# ends every rank at once with exit 1, each naming the file. LoRA and QLoRA at stage 3 (the frozen base, or its 4-bit
# matrices, sharded) give DDP's bits and resume. The settings not built are refused (exit 2) naming the
# key. Skipped (77) without mpirun or an MPI
# build.
. "$(dirname "$0")/lib.sh"
need_mpi
. "$SRC/tests/cli/ranks.sh"

# the data of test_ddp.sh: every id once, so DDP itself is the bits of one process (see there); here the reference
# is DDP, which sums the same gradients, so any data would do, and this keeps the two tests' runs comparable
. "$SRC/tests/cli/ids_data.sh"
common="$W/ids.yaml --tokenizer $SRC/assets/tokenizer --sequence_len 32 --sample_tokens 0 --seed 5 --threads 1
        --max_steps 3 --logging_steps 1 --learning_rate 3e-3 --lr_scheduler cosine --max_grad_norm 0.5
        --micro_batch_size 2 --ddp_deterministic true"

skip_without_mpi --max_steps 1

# worst NAME REF: the largest relative difference of the logged losses and gradient norms
worst() {
  python3 - "$W/$1/metrics.jsonl" "$W/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(p))] for p in sys.argv[1:3])
assert len(a) == len(b) and a, (a, b)
print(max(abs(x - y) / abs(y) for p, q in zip(a, b) for x, y in zip(p, q)))
PY
}

# same_as_ddp STAGE NAME NP ARGS...: DDP and ZeRO-STAGE at NP ranks with ARGS give the same bits (or, with TOL set, losses
# and gradient norms within TOL); each ZeRO rank's arenas are its plan, its optimizer arena DDP's split NP ways
same_as_ddp() {
  local stage=$1 name=$2 np=$3; shift 3
  [ -f "$W/ddp_$name.log" ] || run "ddp_$name" "$np" "$@" ||
    { bad "ddp_$name did not train: $(tail -2 "$W/ddp_$name.log")"; return; }
  local z="zero${stage}_$name"
  run "$z" "$np" --zero_stage "$stage" --dist_debug true "$@" || { bad "$z did not train: $(tail -2 "$W/$z.log")"; return; }
  if [ -n "${TOL:-}" ]; then
    local d
    d=$(worst "$z" "ddp_$name")
    python3 -c "import sys; sys.exit(0 if $d <= $TOL else 1)" && ok || bad "$z: worst relative difference $d over $TOL"
    echo "  $z against DDP: worst relative difference $d (bound $TOL)"
  else
    [ "$(worst "$z" "ddp_$name")" = 0.0 ] && ok || bad "$z: the losses or gradient norms differ from DDP's"
    cmp -s "$W/ddp_$name/model.safetensors" "$W/$z/model.safetensors" && ok || bad "$z: the weights differ from DDP's"
  fi
  grep -q "ZeRO *stage $stage" "$W/$z.log" && ok || bad "$z: no ZeRO line in the header"
  local region
  region=$(sed -n 's/.*ZeRO-3 gathers *into one region of \([0-9]*\) elements.*/\1/p' "$W/$z.log")
  python3 - "$W" "$name" "$np" "$stage" "${region:-0}" <<'PY' && ok || bad "$z: the memory per rank"
import json, sys
w, name, n, stage, region = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ddp = json.load(open(f"{w}/ddp_{name}/memory.json"))
ranks = [json.load(open(f"{w}/zero{stage}_{name}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json"))) for r in range(n)]
err = []
for r, j in enumerate(ranks):
    if j["plan"] != j["measured"]:
        err.append(f"rank {r}: measured {j['measured']} against the plan {j['plan']}")
    if j.get("ranks") != {"size": n, "rank": r, "zero_stage": stage}:
        err.append(f"rank {r}: memory.json says {j.get('ranks')}")
    for c in j["plan"]:
        if c == "parameters" and stage == 3:
            continue
        if c not in ("optimizer state", "workspace", "gradients", "master weights") and j["plan"][c] != ddp["plan"][c]:
            err.append(f"rank {r}: {c} {j['plan'][c]} where DDP plans {ddp['plan'][c]}")
    g, gd = j["plan"]["gradients"], ddp["plan"]["gradients"]
    if (stage == 1 and g != gd) or (stage >= 2 and not g < gd):
        err.append(f"rank {r}: gradients {g} against DDP's {gd} at stage {stage}")
opt = [j["plan"]["optimizer state"] for j in ranks]
whole = ddp["plan"]["optimizer state"]
eight = "8bit" in ddp["optimizer"]
paged = ddp["optimizer"].startswith("paged")
# every rank carries the two 256-entry maps of 8-bit AdamW (in the workspace when paged); each of its six state
# buffers may round up to the arena's 64-byte alignment
extra = (n - 1) * 2048 if eight and not paged else 0
if not 0 <= sum(opt) - whole - extra <= n * 6 * 64:
    err.append(f"the ranks' optimizer arenas {opt} sum to {sum(opt)}, DDP's is {whole} (+{extra} of maps)")
if not eight:  # fp32 state, 8 bytes per element: each shard is 1/N of the elements, give or take a block of 256
    for r, b in enumerate(opt):
        if abs(b - whole / n) > 257 * 8:
            err.append(f"rank {r}: optimizer arena {b}, not 1/{n} of {whole}")
# the fp32 master copy (16-bit storage): the rank's shard, 4 bytes per element, the shards summing to DDP's
mas = [j["plan"]["master weights"] for j in ranks]
whole_m = ddp["plan"]["master weights"]
if whole_m and (not 0 <= sum(mas) - whole_m <= n * 64 or max(abs(b - whole_m / n) for b in mas) > 257 * 4):
    err.append(f"the ranks' master copies {mas} against DDP's {whole_m}")
# ZeRO-3: the parameters arena is the rank's shard (1/N of DDP's, give or take a block of 256) and the gather region
if stage == 3:
    es = 4 if ddp["precision"] == "fp32" else 2
    par = [j["plan"]["parameters"] - region * es for j in ranks]
    whole_p = ddp["plan"]["parameters"]
    if not region or not 0 <= sum(par) - whole_p <= n * 128 or max(abs(b - whole_p / n) for b in par) > 257 * es:
        err.append(f"the ranks' parameter shards {par} (arenas less the region of {region}) against DDP's {whole_p}")
    print(f"  stage 3: parameter arenas {[j['plan']['parameters'] for j in ranks]} = shard + region of {region * es} B; DDP's {whole_p}")
print(f"  stage {stage}: master {mas} against DDP's {whole_m}; optimizer state per rank {opt} against DDP's {whole}; gradients "
      f"{[j['plan']['gradients'] for j in ranks]} against {ddp['plan']['gradients']}")
sys.exit("\n".join(err) if err else 0)
PY
}

same_as_ddp 1 adamw2 2
same_as_ddp 1 adamw3 3
same_as_ddp 1 q8_2 2 --optimizer adamw_8bit
same_as_ddp 1 paged8_bf16_3 3 --optimizer paged_adamw_8bit --bf16 true --master_weights false
same_as_ddp 1 bf16_2 2 --bf16 true --master_weights false
same_as_ddp 1 bf16m_3 3 --bf16 true
same_as_ddp 1 accum_q8_3 3 --optimizer adamw_8bit --gradient_accumulation_steps 2
# the gradients reduce-scattered in buckets during backward: ranks 2 and 3, idle in the epoch's last step, join the
# same buckets with zeros
same_as_ddp 1 epoch4 4 --num_epochs 1 --max_steps -1 --max_grad_norm 0
same_as_ddp 1 b1_3 3 --ddp_bucket_cap_mb 1
same_as_ddp 2 adamw2 2
same_as_ddp 2 adamw3 3
same_as_ddp 2 paged8_bf16_3 3 --optimizer paged_adamw_8bit --bf16 true --master_weights false
same_as_ddp 2 bf16m_2 2 --bf16 true
same_as_ddp 2 fp16_2 2 --fp16 true --optimizer adamw_8bit
# a whole epoch of 66 micro-batches on 4 ranks: the last step has 2, so ranks 2 and 3 join its reduce-scatters with
# zeros
same_as_ddp 2 epoch4 4 --num_epochs 1 --max_steps -1 --max_grad_norm 0
# stage 3: the parameters sharded too; every rank gathers each layer before its forward and its backward
same_as_ddp 3 adamw2 2
same_as_ddp 3 adamw3 3
same_as_ddp 3 bf16m_2 2 --bf16 true
same_as_ddp 3 bf16m_3 3 --bf16 true
# 16-bit without master weights: the 16-bit shards stepped with stochastic rounding, saved as stored (BF16, DDP's
# bytes): each tensor's 16-bit pieces gathered and widened for the stream, which writes them back to 16 bits exactly
same_as_ddp 3 bf16_2 2 --bf16 true --master_weights false
grep -q '"torch_dtype": "bfloat16"' "$W/zero3_bf16_2/config.json" && ok || bad "zero3_bf16_2: config.json's torch_dtype"
same_as_ddp 3 gc_2 2 --gradient_checkpointing true
same_as_ddp 3 gcbf16_3 3 --bf16 true --gradient_checkpointing true
# evaluation: a rank runs its share of the validation micro-batches and joins the others' gathers
same_as_ddp 3 val_3 3 --val_set_size 0.1 --eval_steps 2
[ -n "$(grep val_loss "$W/zero3_val_3/metrics.jsonl")" ] &&
  [ "$(grep -o '"val_loss": [^,}]*' "$W/zero3_val_3/metrics.jsonl")" = "$(grep -o '"val_loss": [^,}]*' "$W/ddp_val_3/metrics.jsonl")" ] &&
  ok || bad "zero3_val_3: the validation losses differ from DDP's"
same_as_ddp 3 epoch4 4 --num_epochs 1 --max_steps -1 --max_grad_norm 0
# loading a Hugging Face folder: each rank keeps its shard of every tensor (staged in the gather region)
same_as_ddp 3 load_3 3 --base_model "$W/ddp_adamw3" --max_steps 2
# an untied head: its gradient and the final norm's are reduce-scattered right after the loss, so one buffer of
# max(embedding, final norm + head, a layer) serves them, the layers and the embedding in turn (stages 2 and 3), and
# stage 3 gathers the embedding and the head one at a time into a region of max(embedding, head, two layers)
tok="--tokenizer $SRC/assets/tokenizer --sequence_len 32 --sample_tokens 0 --seed 5 --threads 1"
. "$SRC/tests/cli/untied_base.sh"
same_as_ddp 2 untied_2 2 --base_model "$W/base"
same_as_ddp 3 untied_3 3 --base_model "$W/base"
same_as_ddp 3 untiedbf16_2 2 --base_model "$W/base" --bf16 true
same_as_ddp 3 untiedval_2 2 --base_model "$W/base" --val_set_size 0.1 --eval_steps 2
for z in zero2_untied_2 zero3_untied_3 zero3_untiedbf16_2; do
  python3 - "$W" "$z" "$W/base/config.json" <<'PY' && ok || bad "$z: the gradient buffer or the gather region"
import json, re, sys
w, z, cfg = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
C, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
kv = C // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
layer = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * I
pre, post = V * C, V * C + C
total = pre + post + L * layer
n = int(z.rsplit("_", 1)[1][-1])
stage = int(z[4])
for r in range(n):
    j = json.load(open(f"{w}/{z}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json")))
    g = j["plan"]["gradients"] - max(pre, post, layer) * 4  # what is left: the rank's shard of the sum
    if abs(g - total * 4 / n) > 257 * 4:
        sys.exit(f"rank {r}: gradients {j['plan']['gradients']} B: {g} B beside one buffer of max({pre}, {post}, "
                 f"{layer}) floats, not a 1/{n} shard of {total}")
if stage == 3:
    m = re.search(r"one region of (\d+) elements: two layer buffers of (\d+), or the (\d+) global", open(f"{w}/{z}.log").read())
    region, lay, glob = map(int, m.groups())
    if glob != max(pre, post) or region != max(glob, 2 * lay):
        sys.exit(f"the region {region} (layers {lay}, globals {glob}) is not max(embedding {pre}, head {post}, two layers)")
print(f"  {z}: gradients one buffer of max({pre}, {post}, {layer}) floats and the shard")
PY
done
# zero_overlap_comm: each layer's reduce-scatter is issued beside the next layer's backward, from a second layer
# buffer (layer 0's at once: the embeddings' gradients share its buffer). The host communicator completes each one as
# it is issued, so on CPU ranks this checks the layout and the order of the adds (DDP's bits, tied and untied, at
# stages 2 and 3) and the plan: each rank's gradients arena is the one-buffer run's plus one layer of fp32, to the
# arena's alignment. test_zero2_overlap runs the hooks against a communicator that delivers only at the wait.
same_as_ddp 2 ov_3 3 --zero_overlap_comm true
same_as_ddp 3 ovgc_2 2 --zero_overlap_comm true --gradient_checkpointing true
same_as_ddp 2 ovuntied_2 2 --base_model "$W/base" --zero_overlap_comm true
same_as_ddp 3 ovuntiedbf16_2 2 --base_model "$W/base" --zero_overlap_comm true --bf16 true
same_as_ddp 2 ovepoch4 4 --zero_overlap_comm true --num_epochs 1 --max_steps -1 --max_grad_norm 0
for pair in zero2_ov_3:zero2_adamw3 zero3_ovgc_2:zero3_gc_2 zero2_ovuntied_2:zero2_untied_2 \
            zero3_ovuntiedbf16_2:zero3_untiedbf16_2 zero2_ovepoch4:zero2_epoch4; do
  ov=${pair%%:*} one=${pair##*:}
  grep -q "each beside the next layer's (zero_overlap_comm: two layer buffers)" "$W/$ov.log" && ok ||
    bad "$ov: the header does not name the overlap"
  python3 - "$W" "$ov" "$one" <<'PY' && ok || bad "$ov: the gradients arena against $one's"
import json, struct, sys
w, ov, one = sys.argv[1:4]
head = open(f"{w}/{ov}/model.safetensors", "rb")
meta = json.loads(head.read(struct.unpack("<Q", head.read(8))[0]))
layer = 0
for k, v in meta.items():
    if ".layers.0." in k:
        n = 1
        for d in v["shape"]:
            n *= d
        layer += n
ranks = int(ov.rsplit("_", 1)[1][-1])
for r in range(ranks):
    f = "memory.json" if r == 0 else f"memory.rank{r}.json"
    a, b = (json.load(open(f"{w}/{x}/{f}"))["plan"] for x in (ov, one))
    d = a["gradients"] - b["gradients"]
    if not 0 <= d - 4 * layer < 64 or any(a[c] != b[c] for c in a if c != "gradients"):
        sys.exit(f"rank {r}: gradients {a['gradients']} against {b['gradients']} with one buffer: {d} B more, "
                 f"not one layer of {layer} floats")
print(f"  {ov}: one layer of {layer} floats more gradients per rank than {one}")
PY
done
# accumulation: the floor is how far other orders of the same sums move the logged numbers: one process accumulating
# 6 micro-batches against DDP's 3 x 2 and 2 x 3, and at least one step of the printed gradient norm's last digit;
# stage 2 reorders them once more
"$SNUG" train $common --gradient_accumulation_steps 6 --output_dir "$W/one6" > "$W/one6.log" 2>&1 ||
  bad "one6 did not train: $(tail -2 "$W/one6.log")"
run ddp_accum3 3 --gradient_accumulation_steps 2 || bad "ddp_accum3 did not train"
run ddp_accum2 2 --gradient_accumulation_steps 3 || bad "ddp_accum2 did not train"
floor=$(python3 - "$W" "$(worst ddp_accum3 one6)" "$(worst ddp_accum2 one6)" <<'PY'
import json, sys
digit = 1e-6 / min(r["grad_norm"] for r in map(json.loads, open(sys.argv[1] + "/one6/metrics.jsonl")))
print(max(float(sys.argv[2]), float(sys.argv[3]), digit))
PY
)
echo "  floor: other orders of the same sums move the losses and gradient norms by $floor (relative)"
TOL=$(python3 -c "print(4 * $floor)") same_as_ddp 2 accum3 3 --gradient_accumulation_steps 2
TOL=$(python3 -c "print(4 * $floor)") same_as_ddp 2 accum2 2 --gradient_accumulation_steps 3
# the untied head's shared gradient buffer, reused by every micro-batch
TOL=$(python3 -c "print(4 * $floor)") same_as_ddp 2 untiedacc_3 3 --base_model "$W/base" --gradient_accumulation_steps 2
# stage 3 with accumulation reduce-scatters every micro-batch as stage 2 does: stage 2's bits
for a in "accum3 3 2" "accum2 2 3"; do
  set -- $a
  run "zero3_$1" "$2" --zero_stage 3 --dist_debug true --gradient_accumulation_steps "$3" ||
    bad "zero3_$1 did not train: $(tail -2 "$W/zero3_$1.log")"
  [ "$(worst "zero3_$1" "zero2_$1")" = 0.0 ] && cmp -s "$W/zero2_$1/model.safetensors" "$W/zero3_$1/model.safetensors" &&
    ok || bad "zero3_$1: not stage 2's bits with accumulation"
done
run zero3_accbf16 2 --zero_stage 3 --bf16 true --gradient_accumulation_steps 2 || bad "zero3_accbf16 did not train"
run zero2_accbf16 2 --zero_stage 2 --bf16 true --gradient_accumulation_steps 2 || bad "zero2_accbf16 did not train"
[ "$(worst zero3_accbf16 zero2_accbf16)" = 0.0 ] && cmp -s "$W/zero2_accbf16/model.safetensors" "$W/zero3_accbf16/model.safetensors" &&
  ok || bad "zero3_accbf16: not stage 2's bits with bf16 and accumulation"
# loss_vocab_block: the loss over blocks of the head's rows. tiny-llama's 2048 rows fit one layer's buffer, so its
# default is one block, which is the plain loss's arithmetic (every run above); 300 rows make 7 blocks, the last
# partial. DDP with the same blocks is the reference. Under ZeRO-2/3 the tied embedding is split by rows: each
# block's gradient is reduced as soon as it is complete, except the rows some rank's micro-batch looks up, which wait
# for the embedding's backward; ZeRO-3 gathers one block at a time and only the looked-up rows. On data whose ids
# repeat within and across ranks (so those rows sum several ranks' lookups), DDP's bits at 2 and 3 ranks, in bf16,
# with evaluation, over an epoch with idle ranks; with accumulation within the floor.
python3 - "$W/rep.jsonl" <<'PY'
import json, random, sys
random.seed(11)
with open(sys.argv[1], "w") as f:
    for _ in range(64):
        ex = [random.randint(1, 120) for _ in range(random.randint(8, 32))]
        f.write(json.dumps({"input_ids": ex, "labels": ex}) + "\n")
PY
printf 'datasets:\n  - path: %s\n    type: pretokenized\n' "$W/rep.jsonl" > "$W/rep.yaml"
common_ids=$common
common=${common/ids.yaml/rep.yaml}
vb="--loss_vocab_block 300"
same_as_ddp 2 vb_2 2 $vb
same_as_ddp 2 vb_3 3 $vb
same_as_ddp 3 vb_2 2 $vb
same_as_ddp 3 vb_3 3 $vb
same_as_ddp 3 vbbf16_3 3 $vb --bf16 true
same_as_ddp 3 vbval_2 2 $vb --val_set_size 0.1 --eval_steps 2
same_as_ddp 2 vbepoch_3 3 $vb --num_epochs 1 --max_steps -1 --max_grad_norm 0 --micro_batch_size 3
same_as_ddp 3 vbepoch_3 3 $vb --num_epochs 1 --max_steps -1 --max_grad_norm 0 --micro_batch_size 3
# accumulation: the floor measured again on these data, whose rows sum many more terms
"$SNUG" train $common $vb --gradient_accumulation_steps 6 --output_dir "$W/vbone6" > "$W/vbone6.log" 2>&1 ||
  bad "vbone6 did not train: $(tail -2 "$W/vbone6.log")"
run ddp_vbacc6_3 3 $vb --gradient_accumulation_steps 2 || bad "ddp_vbacc6_3 did not train"
run ddp_vbacc6_2 2 $vb --gradient_accumulation_steps 3 || bad "ddp_vbacc6_2 did not train"
vbfloor=$(python3 - "$W" "$(worst ddp_vbacc6_3 vbone6)" "$(worst ddp_vbacc6_2 vbone6)" <<'PY'
import json, sys
digit = 1e-6 / min(r["grad_norm"] for r in map(json.loads, open(sys.argv[1] + "/vbone6/metrics.jsonl")))
print(max(float(sys.argv[2]), float(sys.argv[3]), digit))
PY
)
echo "  floor on the repeated ids: $vbfloor (relative)"
TOL=$(python3 -c "print(4 * $vbfloor)") same_as_ddp 2 vbacc_3 3 $vb --gradient_accumulation_steps 2
run zero3_vbacc_3 3 --zero_stage 3 --dist_debug true $vb --gradient_accumulation_steps 2 ||
  bad "zero3_vbacc_3 did not train: $(tail -2 "$W/zero3_vbacc_3.log")"
[ "$(worst zero3_vbacc_3 zero2_vbacc_3)" = 0.0 ] && cmp -s "$W/zero2_vbacc_3/model.safetensors" "$W/zero3_vbacc_3/model.safetensors" &&
  ok || bad "zero3_vbacc_3: not stage 2's bits with accumulation"
for z in zero2_vb_2 zero2_vb_3 zero3_vb_2 zero3_vb_3; do
  grep -q "loss *over blocks of 300 of the head's 2048 rows.*the tied embedding" "$W/$z.log" && ok ||
    bad "$z: the header does not name the blocked loss"
done
# the memory: the gradients arena is the rank's shard beside the layers' buffer and the looked-up rows (at most
# ranks x 2 x 32 of them), not the embedding's gradient whole; the ZeRO-3 region holds two layers, or the globals
# left (the final norm) and a block or the looked-up rows
cfgj="$W/ddp_adamw2/config.json"
for z in zero2_vb_2 zero2_vb_3 zero3_vb_2 zero3_vb_3; do
  python3 - "$W" "$z" "$cfgj" <<'PY' && ok || bad "$z: the gradient buffer or the gather region"
import json, re, sys
w, z, cfg = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
C, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
kv = C // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
layer = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * I
total = V * C + C + L * layer
n, stage = int(z[-1]), int(z[4])
umax = min(V, n * 2 * 32)
for r in range(n):
    j = json.load(open(f"{w}/{z}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json")))
    g = j["plan"]["gradients"] - (max(layer, 300 * C) + umax * C) * 4  # left: the rank's shard of the sum
    if abs(g - total * 4 / n) > 257 * 4:
        sys.exit(f"rank {r}: gradients {j['plan']['gradients']} B: {g} B beside the layer buffer and {umax} rows, "
                 f"not a 1/{n} shard of {total}")
if stage == 3:
    m = re.search(r"one region of (\d+) elements: two layer buffers of (\d+), or the (\d+) global", open(f"{w}/{z}.log").read())
    region, lay, glob = map(int, m.groups())
    if glob != C or region != max(2 * lay, (glob + 31) // 32 * 32 + max(300, umax) * C):
        sys.exit(f"the region {region} (layers {lay}, globals {glob}) is not two layers, or the final norm and a block")
print(f"  {z}: gradients the shard beside one layer buffer and {umax} looked-up rows")
PY
done
common=$common_ids
# DeepSpeed's JSON and FSDP's strategy name the stage: the same run as zero_stage
printf '{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 1}}\n' > "$W/ds1.json"
run ds1_adamw2 2 --deepspeed "$W/ds1.json" || bad "ds1_adamw2 did not train: $(tail -2 "$W/ds1_adamw2.log")"
cmp -s "$W/ds1_adamw2/model.safetensors" "$W/zero1_adamw2/model.safetensors" && grep -q "ZeRO *stage 1" "$W/ds1_adamw2.log" &&
  ok || bad "deepspeed stage 1 is not zero_stage 1's run"
printf '{"zero_optimization": {"stage": 3}}\n' > "$W/ds3.json"
run ds3_adamw2 2 --deepspeed "$W/ds3.json" || bad "ds3_adamw2 did not train: $(tail -2 "$W/ds3_adamw2.log")"
cmp -s "$W/ds3_adamw2/model.safetensors" "$W/zero3_adamw2/model.safetensors" && grep -q "ZeRO *stage 3" "$W/ds3_adamw2.log" &&
  ok || bad "deepspeed stage 3 is not zero_stage 3's run"
run fsdp3_adamw2 2 --fsdp "full_shard auto_wrap" || bad "fsdp3_adamw2 did not train: $(tail -2 "$W/fsdp3_adamw2.log")"
cmp -s "$W/fsdp3_adamw2/model.safetensors" "$W/zero3_adamw2/model.safetensors" && grep -q "ZeRO *stage 3" "$W/fsdp3_adamw2.log" &&
  ok || bad "fsdp full_shard is not zero_stage 3's run"
run fsdp_adamw2 2 --fsdp "shard_grad_op auto_wrap" || bad "fsdp_adamw2 did not train: $(tail -2 "$W/fsdp_adamw2.log")"
cmp -s "$W/fsdp_adamw2/model.safetensors" "$W/zero2_adamw2/model.safetensors" && grep -q "ZeRO *stage 2" "$W/fsdp_adamw2.log" &&
  ok || bad "fsdp shard_grad_op is not zero_stage 2's run"
# fsdp_config: Axolotl's FSDP2 mapping (FULL_SHARD by reshard_after_forward), and Hugging Face's JSON file with
# fsdp: true (SHARD_GRAD_OP by its prefixed key), each the run of the stage it means
{ cat "$W/ids.yaml"; printf 'fsdp_version: 2\nfsdp_config:\n  offload_params: false\n  state_dict_type: FULL_STATE_DICT\n'
  printf '  auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  transformer_layer_cls_to_wrap: LlamaDecoderLayer\n'
  printf '  reshard_after_forward: true\n  cpu_ram_efficient_loading: true\n'; } > "$W/fsdpcfg.yaml"
common=${common_ids/ids.yaml/fsdpcfg.yaml}
run fsdpcfg3_adamw2 2 || bad "fsdpcfg3_adamw2 did not train: $(tail -2 "$W/fsdpcfg3_adamw2.log")"
cmp -s "$W/fsdpcfg3_adamw2/model.safetensors" "$W/zero3_adamw2/model.safetensors" &&
  grep -q "ZeRO *stage 3" "$W/fsdpcfg3_adamw2.log" && ok || bad "fsdp_config reshard_after_forward is not zero_stage 3's run"
common=$common_ids
printf '{"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
 "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_use_orig_params": true, "xla": false}\n' > "$W/fsdp.json"
run fsdpjson2_adamw2 2 --fsdp true --fsdp_config "$W/fsdp.json" ||
  bad "fsdpjson2_adamw2 did not train: $(tail -2 "$W/fsdpjson2_adamw2.log")"
cmp -s "$W/fsdpjson2_adamw2/model.safetensors" "$W/zero2_adamw2/model.safetensors" &&
  grep -q "ZeRO *stage 2" "$W/fsdpjson2_adamw2.log" && ok || bad "fsdp_config's SHARD_GRAD_OP is not zero_stage 2's run"

# checkpoints: each rank writes its shard of the optimizer state (and of the fp32 master copy; at stage 3 of the
# parameters as stored, without the gather region) as its own state-*.rank<R>.bin, rank 0 the rest; a run saved at
# step 2 (of 3) and resumed on as many ranks and the same stage logs the same losses and gradient norms and ends with
# the same weights as the run that never stopped (same_as_ddp's, above). A stage-3 checkpoint holds no model files (no rank
# holds the model): its shard files, trainer_state.json and its hash.
ck() {
  local stage=$1 name=$2 np=$3; shift 3
  local ref="zero${stage}_$name" z="ck${stage}_$name"
  run "$z" "$np" --zero_stage "$stage" --save_steps 2 "$@" || { bad "$z did not train: $(tail -2 "$W/$z.log")"; return; }
  local c="$W/$z/checkpoint-2" files=1
  for r in $(seq 0 $((np - 1))); do
    [ -f "$c/state-optim.rank$r.bin" ] || files=0
    [ "$stage" != 3 ] || [ -f "$c/state-params.rank$r.bin" ] || files=0
  done
  [ $files = 1 ] && [ ! -e "$c/state-optim.bin" ] && [ ! -e "$W/$z/checkpoint-2.partial" ] && ok ||
    bad "$z: not every rank's shard file in $c: $(ls "$c" | tr '\n' ' ')"
  if [ "$stage" = 3 ]; then
    [ -z "$(ls "$c" | grep -v -e '^state-[a-z]*\.rank[0-9]*\.bin$' -e '^trainer_state\.')" ] && ok ||
      bad "$z: more than the shard files and the state in $c: $(ls "$c" | tr '\n' ' ')"
    # each rank's snapshot (planned and measured) is its shard files, each to whole pages: no gather region in it
    local async=1
    case " $* " in *" --async_checkpoint false "*) async=0 ;; esac
    python3 - "$W/$z" "$np" "$async" <<'PY' && ok || bad "$z: the snapshot is not the shard files"
import glob, json, os, sys
out, n, snap = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
err = []
for r in range(n):
    j = json.load(open(f"{out}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json")))
    files = glob.glob(f"{out}/checkpoint-2/state-*.rank{r}.bin")
    want = sum((os.path.getsize(f) + 4095) // 4096 * 4096 for f in files) if snap else 0
    got = j["plan"]["checkpoint snapshot"]
    if got != want or j["measured"]["checkpoint snapshot"] != got:
        err.append(f"rank {r}: snapshot planned {got}, measured {j['measured']['checkpoint snapshot']}, files {want}")
sys.exit("\n".join(err) if err else 0)
PY
  fi
  cmp -s "$W/$ref/model.safetensors" "$W/$z/model.safetensors" && ok || bad "$z: saving changed the weights"
  rm -f "$W/$z/model.safetensors"
  run "$z" "$np" --zero_stage "$stage" --save_steps 2 --resume_from_checkpoint latest "$@" &&
    grep -q "resumed from .*checkpoint-2 at step 2 of 3" "$W/$z.log" && ok || { bad "$z did not resume: $(tail -2 "$W/$z.log")"; return; }
  [ "$(worst "$z" "$ref")" = 0.0 ] && ok || bad "$z: the resumed losses or gradient norms differ"
  cmp -s "$W/$ref/model.safetensors" "$W/$z/model.safetensors" && ok || bad "$z: the resumed weights differ"
}
ck 1 adamw2 2
ck 2 adamw2 2
ck 1 q8_2 2 --optimizer adamw_8bit
ck 2 bf16m_2 2 --bf16 true
ck 2 paged8_bf16_3 3 --optimizer paged_adamw_8bit --bf16 true --master_weights false
# without a snapshot: each rank writes its files in the loop's thread
ck 1 bf16m_3 3 --bf16 true --async_checkpoint false
[ -f "$W/ck2_bf16m_2/checkpoint-2/state-master.rank1.bin" ] && ok || bad "ck2_bf16m_2: no shard file of the master copy"
ck 3 adamw2 2
ck 3 bf16m_3 3 --bf16 true
ck 3 adamw3 3 --async_checkpoint false
ck 3 bf16_2 2 --bf16 true --master_weights false
[ -f "$W/ck3_bf16m_3/checkpoint-2/state-master.rank2.bin" ] && ok || bad "ck3_bf16m_3: no shard file of the master copy"
# save_total_limit: rank 0 prunes the older folders once the newest is complete
run prune 2 --zero_stage 1 --save_steps 1 --save_total_limit 1 || bad "prune did not train: $(tail -2 "$W/prune.log")"
[ -f "$W/prune/checkpoint-2/state-optim.rank1.bin" ] && [ ! -e "$W/prune/checkpoint-1" ] && ok ||
  bad "save_total_limit 1 under ZeRO: $(ls "$W/prune" | tr '\n' ' ')"
# another split of the ranks: a checkpoint resumes on any number of ranks that takes the same micro-batches per step
# (ranks x gradient_accumulation_steps) and across stages 0 to 2 (stage 3 as stage 3), each rank assembling its shard
# from the files that hold its range. The state is the same whatever split wrote it: resumed alike, the runs from a
# ZeRO checkpoint and from DDP's (or from stage 2's, for stage 3) are the same bits.
# resplit NAME FROM NP ARGS...: a copy of run FROM's output, resumed from its checkpoint-2 on NP ranks
resplit() {
  local name=$1 from=$2 np=$3; shift 3
  rm -rf "${W:?}/$name"
  cp -r "$W/$from" "$W/$name" && rm -f "$W/$name/model.safetensors"
  run "$name" "$np" --save_steps 2 --resume_from_checkpoint latest "$@" &&
    grep -q "resumed from .*checkpoint-2 at step 2 of 3" "$W/$name.log" && ok ||
    bad "$name did not resume: $(grep error "$W/$name.log" | head -2)"
}
# resplit_same WHAT A B: the two resumed runs' losses, gradient norms and weights are the same bits
resplit_same() {
  [ "$(worst "$2" "$3")" = 0.0 ] && cmp -s "$W/$2/model.safetensors" "$W/$3/model.safetensors" && ok ||
    bad "$1: $2 is not $3's bits"
}
run ddp_ck2 2 --save_steps 2 || bad "ddp_ck2 did not train: $(tail -2 "$W/ddp_ck2.log")"
resplit rs_ddp_1 ddp_ck2 1 --gradient_accumulation_steps 2
resplit rs_z1_1 ck1_adamw2 1 --gradient_accumulation_steps 2
resplit_same "ZeRO-1 on 2 ranks to one process" rs_z1_1 rs_ddp_1
run one_ck 1 --gradient_accumulation_steps 2 --save_steps 2 || bad "one_ck did not train: $(tail -2 "$W/one_ck.log")"
resplit rs_one_ddp one_ck 2
resplit rs_one_z1 one_ck 2 --zero_stage 1
resplit_same "one process to ZeRO-1 on 2 ranks" rs_one_z1 rs_one_ddp
run ddp_q8ck 2 --optimizer adamw_8bit --save_steps 2 || bad "ddp_q8ck did not train: $(tail -2 "$W/ddp_q8ck.log")"
resplit rs_q8_ddp ddp_q8ck 1 --gradient_accumulation_steps 2 --optimizer adamw_8bit
resplit rs_q8_z1 ck1_q8_2 1 --gradient_accumulation_steps 2 --optimizer adamw_8bit
resplit_same "8-bit ZeRO-1 to one process" rs_q8_z1 rs_q8_ddp
p8="--optimizer paged_adamw_8bit --bf16 true --master_weights false --loss_vocab_block 2048"
run ddp_p8ck 3 $p8 --save_steps 2 || bad "ddp_p8ck did not train: $(tail -2 "$W/ddp_p8ck.log")"
resplit rs_p8_ddp ddp_p8ck 1 --gradient_accumulation_steps 3 $p8
resplit rs_p8_z2 ck2_paged8_bf16_3 1 --gradient_accumulation_steps 3 $p8
resplit_same "paged 8-bit ZeRO-2 on 3 ranks (host-resident state) to one process" rs_p8_z2 rs_p8_ddp
# (stage 2 with this tied head takes the loss over blocks of 2048 rows by default; resumed, the checkpoint's)
run ddp_bf16ck 2 --bf16 true --save_steps 2 --loss_vocab_block 2048 ||
  bad "ddp_bf16ck did not train: $(tail -2 "$W/ddp_bf16ck.log")"
resplit rs_bf16_ddp ddp_bf16ck 1 --gradient_accumulation_steps 2 --bf16 true --loss_vocab_block 2048
resplit rs_bf16_z2 ck2_bf16m_2 1 --gradient_accumulation_steps 2 --bf16 true --loss_vocab_block 2048
resplit_same "bf16 ZeRO-2 (its master copy's shards) to one process" rs_bf16_z2 rs_bf16_ddp
for v in "adamw" "bf16 --bf16 true"; do
  set -- $v
  t=$1; shift
  run "s2acc_$t" 3 --zero_stage 2 --gradient_accumulation_steps 2 --save_steps 2 "$@" || bad "s2acc_$t did not train"
  run "s3acc_$t" 3 --zero_stage 3 --gradient_accumulation_steps 2 --save_steps 2 "$@" || bad "s3acc_$t did not train"
  resplit "rs_s2_$t" "s2acc_$t" 2 --zero_stage 2 --gradient_accumulation_steps 3 "$@"
  resplit "rs_s3_$t" "s3acc_$t" 2 --zero_stage 3 --gradient_accumulation_steps 3 "$@"
  resplit_same "ZeRO-3 from 3 ranks to 2 ($t)" "rs_s3_$t" "rs_s2_$t"
done
# the same ranks at another stage: ZeRO-1's checkpoint as stage 2, DDP's as stage 1, each DDP's bits; stage 2 with
# this tied head would take the loss over blocks of the head's rows (auto), but a resume leaving loss_vocab_block to
# its auto value takes the checkpoint's (none here), so the run continues as it was, as with the value given
resplit rs_z1_z2 ck1_adamw2 2 --zero_stage 2 --loss_vocab_block -1
resplit_same "ZeRO-1's checkpoint at stage 2" rs_z1_z2 zero1_adamw2
resplit rs_z1_z2_auto ck1_adamw2 2 --zero_stage 2
resplit_same "ZeRO-1's checkpoint at stage 2, loss_vocab_block auto" rs_z1_z2_auto zero1_adamw2
grep -q "loss  *over blocks" "$W/rs_z1_z2_auto.log" && bad "rs_z1_z2_auto: the loss over blocks" || ok
resplit rs_ddp_z1 ddp_ck2 2 --zero_stage 1
resplit_same "DDP's checkpoint at stage 1" rs_ddp_z1 zero1_adamw2
# what cannot continue the run: refused (exit 2) naming the settings and the fix, on every rank
resume_refused() {
  local what=$1 np=$2 from=$3 msg=$4; shift 4
  local pre=()
  # mpirun would end the other ranks when the first exits non-zero, racing their own refusals: every rank runs to
  # its own exit and prints its status, so that the counts below say each one refused, with exit 2
  [ "$np" -gt 1 ] && pre=("${MPI[@]}" --mca orte_abort_on_non_zero_status 0 -np "$np" bash -c '"$@"; echo "rank exit $?"' rank)
  [ "$np" -gt 1 ] && [ "${SNUG_SANITIZED:-0}" = 1 ] && pre=(env ASAN_OPTIONS=detect_leaks=0 "${pre[@]}")
  "${pre[@]}" "$SNUG" train $common --output_dir "$W/refused" --resume_from_checkpoint "$from" "$@" > "$W/refused.log" 2>&1
  local st=$?
  [ "$np" -gt 1 ] && st=$(grep -c "^rank exit 2$" "$W/refused.log")
  [ "$np" -gt 1 ] && [ "$st" -eq "$np" ] && st=2
  [ "$st" -eq 2 ] && [ "$(grep -c "error: .*$msg" "$W/refused.log")" -eq "$np" ] && ok ||
    bad "$what: exit $st (the ranks' count of exit 2 when several), $(grep error "$W/refused.log" | head -3)"
}
resume_refused "3 ranks" 3 "$W/ck1_adamw2/checkpoint-2" \
  "steps take 2 micro-batches (2 ranks x gradient_accumulation_steps 1), this run's 3 (3 x 1).*divides 2" --zero_stage 1
resume_refused "one process" 1 "$W/ck1_adamw2/checkpoint-2" "set gradient_accumulation_steps to 2 on 1 rank" \
  --zero_stage 1
resume_refused "stage 2 from stage 3" 2 "$W/ck3_adamw2/checkpoint-2" \
  "trained with zero_stage 3 over 2 ranks, this run has zero_stage 2 over 2.*set zero_stage: 3" --zero_stage 2
resume_refused "bf16 DDP's master copy under ZeRO" 2 "$W/ddp_bf16ck/checkpoint-2" \
  "model.safetensors, which ZeRO's shards of that copy are not read from; resume with zero_stage 0" --zero_stage 1 \
  --bf16 true --loss_vocab_block 2048
resume_refused "stage 3 on 2 ranks" 2 "$W/ck3_adamw3/checkpoint-2" \
  "steps take 3 micro-batches (3 ranks x gradient_accumulation_steps 1), this run's 2 (2 x 1)" --zero_stage 3
resume_refused "stage 2 from stage 1 with the loss's blocks set otherwise" 2 "$W/ck1_adamw2/checkpoint-2" \
  "trained with loss_vocab_block 0, this run has 2048.*(here: loss_vocab_block: -1)" --zero_stage 2 \
  --loss_vocab_block 2048
resume_refused "stage 3 from stage 2" 2 "$W/ck2_adamw2/checkpoint-2" \
  "trained with zero_stage 2 over 2 ranks, this run has zero_stage 3 over 2.*set zero_stage: 2" --zero_stage 3
# the loss over blocks of the head's rows: saved and resumed at stages 2 and 3, the run that never stopped; resumed
# with another loss_vocab_block (which changes the rounding), refused
common=${common_ids/ids.yaml/rep.yaml}
ck 2 vb_3 3 $vb
ck 3 vb_2 2 $vb
resume_refused "another loss_vocab_block" 2 "$W/ck3_vb_2/checkpoint-2" \
  "trained with loss_vocab_block 300, this run has 0.*(here: loss_vocab_block: 300)" --zero_stage 3 --loss_vocab_block -1
common=$common_ids
# a damaged or missing shard file: every rank fails naming it (exit 2), none waits
cp -r "$W/ck1_adamw2/checkpoint-2" "$W/damaged"
printf '\001' | dd of="$W/damaged/state-optim.rank1.bin" bs=1 seek=4096 conv=notrunc 2>/dev/null
resume_refused "damaged shard" 2 "$W/damaged" "state-optim.rank1.bin is .* bytes with hash .*, but was written as" --zero_stage 1
rm "$W/damaged/state-optim.rank1.bin"
resume_refused "missing shard" 2 "$W/damaged" "state-optim.rank1.bin is missing" --zero_stage 1
# the final save failing on rank 0 alone (save_fails NAME NP HOW FILE ARGS...): HOW full links rank 0's temporary
# FILE.tmp.<pid> to /dev/full, so its writes fail with the disk full in the middle of the stream (some tensors
# gathered, more to come); HOW dir puts a folder where FILE goes, so the rename after the last gather fails. Every
# rank exits 1 (a failed write, as one process) naming the file, and at once: far below a dist_timeout of 600 s
# (mpirun is ended after 120 s, so a rank left waiting fails here rather than after the timeout)
save_fails() {
  local name=$1 np=$2 how=$3 file=$4; shift 4
  local out="$W/$name"
  rm -rf "$out"
  mkdir -p "$out"
  [ "$how" = dir ] && mkdir -p "$out/$file/in-the-way"
  local pre=(env SAVE_OUT="$out" SAVE_FILE="$file" SAVE_HOW="$how")
  [ "${SNUG_SANITIZED:-0}" = 1 ] && pre+=(ASAN_OPTIONS=detect_leaks=0)
  # the inner bash makes the link under its own pid, which exec hands to snug
  pre+=(timeout -k 5 120 "${MPI[@]}" --mca orte_abort_on_non_zero_status 0 -x SAVE_OUT -x SAVE_FILE -x SAVE_HOW
        -np "$np" bash -c 'bash -c '\''[ "$OMPI_COMM_WORLD_RANK" != 0 ] || [ "$SAVE_HOW" != full ] ||
          ln -s /dev/full "$SAVE_OUT/$SAVE_FILE.tmp.$$"; exec "$@"'\'' inner "$@"; echo "rank exit $?"' rank)
  local t0=$SECONDS
  "${pre[@]}" "$SNUG" train $common --output_dir "$out" --dist_timeout 600 "$@" > "$out.log" 2>&1
  local took=$((SECONDS - t0)) exits named
  exits=$(grep -c "^rank exit 1$" "$out.log")
  named=$(grep -c "error: rank [0-9]* of $np: .*$out/$file" "$out.log")
  [ "$exits" -eq "$np" ] && [ "$named" -eq "$np" ] && [ "$took" -lt 60 ] && ok ||
    bad "$name: $exits of $np ranks exited 1, $named named $file, in $took s: $(grep -e error -e 'rank exit' "$out.log" | head -4)"
  [ ! -f "$out/config.json" ] && [ -z "$(ls "$out" | grep '\.tmp\.')" ] && ok ||
    bad "$name: the failed save left $(ls "$out" | tr '\n' ' ')"
}
save_fails savefull3 2 full model.safetensors --zero_stage 3
save_fails savefull3_3 3 full model.safetensors --zero_stage 3
save_fails savefullm 2 full model.safetensors --zero_stage 1 --bf16 true
save_fails savedir3 2 dir model.safetensors --zero_stage 3
save_fails savetok3 3 dir tokenizer.json --zero_stage 3
save_fails savecfg3 2 dir config.json --zero_stage 3
# SIGTERM to every rank: they finish the step together, each writes its shard files, rank 0 completes the folder,
# every rank exits 0, and the resumed run is the run that never stopped (sigterm NAME ARGS...)
sigterm() {
  local name=$1; shift
  run "${name}_full" 2 --max_steps 60 "$@" || bad "${name}_full did not train"
  stopped "$name" 2 --max_steps 60 "$@"
  local rc=$? step
  step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\) of 60.*/\1/p' "$W/$name.log")
  if [ $rc -eq 0 ] && [ -n "$step" ] && [ -f "$W/$name/checkpoint-$step/trainer_state.hash" ] &&
     [ -f "$W/$name/checkpoint-$step/state-optim.rank1.bin" ]; then
    ok
    run "$name" 2 --max_steps 60 --resume_from_checkpoint latest "$@" || bad "$name did not resume: $(tail -2 "$W/$name.log")"
    [ "$(worst "$name" "${name}_full")" = 0.0 ] && ok || bad "$name: the resumed losses or gradient norms differ"
    cmp -s "$W/${name}_full/model.safetensors" "$W/$name/model.safetensors" && ok || bad "$name: the resumed weights differ"
    echo "  $name: stopped by SIGTERM after step $step of 60, resumed"
  else
    bad "$name: SIGTERM to 2 ranks: exit $rc, $(tail -5 "$W/$name.log")"
  fi
}
sigterm sig --zero_stage 2
sigterm sig3 --zero_stage 3
[ -n "$(ls "$W"/sig3/checkpoint-*/state-params.rank1.bin 2>/dev/null)" ] && ok || bad "sig3: no shard file of the parameters"

# the combinations not built: refused before training, exit 2, naming the key
refuse() {
  local what=$1 key=$2; shift 2
  "$SNUG" train $common --output_dir "$W/refused" "$@" > "$W/refused.log" 2>&1
  local st=$?
  [ $st -eq 2 ] && grep -q "$key" "$W/refused.log" && ok || bad "$what: exit $st, $(tail -1 "$W/refused.log")"
}
refuse "zero_stage 4" "zero_stage 4 does not exist" --zero_stage 4
refuse "zero_stage -1" "zero_stage" --zero_stage -1
# fsdp_config's offload_params is offload_params, an adapter's frozen base in host memory: a full fine-tune is refused
{ cat "$W/ids.yaml"; printf 'fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: true\n'; } \
  > "$W/fsdpoff.yaml"
"$SNUG" train "$W/fsdpoff.yaml" --output_dir "$W/refused" > "$W/refused.log" 2>&1
[ $? -eq 2 ] && grep -q "fsdpoff.yaml: offload_params (FSDP's offload_params, DeepSpeed's offload_param) keeps a frozen" \
  "$W/refused.log" && grep -q "set adapter: lora or qlora" "$W/refused.log" && ok ||
  bad "fsdp_config offload: $(tail -1 "$W/refused.log")"
refuse "with an adapter" "with adapter lora is not supported.*only stage 3" --zero_stage 1 --adapter lora
refuse "QLoRA below stage 3" "zero_stage 2 with adapter qlora is not supported.*only stage 3" --zero_stage 2 \
  --adapter qlora
refuse "offload_embedding at stage 3" "offload_embedding with zero_stage 3" --zero_stage 3 --adapter lora \
  --bf16 true --offload_embedding true
refuse "lora_modules_to_save at stage 3 without a base" "lora_modules_to_save with zero_stage 3 needs base_model" \
  --zero_stage 3 --adapter lora --lora_modules_to_save lm_head

# LoRA at stage 3: the frozen base sharded and gathered layer by layer, the adapters (their gradients summed after
# backward, their optimizer state) whole on every rank, so DDP's bits: the logged losses, gradient norms and
# validation losses and the saved adapter, byte for byte; each rank's parameters arena is its plan, below DDP's;
# checkpoints are rank 0's (the adapters), resumed on as many ranks or as one process
# adapter3 KIND NAME NP BELOW ARGS...: DDP and stage 3 under KIND (lora: into lddp_NAME and lz3_NAME; qlora, bf16:
# qddp_NAME and qz3_NAME; int8, LoRA with load_in_8bit: iddp_NAME and iz3_NAME) with ARGS give the same bits (losses, gradient norms, validation losses, the adapter);
# each rank's arenas are its plan, its adapters' state DDP's, and with BELOW=1 its parameters arena below DDP's
adapter3() {
  local kind=$1 name=$2 np=$3 below=$4; shift 4
  local d=lddp_$name z=lz3_$name what="LoRA: the frozen base sharded" extra=(--adapter "$kind")
  [ "$kind" = qlora ] && d=qddp_$name z=qz3_$name what="QLoRA: the 4-bit matrices sharded" extra+=(--bf16 true)
  [ "$kind" = int8 ] && d=iddp_$name z=iz3_$name what="LoRA on an 8-bit base: the 8-bit matrices sharded" \
    extra=(--adapter lora --load_in_8bit true)
  run "$d" "$np" "${extra[@]}" "$@" || { bad "$d did not train: $(tail -2 "$W/$d.log")"; return; }
  run "$z" "$np" "${extra[@]}" --zero_stage 3 --dist_debug true "$@" ||
    { bad "$z did not train: $(grep error "$W/$z.log" | head -2)"; return; }
  grep -q "stage 3 under $what" "$W/$z.log" && [ "$(worst "$z" "$d")" = 0.0 ] &&
    cmp -s "$W/$d/adapter_model.safetensors" "$W/$z/adapter_model.safetensors" &&
    [ "$(grep -o '"val_loss": [0-9.e+-]*' "$W/$z/metrics.jsonl")" = \
      "$(grep -o '"val_loss": [0-9.e+-]*' "$W/$d/metrics.jsonl")" ] && ok || bad "$z: not DDP's bits under $kind"
  python3 - "$W/$z" "$W/$d" "$np" "$below" <<'PY' && ok || bad "$z: the ranks' arenas"
import json, sys
out, ddp, n, below = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
d = json.load(open(f"{ddp}/memory.json"))["plan"]
for r in range(n):
    j = json.load(open(f"{out}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json")))
    assert j["plan"] == j["measured"], (r, j["plan"], j["measured"])
    assert not below or j["plan"]["parameters"] < d["parameters"], (r, j["plan"]["parameters"], d["parameters"])
    for c in ("optimizer state", "gradients", "adapter weights"):
        assert j["plan"].get(c) == d.get(c), (r, c, j["plan"].get(c), d.get(c))
PY
}
lora3() { adapter3 lora "$1" "$2" 1 "${@:3}"; }
lora3 bf16_2 2 --bf16 true
lora3 acc_3 3 --gradient_accumulation_steps 2 --gradient_checkpointing true
lora3 val_2 2 --base_model "$W/base" --bf16 true --gradient_accumulation_steps 4 --max_steps 9 --val_set_size 0.1 \
  --lora_target_linear true
lora3 saved_2 2 --base_model "$W/base" --bf16 true --lora_modules_to_save lm_head,embed_tokens
lora3 saved32_3 3 --base_model "$W/base" --lora_modules_to_save lm_head
# DoRA: the magnitudes start from the base's rows, gathered layer by layer once the ranks are joined
lora3 dora_2 2 --bf16 true --peft_use_dora true --lora_target_linear true
# offload_params: the frozen base in host memory (each rank's shard at stage 3, the whole base under DDP), each
# layer copied into the gather region as it runs; the bits of the runs without it, the shard moved between arenas
run lz3_off_3 3 --adapter lora --zero_stage 3 --dist_debug true --gradient_accumulation_steps 2 \
  --gradient_checkpointing true --offload_params true || bad "lz3_off_3 did not train: $(grep error "$W/lz3_off_3.log")"
run lddp_off_3 3 --adapter lora --gradient_accumulation_steps 2 --gradient_checkpointing true --offload_params true ||
  bad "lddp_off_3 did not train: $(grep error "$W/lddp_off_3.log")"
for r in lz3_off_3 lddp_off_3; do
  [ "$(worst "$r" lddp_acc_3)" = 0.0 ] && cmp -s "$W/$r/adapter_model.safetensors" "$W/lddp_acc_3/adapter_model.safetensors" &&
    ok || bad "$r: not DDP's bits without offload_params"
done
python3 - "$W/lz3_off_3/memory.rank1.json" "$W/lz3_acc_3/memory.rank1.json" <<'PY' && ok || bad "lz3_off_3: the arenas"
import json, sys
off, dev = (json.load(open(p)) for p in sys.argv[1:3])
assert off["plan"] == off["measured"], off
off, dev = off["plan"], dev["plan"]
assert off["parameters"] + off["offloaded to host"] == dev["parameters"] and off["offloaded to host"] > 0, (off, dev)
PY
run lz3_ck 2 --adapter lora --zero_stage 3 --bf16 true --save_steps 2 || bad "lz3_ck did not train"
[ -f "$W/lz3_ck/checkpoint-2/adapter_model.safetensors" ] && [ -z "$(ls "$W/lz3_ck/checkpoint-2" | grep rank)" ] && ok ||
  bad "lz3_ck: the checkpoint is not rank 0's adapters: $(ls "$W/lz3_ck/checkpoint-2" | tr '\n' ' ')"
resplit lz3_ck_2 lz3_ck 2 --adapter lora --zero_stage 3 --bf16 true
resplit_adapters() {
  [ "$(worst "$2" "$3")" = 0.0 ] && cmp -s "$W/$2/adapter_model.safetensors" "$W/$3/adapter_model.safetensors" && ok ||
    bad "$1: $2 is not $3's bits"
}
resplit_adapters "LoRA stage 3 resumed" lz3_ck_2 lz3_bf16_2
resplit lz3_ck_1 lz3_ck 1 --adapter lora --bf16 true --gradient_accumulation_steps 2
resplit_adapters "LoRA stage 3 resumed as one process" lz3_ck_1 lz3_bf16_2

# QLoRA at stage 3: each layer's 4-bit matrices cut in equal byte pieces, one per rank, all-gathered layer by layer
# (the next layer prefetched); the 16-bit tensors, the adapters and their state whole on every rank. DDP's bits:
# losses, gradient norms, validation losses and the saved adapter, byte for byte, with checkpointing and
# accumulation at 3 ranks, with evaluation, idle ranks at the epoch's end, a loaded (untied) base, lm_head trained in
# full and the embedding in host memory at 2; each rank's arenas are its plan, and its parameters arena is below
# DDP's where the model has more layers than two buffers and a shard hold (llama-30m's 8 at 2 ranks: 6 layers' bytes
# where DDP holds 8; tiny-llama's 4 at 3 ranks). Checkpoints are rank 0's adapters, resumed at stage 3 on as many
# ranks and as one process.
qlora3() { adapter3 qlora "$@"; }
qlora3 30m_2 2 1 --model_preset llama-30m --max_steps 2
qlora3 acc_3 3 1 --gradient_accumulation_steps 2 --gradient_checkpointing true
qlora3 dora_2 2 0 --peft_use_dora true --lora_dropout 0.1
# the 8-bit base (load_in_8bit) likewise: each layer's codes and row scales cut in byte pieces
adapter3 int8 30m_2 2 1 --model_preset llama-30m --max_steps 2
adapter3 int8 acc_3 3 0 --gradient_accumulation_steps 2 --gradient_checkpointing true --offload_params true
# offload_params (the 4-bit base in host memory: each rank's pieces at stage 3, the whole base under DDP) keeps the
# bits of the run without it
qlora3 off_3 3 0 --gradient_accumulation_steps 2 --gradient_checkpointing true --offload_params true
resplit_adapters "offload_params under DDP" qddp_off_3 qddp_acc_3
resplit_adapters "offload_params at stage 3" qz3_off_3 qddp_acc_3
python3 - "$W/qz3_off_3/memory.json" "$W/qz3_acc_3/memory.json" <<'PY' && ok || bad "qz3_off_3: the arenas"
import json, sys
off, dev = (json.load(open(p))["plan"] for p in sys.argv[1:3])
assert off["parameters"] + off["offloaded to host"] == dev["parameters"] and off["offloaded to host"] > 0, (off, dev)
PY
qlora3 val_2 2 0 --base_model "$W/base" --gradient_accumulation_steps 4 --max_steps 9 --val_set_size 0.1 \
  --lora_target_linear true --lora_modules_to_save lm_head --offload_embedding true
run qz3_ck 2 --adapter qlora --zero_stage 3 --bf16 true --save_steps 2 || bad "qz3_ck did not train"
run qz3_full 2 --adapter qlora --zero_stage 3 --bf16 true || bad "qz3_full did not train"
resplit qz3_ck_2 qz3_ck 2 --adapter qlora --zero_stage 3 --bf16 true
resplit_adapters "QLoRA stage 3 resumed" qz3_ck_2 qz3_full
resplit qz3_ck_1 qz3_ck 1 --adapter qlora --bf16 true --gradient_accumulation_steps 2
resplit_adapters "QLoRA stage 3 resumed as one process" qz3_ck_1 qz3_full
# optimizer_in_backward under an adapter at stage 3: the adapters (whole on every rank) stepped as each layer's
# backward ends, as under DDP, between the base's gathers; 18 steps of 4 ranks cross the epoch's end (66
# micro-batches), whose last step leaves 2 ranks idle: they join the gathers and the sums through skip_step
for kind in lora qlora; do
  oib=(--adapter "$kind" --bf16 true --max_steps 18 --max_grad_norm 0 --optimizer_in_backward true)
  run "oib_ddp_$kind" 4 "${oib[@]}" || bad "oib_ddp_$kind did not train: $(grep error "$W/oib_ddp_$kind.log" | head -1)"
  run "oib_z3_$kind" 4 "${oib[@]}" --zero_stage 3 --dist_debug true ||
    bad "oib_z3_$kind did not train: $(grep error "$W/oib_z3_$kind.log" | head -1)"
  [ "$(worst "oib_z3_$kind" "oib_ddp_$kind")" = 0.0 ] &&
    cmp -s "$W/oib_ddp_$kind/adapter_model.safetensors" "$W/oib_z3_$kind/adapter_model.safetensors" && ok ||
    bad "oib_z3_$kind: not DDP's bits with optimizer_in_backward"
done
# optimizer_in_backward on a full fine-tune at stages 1 to 3: each layer's gradients summed as backward completes
# them (stage 3: reduce-scattered), each rank steps its shard of the layer (its optimizer state and, under 16-bit, its
# master copy) and at stages 1 and 2 the layer's parameters are all-gathered (stage 3 keeps its shard: the next
# gather reads it). DDP's bits (fp32; bf16 with the master copy sharded; bf16 stochastic rounding; paged 8-bit)
# across the epoch's end at 4 ranks, whose idle ranks still step their shards; each rank's arenas its plan, its
# optimizer state a quarter of DDP's (8-bit: plus its own maps and block edges); a checkpoint resumed on as many
# ranks is the run that never stopped
for v in "f32" "bf16 --bf16 true" "sr --bf16 true --master_weights false" "p8 --optimizer paged_adamw_8bit --bf16 true"; do
  set -- $v
  t=$1; shift
  ob=(--max_steps 18 --max_grad_norm 0 --optimizer_in_backward true "$@")
  run "ob_ddp_$t" 4 "${ob[@]}" || bad "ob_ddp_$t did not train: $(grep error "$W/ob_ddp_$t.log" | head -1)"
  for z in 1 2 3; do
    [ $z = 2 ] && [ "$t" != f32 ] && continue
    run "ob_z${z}_$t" 4 "${ob[@]}" --zero_stage $z --dist_debug true ||
      bad "ob_z${z}_$t did not train: $(grep error "$W/ob_z${z}_$t.log" | head -1)"
    [ "$(worst "ob_z${z}_$t" "ob_ddp_$t")" = 0.0 ] &&
      cmp -s "$W/ob_ddp_$t/model.safetensors" "$W/ob_z${z}_$t/model.safetensors" && ok ||
      bad "ob_z${z}_$t: not DDP's bits with optimizer_in_backward"
  done
  for z in 1 3; do
  python3 - "$W/ob_z${z}_$t" "$W/ob_ddp_$t" $z <<'PY' && ok || bad "ob_z${z}_$t: the ranks' arenas"
import json, sys
z, ddp, stage = sys.argv[1], json.load(open(f"{sys.argv[2]}/memory.json")), int(sys.argv[3])
d, n = ddp["plan"], 4
ranks = [json.load(open(f"{z}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json"))) for r in range(n)]
for r, j in enumerate(ranks):
    assert j["plan"] == j["measured"], (r, j["plan"], j["measured"])
    # stage 3: the tied embedding's gradient whole and one layer's buffer, as DDP's (which also keeps the final
    # norm's apart: stage 3 steps it before the last layer's backward reuses its place)
    g = j["plan"]["gradients"]
    assert g == d["gradients"] if stage == 1 else d["gradients"] - 4096 <= g <= d["gradients"], (r, g, d["gradients"])
# as same_as_ddp() weighs them: the shards sum to DDP's state (8-bit: each rank's own maps unless paged; each of six
# buffers rounded to 64 bytes), fp32 state and the master copy 1/N each give or take a block of 256
opt, whole = [j["plan"]["optimizer state"] for j in ranks], d["optimizer state"]
eight, paged = "8bit" in ddp["optimizer"], ddp["optimizer"].startswith("paged")
extra = (n - 1) * 2048 if eight and not paged else 0
assert 0 <= sum(opt) - whole - extra <= n * 6 * 64, (opt, whole)
assert eight or max(abs(b - whole / n) for b in opt) <= 257 * 8, (opt, whole)
mas, whole_m = [j["plan"]["master weights"] for j in ranks], d["master weights"]
assert not whole_m or (0 <= sum(mas) - whole_m <= n * 64 and max(abs(b - whole_m / n) for b in mas) <= 257 * 4), mas
PY
  done
done
# stage 3 with the reduce-scatters beside the next layer's backward: each layer stepped once its sum is waited for
run ob_z3o_bf16 4 --max_steps 18 --max_grad_norm 0 --optimizer_in_backward true --bf16 true --zero_stage 3 \
  --zero_overlap_comm true --dist_debug true || bad "ob_z3o_bf16 did not train: $(grep error "$W/ob_z3o_bf16.log" | head -1)"
grep -q "beside the next layer's backward (zero_overlap_comm" "$W/ob_z3o_bf16.log" && [ "$(worst ob_z3o_bf16 ob_ddp_bf16)" = 0.0 ] &&
  cmp -s "$W/ob_ddp_bf16/model.safetensors" "$W/ob_z3o_bf16/model.safetensors" && ok ||
  bad "ob_z3o_bf16: not DDP's bits with optimizer_in_backward and overlapped reduce-scatters"
# stage 3 with the untied head: the head and final norm are stepped as soon as the loss's backward completes them
# (their buffer is the last layer's next), the embedding after its backward; DDP's bits in bf16 with checkpointing
# and evaluation at 3 ranks, and no shard of the gradients kept: the gradients arena is one buffer of max(embedding,
# head, a layer) floats, below stage 3's without the step inside backward
ob=(--base_model "$W/base" --max_steps 18 --max_grad_norm 0 --optimizer_in_backward true --bf16 true
    --gradient_checkpointing true --val_set_size 0.1 --eval_steps 4)
run ob_ddp_untied 3 "${ob[@]}" || bad "ob_ddp_untied did not train: $(grep error "$W/ob_ddp_untied.log" | head -1)"
run ob_z3_untied 3 "${ob[@]}" --zero_stage 3 --dist_debug true ||
  bad "ob_z3_untied did not train: $(grep error "$W/ob_z3_untied.log" | head -1)"
[ "$(worst ob_z3_untied ob_ddp_untied)" = 0.0 ] && cmp -s "$W/ob_ddp_untied/model.safetensors" \
  "$W/ob_z3_untied/model.safetensors" && ok || bad "ob_z3_untied: not DDP's bits with optimizer_in_backward"
python3 - "$W" "$W/base/config.json" <<'PY' && ok || bad "ob_z3_untied: the gradients arena"
import json, sys
w, cfg = sys.argv[1], json.load(open(sys.argv[2]))
C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
kv = C // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
layer = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * I
for r in range(3):
    name = "memory.json" if r == 0 else f"memory.rank{r}.json"
    j, z3 = json.load(open(f"{w}/ob_z3_untied/{name}")), json.load(open(f"{w}/zero3_untied_3/{name}"))
    g = j["plan"]["gradients"]
    assert j["plan"] == j["measured"], (r, j["plan"], j["measured"])
    assert g == max(V * C, V * C + C, layer) * 4 and g < z3["plan"]["gradients"], (r, g, z3["plan"]["gradients"])
print(f"  ob_z3_untied: gradients {g} B per rank, stage 3 without the step inside backward {z3['plan']['gradients']} B")
PY
for z in 1 3; do
  ob=(--max_grad_norm 0 --optimizer_in_backward true --bf16 true --zero_stage $z)
  run ob_full$z 3 "${ob[@]}" || bad "ob_full$z did not train"
  run ob_ck$z 3 "${ob[@]}" --save_steps 2 || bad "ob_ck$z did not train"
  resplit ob_ck_r$z ob_ck$z 3 "${ob[@]}"
  resplit_same "ZeRO-$z with optimizer_in_backward resumed" ob_ck_r$z ob_full$z
done
finish
