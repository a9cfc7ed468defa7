#!/usr/bin/env bash
# unfrozen_parameters (Axolotl's freeze_layers_except) through `snug train`, on tiny-llama with an untied head:
# - the tensors no pattern matches come out bitwise the base's; those matched change; of the embedding trained in
#   rows [100:900] (no weight decay) only those rows change;
# - the optimizer state is the trained tensors' alone (8 bytes per trained float with AdamW), the gradients theirs and
#   their fused partners' (q/k/v, gate/up: one GEMM writes them), in fp32 and bf16; the measured arenas equal the
#   plan, and the header and `snug plan` count the trained parameters;
# - the step inside backward (per-layer buffers of every tensor's gradients) gives the bits of the step after
#   backward over packed gradients, in fp32 and bf16; a run stopped at a checkpoint and resumed is the run that never
#   stopped, and resuming with other patterns is refused naming the setting;
# - over 2 MPI ranks, ZeRO-1, 2 and 3 (whose gradients are not packed) give the bits of DDP (whose are), and a 2-stage
#   pipeline one process's (skipped without mpirun);
# - a broken pattern, one that matches nothing, a range outside the tensor, an empty item, a non-list, an adapter and
#   tensor parallelism are refused (exit 2) naming the key, before anything is written.
. "$(dirname "$0")/lib.sh"
mpi_setup # MPI, one OpenMP thread per process (without mpirun the several-rank checks below are skipped)
. "$SRC/tests/cli/ranks.sh" # run, refused

. "$SRC/tests/cli/ids_data.sh"
tok="--tokenizer $SRC/assets/tokenizer --sequence_len 32 --sample_tokens 0 --seed 5 --threads 1"
. "$SRC/tests/cli/untied_base.sh"
common="$tok --base_model $W/base --max_steps 4 --logging_steps 1 --learning_rate 3e-3 --micro_batch_size 2
        --weight_decay 0"

# config NAME PATTERN...: ids.yaml with unfrozen_parameters listing the patterns, as $W/NAME.yaml
config() {
  local name=$1; shift
  { cat "$W/ids.yaml"; echo "unfrozen_parameters:"; for p in "$@"; do printf '  - "%s"\n' "$p"; done; } \
    > "$W/$name.yaml"
}
PATTERNS=("model.layers.[13].mlp" "model.layers.2.self_attn.q_proj" '^model.embed_tokens.weight$[100:900]' "model.norm")
config unf "${PATTERNS[@]}"

# same A B: the two runs' logged losses and final weights are the same bits
same() {
  cmp -s <(grep -o '"loss": *[^,]*' "$W/$1/metrics.jsonl") <(grep -o '"loss": *[^,]*' "$W/$2/metrics.jsonl") &&
    cmp -s "$W/$1/model.safetensors" "$W/$2/model.safetensors" && ok || bad "$1 differs from $2"
}

# --- one process: what trains, what stays, the memory ---
run unf 0 "$W/unf.yaml" || bad "unf did not train: $(tail -2 "$W/unf.log")"
run whole 0 "$W/ids.yaml" || bad "whole did not train: $(tail -2 "$W/whole.log")"
python3 - "$W" "${PATTERNS[@]}" <<'PY' && ok || bad "unf: the weights or the memory"
import json, re, struct, sys
w, patterns = sys.argv[1], sys.argv[2:]

def load(path):  # safetensors without numpy: name -> (shape, raw fp32 bytes)
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}

base, got = load(f"{w}/base/model.safetensors"), load(f"{w}/unf/model.safetensors")
regex = []
for p in patterns:  # Axolotl's reading: a trailing [a:b] is a row range, each '.' literal, matched at the start
    m = re.match(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$", p)
    regex.append((re.compile((m.group(1) if m else p).replace(".", "\\.")), (int(m.group(2)), int(m.group(3)))
                  if m else None))
err, trained, kept = [], 0, 0
fused = lambda n: re.sub(r"\.(q|k|v)_proj\.", ".qkv.", re.sub(r"\.(gate|up)_proj\.", ".gate_up.", n))
live = {fused(n) for n in base if any(rx.match(n) for rx, _ in regex)}
for name, (shape, b) in base.items():
    kept += len(b) // 4 if fused(name) in live else 0  # one GEMM writes q/k/v's (gate/up's) gradients together
    hits = [r for rx, r in regex if rx.match(name)]
    g = got[name][1]
    if not hits:
        if g != b:
            err.append(f"frozen {name} changed")
        continue
    numel = len(b) // 4
    trained += numel
    ranges = [r for r in hits if r]
    if not ranges:
        if g == b:
            err.append(f"{name} did not train")
        continue
    row = numel // shape[0] * 4
    for r in range(shape[0]):
        inside = any(a <= r < z for a, z in ranges)
        same = g[r * row:(r + 1) * row] == b[r * row:(r + 1) * row]
        if not inside and not same:
            err.append(f"{name}: row {r} outside its ranges changed")
    if all(g[r * row:(r + 1) * row] == b[r * row:(r + 1) * row] for a, z in ranges for r in range(a, z)):
        err.append(f"{name}: no row of its ranges changed")
mem, whole = json.load(open(f"{w}/unf/memory.json")), json.load(open(f"{w}/whole/memory.json"))
if mem["plan"] != mem["measured"]:
    err.append(f"measured {mem['measured']} against the plan {mem['plan']}")
opt = mem["plan"]["optimizer state"]
if not 0 <= opt - 8 * trained <= 2 * 64:  # m and v, fp32, of the trained floats; each buffer 64-byte aligned
    err.append(f"optimizer state {opt} bytes for {trained} trained floats")
if whole["plan"]["optimizer state"] <= opt:
    err.append("no optimizer state saved")
grads = mem["plan"]["gradients"]
if not 0 <= grads - 4 * kept <= 64:  # fp32 gradients of the trained tensors and their fused partners alone
    err.append(f"gradients {grads} bytes for {kept} floats kept")
print(f"  unf: {trained} of {sum(len(b) // 4 for _, b in base.values())} floats train; optimizer state {opt} bytes, "
      f"gradients {grads} (every tensor: {whole['plan']['optimizer state']}, {whole['plan']['gradients']}); the "
      f"frozen tensors are the base's bytes")
for e in err:
    print("  " + e)
sys.exit(1 if err else 0)
PY
# the header's count of trained floats: the optimizer state holds 8 bytes for each
python3 - "$W" <<'PY' && ok || bad "the header's count of trained parameters"
import json, re, sys
n = int(re.search(r"unfrozen +(\d+)", open(f"{sys.argv[1]}/unf.log").read()).group(1))
opt = json.load(open(f"{sys.argv[1]}/unf/memory.json"))["plan"]["optimizer state"]
sys.exit(0 if 0 <= opt - 8 * n <= 2 * 64 else 1)
PY
"$SNUG" plan "$W/unf.yaml" $common > "$W/plan.txt" 2>&1 &&
  grep -q "unfrozen .* of the .* parameters train" "$W/plan.txt" && ok ||
  bad "snug plan: $(grep -a -i 'error\|unfrozen' "$W/plan.txt" | head -2)"

# --- the step inside backward, bf16 storage: the same bits ---
run oib 0 "$W/unf.yaml" --optimizer_in_backward true --max_grad_norm 0 ||
  bad "oib did not train: $(tail -2 "$W/oib.log")"
run after 0 "$W/unf.yaml" --max_grad_norm 0 || bad "after did not train: $(tail -2 "$W/after.log")"
same oib after
run bf16_oib 0 "$W/unf.yaml" --bf16 true --optimizer_in_backward true --max_grad_norm 0 ||
  bad "bf16_oib did not train: $(tail -2 "$W/bf16_oib.log")"
run bf16 0 "$W/unf.yaml" --bf16 true --max_grad_norm 0 || bad "bf16 did not train: $(tail -2 "$W/bf16.log")"
same bf16_oib bf16  # (the step inside backward keeps one layer's gradients, of every tensor; the other run packs them)
run bf16_whole 0 "$W/ids.yaml" --bf16 true --max_grad_norm 0 || bad "bf16_whole did not train"
python3 - "$W" <<'PY' && ok || bad "bf16: the gradients' memory"
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{n}/memory.json")) for n in ("bf16", "bf16_whole"))
sys.exit(0 if a["plan"] == a["measured"] and a["plan"]["gradients"] < b["plan"]["gradients"] else 1)
PY

# --- resume ---
run cont 0 "$W/unf.yaml" --max_steps 6 || bad "cont did not train"
run stop 0 "$W/unf.yaml" --max_steps 6 --save_steps 3 || bad "stop did not train"
rm -rf "$W/stop/checkpoint-6" "$W/stop/model.safetensors"
"$SNUG" train $common "$W/unf.yaml" --max_steps 6 --save_steps 3 --output_dir "$W/stop" \
  --resume_from_checkpoint latest > "$W/stop.resume.log" 2>&1 &&
  grep -q "resumed from .*checkpoint-3" "$W/stop.resume.log" && same stop cont ||
  bad "stop did not resume: $(grep -a error "$W/stop.resume.log")"
config other "model.layers.[13].mlp"
rm -rf "$W/stop/checkpoint-6" "$W/stop/model.safetensors"
"$SNUG" train $common "$W/other.yaml" --max_steps 6 --save_steps 3 --output_dir "$W/stop" \
  --resume_from_checkpoint latest > "$W/other.log" 2>&1
[ $? -eq 2 ] && grep -q "trained with unfrozen_parameters" "$W/other.log" && ok ||
  bad "resuming with other patterns: $(grep -a error "$W/other.log")"

# --- several ranks ---
if command -v mpirun > /dev/null && run probe 2 "$W/unf.yaml" --max_steps 1 ; then
  run ddp 2 "$W/unf.yaml" --ddp_deterministic true || bad "ddp did not train: $(tail -2 "$W/ddp.log")"
  for z in 1 2 3; do
    run zero$z 2 "$W/unf.yaml" --ddp_deterministic true --zero_stage $z ||
      bad "zero$z did not train: $(tail -2 "$W/zero$z.log")"
    same zero$z ddp
  done
  run ga 0 "$W/unf.yaml" --gradient_accumulation_steps 2 --max_grad_norm 0 || bad "ga did not train"
  run pp 2 "$W/unf.yaml" --gradient_accumulation_steps 2 --max_grad_norm 0 --pipeline_parallel_size 2 ||
    bad "pp did not train: $(tail -2 "$W/pp.log")"
  same pp ga
  echo "  ZeRO-1/2/3 at 2 ranks are DDP's bits, a 2-stage pipeline one process's"
elif grep -q "built without MPI" "$W/probe.log" 2> /dev/null || ! command -v mpirun > /dev/null; then
  echo "  (no mpirun or an MPI build: the several-rank checks skipped)"
else
  bad "the 2-rank probe: $(tail -2 "$W/probe.log")"
fi

# --- refused, before anything is written ---
config broken "model.layers.(" &&
  refused broken 0 "unfrozen_parameters\[0\] .* is not a regular expression" "$W/broken.yaml"
config nothing "model.norm" "model.layer.0" &&
  refused nothing 0 "unfrozen_parameters\[1\] 'model.layer.0' matches no tensor" "$W/nothing.yaml"
config outside "model.norm.weight[0:100000]" && refused outside 0 "outside its 256 rows" "$W/outside.yaml"
config backwards "model.norm.weight[9:3]" && refused backwards 0 "end must come after its start" "$W/backwards.yaml"
config empty "model.norm" "" && refused empty 0 "unfrozen_parameters\[1\] is empty" "$W/empty.yaml"
{ cat "$W/ids.yaml"; echo "unfrozen_parameters: model.norm"; } > "$W/scalar.yaml"
refused scalar 0 "unfrozen_parameters must be a list" "$W/scalar.yaml"
refused lora 0 "unfrozen_parameters picks the tensors a full fine-tune trains" "$W/unf.yaml" --adapter lora
refused tp 0 "unfrozen_parameters with tensor_parallel_size 2 is not supported" "$W/unf.yaml" --tensor_parallel_size 2

finish
