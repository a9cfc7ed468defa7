#!/usr/bin/env bash
# ZeRO stage 1 over MPI ranks on the CPU against DDP at the same ranks: with the gradients summed in rank order
# (ddp_deterministic), the logged losses and gradient norms and the final weights are the same bits, at 2 and 3 ranks,
# with AdamW, 8-bit AdamW (paged and not), bf16 storage and accumulation; each rank's measured arenas equal its plan
# (memory.json for rank 0, memory.rankR.json for the others), and the optimizer arena is DDP's split N ways (exactly
# for fp32 state; with 8-bit state plus each rank's copy of the quantization maps and the alignment of its buffers).
# The settings not built are refused (exit 2) naming the key. Skipped (77) without mpirun or an MPI build.
set -u
SNUG=${SNUG_BIN:-build/snug}
SRC=${SNUG_SOURCE_DIR:-.}
command -v mpirun >/dev/null || { echo "test_zero: skipped: no mpirun (scripts/setup.sh installs openmpi-bin)"; exit 77; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pass=0 fail=0
MPI=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 # 3 ranks share 2 cores
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# the data of test_ddp.sh: every id once, so DDP itself is the bits of one process (see there); here the reference
# is DDP, which sums the same gradients, so any data would do, and this keeps the two tests' runs comparable
python3 - "$W/ids.jsonl" <<'PY'
import json, random, sys
random.seed(3)
ids = random.sample(range(1, 2048), 2047)
with open(sys.argv[1], "w") as f:
    i = 0
    while i + 24 <= len(ids):
        n = random.randint(6, 24)
        ex = ids[i:i + n]
        i += n
        p = random.randint(0, n // 2)
        f.write(json.dumps({"input_ids": ex, "labels": [-100] * p + ex[p:]}) + "\n")
PY
printf 'datasets:\n  - path: %s\n    type: pretokenized\n' "$W/ids.jsonl" > "$W/ids.yaml"
common="$W/ids.yaml --tokenizer $SRC/assets/tokenizer --sequence_len 32 --sample_tokens 0 --seed 5 --threads 1
        --max_steps 3 --logging_steps 1 --learning_rate 3e-3 --lr_scheduler cosine --max_grad_norm 0.5
        --micro_batch_size 2 --ddp_deterministic true"

# run NAME NP ARGS...: `snug train` as NP ranks into $W/NAME
run() {
  local name=$1 np=$2; shift 2
  local pre=("${MPI[@]}" -np "$np")
  [ "${SNUG_SANITIZED:-0}" = 1 ] && pre=(env ASAN_OPTIONS=detect_leaks=0 "${pre[@]}")
  "${pre[@]}" "$SNUG" train $common --output_dir "$W/$name" "$@" > "$W/$name.log" 2>&1
}
if ! run probe 2 --max_steps 1 && grep -q "built without MPI" "$W/probe.log"; then
  echo "test_zero: skipped: this snug was built without MPI"; exit 77
fi

# check NAME NP ARGS...: DDP and ZeRO-1 at NP ranks with ARGS give the same bits; each ZeRO rank's arenas are its
# plan, and its optimizer arena is DDP's split NP ways
check() {
  local name=$1 np=$2; shift 2
  run "ddp_$name" "$np" "$@" || { bad "ddp_$name did not train: $(tail -2 "$W/ddp_$name.log")"; return; }
  run "zero_$name" "$np" --zero_stage 1 --dist_debug true "$@" ||
    { bad "zero_$name did not train: $(tail -2 "$W/zero_$name.log")"; return; }
  python3 - "$W/ddp_$name/metrics.jsonl" "$W/zero_$name/metrics.jsonl" <<'PY' && ok || bad "zero_$name: the losses or gradient norms differ from DDP's"
import json, sys
a, b = ([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(p))] for p in sys.argv[1:3])
if a != b or not a:
    sys.exit(f"  DDP {a}\n  ZeRO {b}")
PY
  cmp -s "$W/ddp_$name/model.safetensors" "$W/zero_$name/model.safetensors" && ok ||
    bad "zero_$name: the weights differ from DDP's"
  grep -q "ZeRO *stage 1" "$W/zero_$name.log" && ok || bad "zero_$name: no ZeRO line in the header"
  python3 - "$W" "$name" "$np" <<'PY' && ok || bad "zero_$name: the memory per rank"
import json, sys
w, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ddp = json.load(open(f"{w}/ddp_{name}/memory.json"))
ranks = [json.load(open(f"{w}/zero_{name}/" + ("memory.json" if r == 0 else f"memory.rank{r}.json"))) for r in range(n)]
err = []
for r, j in enumerate(ranks):
    if j["plan"] != j["measured"]:
        err.append(f"rank {r}: measured {j['measured']} against the plan {j['plan']}")
    if j.get("ranks") != {"size": n, "rank": r, "zero_stage": 1}:
        err.append(f"rank {r}: memory.json says {j.get('ranks')}")
    for c in j["plan"]:
        if c != "optimizer state" and c != "workspace" and j["plan"][c] != ddp["plan"][c]:
            err.append(f"rank {r}: {c} {j['plan'][c]} where DDP plans {ddp['plan'][c]}")
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
print(f"  optimizer state per rank {opt} against DDP's {whole}")
sys.exit("\n".join(err) if err else 0)
PY
}

check adamw2 2
check adamw3 3
check q8_2 2 --optimizer adamw_8bit
check paged8_bf16_3 3 --optimizer paged_adamw_8bit --bf16 true --master_weights false
check bf16_2 2 --bf16 true --master_weights false
check accum_q8_3 3 --optimizer adamw_8bit --gradient_accumulation_steps 2

# the combinations not built: refused before training, exit 2, naming the key
refuse() {
  local what=$1 key=$2; shift 2
  "$SNUG" train $common --output_dir "$W/refused" "$@" > "$W/refused.log" 2>&1
  local st=$?
  [ $st -eq 2 ] && grep -q "$key" "$W/refused.log" && ok || bad "$what: exit $st, $(tail -1 "$W/refused.log")"
}
refuse "zero_stage 2" "zero_stage 2 is not supported yet" --zero_stage 2
refuse "zero_stage 3" "zero_stage 3 is not supported yet" --zero_stage 3
refuse "zero_stage -1" "zero_stage" --zero_stage -1
refuse "with optimizer_in_backward" "optimizer_in_backward" --zero_stage 1 --optimizer_in_backward true \
  --max_grad_norm 0
refuse "with an adapter" "adapter" --zero_stage 1 --adapter lora
refuse "with bf16 master weights" "master_weights" --zero_stage 1 --bf16 true
echo "test_zero: $pass passed, $fail failed"
[ $fail -eq 0 ]
