#!/usr/bin/env bash
# Data parallel over MPI ranks on the CPU: N ranks x micro_batch_size B against one process accumulating N
# micro-batches of B. With ddp_deterministic (the ranks' gradients summed in rank order) the logged losses, gradient
# norms and final weights are the same bits at 2 and 3 ranks, on a model and data where every gradient element
# receives one addition per micro-batch (see below), and under LoRA; elsewhere within a bound. Early stopping with
# load_best_model_at_end stops where one process stops and saves the same best checkpoint's weights, under ZeRO-1 and
# 2 too. Skipped (77) without mpirun or an MPI build.
. "$(dirname "$0")/lib.sh"
need_mpi
. "$SRC/tests/cli/ranks.sh"

# Bitwise equality needs each micro-batch to add once to every gradient element, so that accumulating micro-batches
# 0..N-1 in one buffer ((g0 + g1) + g2) is the rank-order sum of the ranks' buffers. Every op adds its whole
# micro-batch's sum once (norms and biases sum rows in double first; a GEMM over fewer tokens than OpenBLAS's K
# block adds once), except two: the embedding's backward adds token by token, so an id twice in one micro-batch
# adds twice, and tied embeddings add the head's gradient and the embedding's into one table. Hence this data: no
# id appears twice in the whole set (pretokenized, ids 1..2047 each used once; prompt tokens unsupervised, so the
# loss is normalised by a count that differs per micro-batch), and an untied model.
. "$SRC/tests/cli/ids_data.sh"
tok="--tokenizer $SRC/assets/tokenizer --sequence_len 32 --sample_tokens 0 --seed 5 --threads 1"
# the base: tiny-llama after one step, its embedding copied into an untied lm_head
. "$SRC/tests/cli/untied_base.sh"
# same NAME REF TOL: the logged losses and gradient norms within relative TOL (0: the same bits), and with TOL 0
# the same weights, byte for byte
same() {
  if python3 - "$W/$1/metrics.jsonl" "$W/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
tol = float(sys.argv[3])
a = [(r["loss"], r["grad_norm"]) for r in rows[0]]
b = [(r["loss"], r["grad_norm"]) for r in rows[1]]
if len(a) != len(b) or not a:
    sys.exit(f"  {len(a)} logged steps against {len(b)}")
worst = max(abs(x - y) / abs(y) for p, q in zip(a, b) for x, y in zip(p, q))
print(f"  {sys.argv[1].split('/')[-2]:<14} vs {sys.argv[2].split('/')[-2]:<10} {len(a)} steps, worst rel {worst:.1e}")
sys.exit(0 if worst <= tol else 1)
PY
  then ok; else bad "$1 differs from $2"; fi
  if [ "$3" = 0 ]; then
    local f=model.safetensors
    [ -f "$W/$2/$f" ] || f=adapter_model.safetensors
    cmp -s "$W/$1/$f" "$W/$2/$f" && ok || bad "$1: the weights ($f) differ from $2's"
  fi
}

common="$W/ids.yaml --base_model $W/base $tok --max_steps 4 --logging_steps 1
        --learning_rate 3e-3 --lr_scheduler cosine --max_grad_norm 0.5 --micro_batch_size 2"
skip_without_mpi --ddp_deterministic true --max_steps 1
ids="$common"
for n in 2 3; do
  run one$n 0 --gradient_accumulation_steps $n || bad "one$n did not train: $(tail -2 "$W/one$n.log")"
  run ddp$n $n --ddp_deterministic true --dist_debug true || bad "ddp$n did not train: $(tail -2 "$W/ddp$n.log")"
  same ddp$n one$n 0
  grep -q "data parallel *$n ranks" "$W/ddp$n.log" && ok || bad "ddp$n: no data parallel line in the header"
done
# the gradients summed in buckets during backward: one by default (tiny-llama is under 25 MiB), several of 1 MiB (each
# flushed at the cap), the same bits either way
run ddp3_b1 3 --ddp_deterministic true --ddp_bucket_cap_mb 1 || bad "ddp3_b1 did not train: $(tail -2 "$W/ddp3_b1.log")"
same ddp3_b1 one3 0
grep -q "gradient buckets *1 of up to 25 MiB" "$W/ddp3.log" && grep -Eq "gradient buckets *([2-9]|[1-9][0-9]+) of up to 1 MiB" \
  "$W/ddp3_b1.log" && ok || bad "ddp3, ddp3_b1: not one bucket of 25 MiB and several of 1 MiB: $(grep bucket "$W/ddp3_b1.log")"
# validation shared by the ranks (micro-batch k on rank k % 3): the same validation losses, bit for bit
run one3_val 0 --gradient_accumulation_steps 3 --val_set_size 7 --eval_steps 2 || bad "one3_val did not train"
run ddp3_val 3 --ddp_deterministic true --val_set_size 7 --eval_steps 2 || bad "ddp3_val did not train"
same ddp3_val one3_val 0
python3 - "$W/ddp3_val/metrics.jsonl" "$W/one3_val/metrics.jsonl" <<'PY' && ok || bad "ddp3_val: validation losses differ"
import json, sys
a, b = ([json.loads(l).get("val_loss") for l in open(p)] for p in sys.argv[1:3])
print(f"  validation losses: {[x for x in a if x is not None]} against {[x for x in b if x is not None]}")
sys.exit(0 if a == b and any(x is not None for x in a) else 1)
PY
# early stopping with load_best_model_at_end: a learning rate of 1 wrecks the model after the warmup step, the
# ranks stop together where one process does, and save the same best checkpoint's weights
es=(--val_set_size 7 --eval_steps 1 --save_steps 1 --early_stopping_patience 2 --learning_rate 1.0
    --lr_scheduler constant_with_warmup --warmup_steps 1 --max_grad_norm 0 --max_steps 8)
run one2_es 0 --gradient_accumulation_steps 2 "${es[@]}" || bad "one2_es did not train: $(tail -2 "$W/one2_es.log")"
run ddp2_es 2 --ddp_deterministic true "${es[@]}" || bad "ddp2_es did not train: $(tail -2 "$W/ddp2_es.log")"
same ddp2_es one2_es 0
stop=$(grep -o "^step [0-9]*: no validation loss lower" "$W/one2_es.log")
[ -n "$stop" ] && grep -q "^$stop" "$W/ddp2_es.log" && grep -q "the model saved is checkpoint-1's" "$W/ddp2_es.log" &&
  ok || bad "ddp2_es: not stopped where one process stops ($stop), or not saved from checkpoint-1"
# ZeRO-1 and 2 (without accumulation DDP's bits; their checkpoints hold the whole model): the same best weights
for z in 1 2; do
  run zero${z}_es 2 --ddp_deterministic true --zero_stage $z "${es[@]}" ||
    bad "zero${z}_es did not train: $(tail -2 "$W/zero${z}_es.log")"
  same zero${z}_es ddp2_es 0
  grep -q "the model saved is checkpoint-1's" "$W/zero${z}_es.log" && ok || bad "zero${z}_es: not saved from checkpoint-1"
done
# bf16 storage: the ranks keep fp32 layer gradients, as accumulation does, so the bits stay those of one process
run one2_bf16 0 --bf16 true --gradient_accumulation_steps 2 || bad "one2_bf16 did not train: $(tail -2 "$W/one2_bf16.log")"
run ddp2_bf16 2 --bf16 true --ddp_deterministic true || bad "ddp2_bf16 did not train: $(tail -2 "$W/ddp2_bf16.log")"
same ddp2_bf16 one2_bf16 0
# torchrun on one node (LOCAL_WORLD_SIZE = WORLD_SIZE): local rank 0 runs the job as mpirun -np WORLD_SIZE, the
# others end at once with exit 0 and write nothing; the bits of the same job under mpirun. Over several nodes
# (LOCAL_WORLD_SIZE < WORLD_SIZE) it is refused (exit 2) naming mpirun with a hostfile, or srun
tr=(RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)
env "${tr[@]}" "$SNUG" train $common --output_dir "$W/torchrun1" --ddp_deterministic true > "$W/torchrun1.log" 2>&1
st=$?
[ $st -eq 0 ] && [ ! -e "$W/torchrun1" ] && ok || bad "torchrun's rank 1: exit $st, $(tail -1 "$W/torchrun1.log")"
tr=(RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)
[ "${SNUG_SANITIZED:-0}" = 1 ] && tr+=(ASAN_OPTIONS=detect_leaks=0)
env "${tr[@]}" "$SNUG" train $common --output_dir "$W/torchrun0" --ddp_deterministic true > "$W/torchrun0.log" 2>&1 &&
  grep -q "torchrun: 2 processes on one node.*mpirun -np 2" "$W/torchrun0.log" &&
  grep -q "data parallel *2 ranks (.*launched by mpirun" "$W/torchrun0.log" && ok ||
  bad "torchrun's rank 0: $(grep -v '^\[' "$W/torchrun0.log" | tail -2)"
same torchrun0 ddp2 0
env RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 "$SNUG" train $common --output_dir "$W/torchrun_nodes" \
  > "$W/torchrun_nodes.log" 2>&1
st=$?
[ $st -eq 2 ] && grep -q "torchrun-style launch over several nodes.*mpirun -np 4 .*hostfile.* or srun" \
  "$W/torchrun_nodes.log" && [ ! -e "$W/torchrun_nodes" ] && ok ||
  bad "torchrun over several nodes: exit $st, $(tail -1 "$W/torchrun_nodes.log")"
# rank 0 alone prints: one header
[ "$(grep -c '^snug: training' "$W/ddp3.log")" -eq 1 ] && ok || bad "ddp3: more than one rank printed"
# accumulation per rank: 2 ranks x 2 micro-batches against 4 in one process (each rank's own sum is a fold of its
# two micro-batches, so the order of additions differs: fp32 rounding)
run one4 0 --gradient_accumulation_steps 4 || bad "one4 did not train"
run ddp2x2 2 --ddp_deterministic true --gradient_accumulation_steps 2 || bad "ddp2x2 did not train"
same ddp2x2 one4 1e-5
# the all-reduce outside the deterministic mode at 3 ranks: on the shared-memory path the rank-order sum all the
# same (the same bits), on MPI's own (SNUG_MPI_SHM=0) its order of additions; and ordinary text on tied tiny-llama
run ddp3_shm 3 || bad "ddp3_shm did not train"
same ddp3_shm one3 0
SNUG_MPI_SHM=0 run ddp3_mpi 3 || bad "ddp3_mpi did not train"
same ddp3_mpi one3 1e-5
grep -q "data parallel *3 ranks (mpi-shm," "$W/ddp3_shm.log" && grep -q "data parallel *3 ranks (mpi," "$W/ddp3_mpi.log" &&
  ok || bad "ddp3_shm, ddp3_mpi: not the shared-memory path and MPI's own"
# deterministic through MPI's own collectives: the same bits as the shared-memory path
SNUG_MPI_SHM=0 run ddp2_mpi 2 --ddp_deterministic true || bad "ddp2_mpi did not train"
same ddp2_mpi ddp2 0
python3 - "$W/text.jsonl" <<'PY'
import json, random, sys
random.seed(1)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(200):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(3, 40)))}) + "\n")
PY
common="--dataset $W/text.jsonl $tok --sequence_len 48 --max_steps 4 --logging_steps 1 --learning_rate 1e-3
        --micro_batch_size 2"
run text_one 0 --gradient_accumulation_steps 2 || bad "text_one did not train"
run text_ddp 2 --ddp_deterministic true || bad "text_ddp did not train"
same text_ddp text_one 1e-5
# LoRA and QLoRA on the frozen tied base: only the adapters train, through GEMMs that add once per micro-batch, so ordinary
# text gives the same bits; the dropout masks follow the global micro-batch index
lora="--base_model $W/tied --adapter lora --lora_dropout 0.1 --learning_rate 1e-2"
run lora_one 0 $lora --gradient_accumulation_steps 2 || bad "lora_one did not train: $(tail -2 "$W/lora_one.log")"
run lora_ddp 2 $lora --ddp_deterministic true || bad "lora_ddp did not train: $(tail -2 "$W/lora_ddp.log")"
same lora_ddp lora_one 0
qlora="--base_model $W/tied --adapter qlora --lora_dropout 0.1 --learning_rate 1e-2 --max_steps 3"
run qlora_one 0 $qlora --gradient_accumulation_steps 2 || bad "qlora_one did not train: $(tail -2 "$W/qlora_one.log")"
run qlora_ddp 2 $qlora --ddp_deterministic true || bad "qlora_ddp did not train: $(tail -2 "$W/qlora_ddp.log")"
same qlora_ddp qlora_one 0
# DoRA (with dropout): each magnitude's gradient added once per micro-batch as well
dora="--base_model $W/tied --adapter lora --peft_use_dora true --lora_target_linear true --lora_dropout 0.1
      --learning_rate 1e-2 --max_steps 3"
run dora_one 0 $dora --gradient_accumulation_steps 2 || bad "dora_one did not train: $(tail -2 "$W/dora_one.log")"
run dora_ddp 2 $dora --ddp_deterministic true || bad "dora_ddp did not train: $(tail -2 "$W/dora_ddp.log")"
same dora_ddp dora_one 0

# a whole epoch of 66 micro-batches on 4 ranks: its last step has 2, so ranks 2 and 3 take none (their zero
# gradients still join the sums); the same bits as one process accumulating 4, and with optimizer_in_backward (the
# sum of each layer's gradients inside backward) as without it
common="${ids/--max_steps 4/--num_epochs 1} --max_grad_norm 0 --ddp_deterministic true"
run epoch_one 0 --gradient_accumulation_steps 4 || bad "epoch_one did not train"
run epoch_ddp 4 || bad "epoch_ddp did not train: $(tail -2 "$W/epoch_ddp.log")"
run epoch_oib 4 --optimizer_in_backward true || bad "epoch_oib did not train: $(tail -2 "$W/epoch_oib.log")"
grep -q "17 steps (66 micro-batches per epoch)" "$W/epoch_ddp.log" && ok || bad "epoch_ddp: not 17 steps of 66 micro-batches"
same epoch_ddp epoch_one 0
same epoch_oib epoch_one 0
# refused before anything is written, naming the key
run no_ddp 2 --ddp false
[ $? -ne 0 ] && grep -q "ddp is false" "$W/no_ddp.log" && ok || bad "ddp false under 2 ranks: $(tail -1 "$W/no_ddp.log")"
# CUDA ranks: ddp_backend: mpi would stage every gradient through host memory, refused on every rank before any GPU
# is touched (so on any machine); ddp_backend: nccl on CPU ranks is refused too; both are bad input (exit 2)
run mpi_gpu 2 --device cuda --ddp_backend mpi
[ $? -eq 2 ] && [ "$(grep -c 'error: rank [01] of 2: 2 ranks: ddp_backend is mpi on CUDA ranks.*ddp_backend: nccl' "$W/mpi_gpu.log")" -eq 2 ] &&
  [ ! -e "$W/mpi_gpu" ] && ok || bad "ddp_backend mpi on CUDA ranks: $(tail -1 "$W/mpi_gpu.log")"
run nccl_cpu 2 --device cpu --ddp_backend nccl
[ $? -eq 2 ] && grep -q "ddp_backend is nccl but device is cpu" "$W/nccl_cpu.log" && [ ! -e "$W/nccl_cpu" ] && ok ||
  bad "ddp_backend nccl on CPU ranks: $(tail -1 "$W/nccl_cpu.log")"
# checkpoints under data parallel: every rank holds the same state and rank 0 saves it; a run stopped at a
# checkpoint and resumed on as many ranks continues bit for bit, and so does one resumed as one process accumulating
# both ranks' micro-batches (the same micro-batches per step); a split that would change them is refused, naming it
common="$ids --ddp_deterministic true"
run ck_full 2 --max_steps 6 || bad "ck_full did not train: $(tail -2 "$W/ck_full.log")"
run ck 2 --max_steps 6 --save_steps 2 || bad "ck did not train: $(tail -2 "$W/ck.log")"
rm -rf "$W/ck/checkpoint-4" "$W/ck/model.safetensors"
run ck 2 --max_steps 6 --save_steps 2 --resume_from_checkpoint latest &&
  grep -q "resumed from .*checkpoint-2 at step 2 of 6" "$W/ck.log" && ok || bad "ck did not resume: $(tail -2 "$W/ck.log")"
same ck ck_full 0
rm -rf "$W/ck1" && cp -r "$W/ck" "$W/ck1" && rm -rf "$W/ck1/checkpoint-4" "$W/ck1/checkpoint-6" "$W/ck1/model.safetensors"
run ck1 0 --max_steps 6 --save_steps 2 --gradient_accumulation_steps 2 --resume_from_checkpoint latest &&
  grep -q "resumed from .*checkpoint-2 at step 2 of 6" "$W/ck1.log" && ok ||
  bad "ck1 did not resume as one process: $(tail -2 "$W/ck1.log")"
same ck1 ck_full 0
run ck3 3 --max_steps 6 --resume_from_checkpoint "$W/ck/checkpoint-2"
[ $? -ne 0 ] && grep -q "steps take 2 micro-batches (2 ranks x gradient_accumulation_steps 1), this run's 3" "$W/ck3.log" &&
  ok || bad "resume on 3 ranks of a 2-rank checkpoint: $(tail -1 "$W/ck3.log")"
# SIGTERM to every rank (as a scheduler's preemption sends it): the ranks finish the step together, rank 0 saves,
# every rank exits 0, and the resumed run is the run that never stopped
run sig_full 2 --max_steps 200 || bad "sig_full did not train"
stopped sig 2 --max_steps 200
rc=$?
step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\) of 200.*/\1/p' "$W/sig.log")
if [ $rc -eq 0 ] && [ -n "$step" ] && [ -f "$W/sig/checkpoint-$step/trainer_state.hash" ]; then
  ok
  run sig 2 --max_steps 200 --resume_from_checkpoint latest || bad "sig did not resume: $(tail -2 "$W/sig.log")"
  same sig sig_full 0
else
  bad "SIGTERM to 2 ranks: exit $rc, $(tail -5 "$W/sig.log")"
fi
# the communicator: the rank-order sum bit for bit; a collective signature mismatch and a stuck or dead rank end
# every rank with an error instead of a hang
if [ -n "${SNUG_COMM_TEST:-}" ]; then
  for np in 2 3; do
    pre=("${MPI[@]}" -np $np)
    [ "${SNUG_SANITIZED:-0}" = 1 ] && pre=(env ASAN_OPTIONS=detect_leaks=0 "${pre[@]}")
    timeout 120 "${pre[@]}" "$SNUG_COMM_TEST" sum > "$W/sum$np.log" 2>&1 &&
      [ "$(grep -c ': ok$' "$W/sum$np.log")" -eq $np ] && ok ||
      bad "comm sum at $np ranks: $(grep -a -m3 ': error: ' "$W/sum$np.log" || tail -3 "$W/sum$np.log")"
    # the shared-memory path (every rank on this host) against MPI's own collectives: each bit for bit the
    # rank-order sum on awkward counts, and the same results (a digest per rank) on both
    for path in 1 0; do
      timeout 300 env SNUG_MPI_SHM=$path "${pre[@]}" "$SNUG_COMM_TEST" paths > "$W/paths$np.$path.log" 2>&1 &&
        [ "$(grep -c ': ok$' "$W/paths$np.$path.log")" -eq $np ] && ok ||
        bad "comm paths at $np ranks (SNUG_MPI_SHM=$path): $(grep rank "$W/paths$np.$path.log" | head -3)"
    done
    # split into groups (tensor parallelism's groups and data-parallel groups): each group's sums its own
    timeout 120 "${pre[@]}" "$SNUG_COMM_TEST" split > "$W/split$np.log" 2>&1 &&
      [ "$(grep -c ': ok$' "$W/split$np.log")" -eq $np ] && ok ||
      bad "comm split at $np ranks: $(tail -3 "$W/split$np.log")"
    want=$(grep -c ': mpi-shm digest' "$W/paths$np.1.log"):$(grep -c ': mpi digest' "$W/paths$np.0.log")
    [ "$want" = "$np:$np" ] && [ "$(grep -o 'rank [0-9]*: mpi-shm digest [0-9a-f]*' "$W/paths$np.1.log" | sort | sed 's/mpi-shm/mpi/')" = \
      "$(grep -o 'rank [0-9]*: mpi digest [0-9a-f]*' "$W/paths$np.0.log" | sort)" ] && ok ||
      bad "comm paths at $np ranks: the shared-memory path's results differ from MPI's own (or a path was not taken)"
    timeout 120 "${pre[@]}" "$SNUG_COMM_TEST" mismatch > "$W/mm$np.log" 2>&1
    st=$?
    [ $st -ne 0 ] && [ $st -ne 124 ] && [ "$(grep -c 'error: collective mismatch: rank 0 issued #1 allreduce_sum of 3 float32 (root 0) where rank 1 issued #1 allreduce_sum of 4' "$W/mm$np.log")" -eq $np ] &&
      ok || bad "comm mismatch at $np ranks: $(grep rank "$W/mm$np.log" | head -3)"
    if [ $np -eq 2 ]; then # the sharded collectives' counts are part of the signature
      timeout 120 "${pre[@]}" "$SNUG_COMM_TEST" shards > "$W/sh$np.log" 2>&1
      st=$?
      [ $st -ne 0 ] && [ $st -ne 124 ] && [ "$(grep -c 'error: collective mismatch: rank 0 issued #1 reduce_scatter_sum of 8 float32 (root [0-9]*) where rank 1 issued #1 reduce_scatter_sum of 8' "$W/sh$np.log")" -eq 2 ] &&
        ok || bad "comm shards mismatch: $(grep rank "$W/sh$np.log" | head -3)"
    fi
    t0=$(date +%s)
    timeout 120 "${pre[@]}" "$SNUG_COMM_TEST" timeout > "$W/to$np.log" 2>&1
    st=$? t=$(( $(date +%s) - t0 ))
    [ $st -ne 0 ] && [ $st -ne 124 ] && [ $t -lt 30 ] && [ "$(grep -c 'not complete after 2 s' "$W/to$np.log")" -eq $((np - 1)) ] &&
      ok || bad "comm timeout at $np ranks (exit $st after $t s): $(grep rank "$W/to$np.log" | head -3)"
    timeout 120 "${pre[@]}" "$SNUG_COMM_TEST" die > "$W/die$np.log" 2>&1
    st=$?
    [ $st -ne 0 ] && [ $st -ne 124 ] && ok || bad "comm die at $np ranks: exit $st"
  done
else
  echo "test_ddp: no SNUG_COMM_TEST (tests/dist/test_comm_mpi): the communicator's own checks not run"
fi
finish
