#!/usr/bin/env bash
# gpu-check.sh: builds snug with the CUDA backend on a machine with one NVIDIA GPU, checks that every binary starts,
# runs the CUDA tests (a failing one again with CUDA_LAUNCH_BLOCKING=1 and under compute-sanitizer), a memory probe
# and the GPU benchmarks against PyTorch, and ends with one summary table. Offline: nothing is downloaded or
# installed. Uses the system python3 (PyTorch and transformers installed there; without them the PyTorch benchmarks
# are skipped). On a machine without Debian's -dev packages it builds against deps/ (scripts/fetch-deps.sh, run
# beforehand where the packages can be fetched; carry deps/ with the tree).
#
#     scripts/gpu-check.sh            # build dir: a fresh /tmp/snug-gpu-check.XXXXXX (or $SNUG_GPU_BUILD)
#
# Stages, each under `timeout` and all within one budget of GPU_CHECK_BUDGET seconds (default 470, under 8 minutes):
#   configure (cmake -DSNUG_CUDA=ON) <= 60 s   build <= 200 s (GPU_CHECK_BUILD_CAP)
#   startup <= 60 s: every executable's libraries resolve (and none needs libnccl: NCCL is opened at run time),
#     `snug --help` runs, and with no GPU visible (CUDA_VISIBLE_DEVICES=) every CUDA test skips (exit 77) and
#     `snug train --device cuda` is refused (exit 2), never a crash
#   ctest -L cuda -LE nccl <= 200 s; then the NCCL communicator, ctest -L nccl <= 120 s (test_comm_nccl: one rank
#     against comm_self; test_nccl_join: the join ends within dist_timeout against a stand-in NCCL that hangs,
#     fails or joins; cli_test_cuda_train_nccl: one rank through NCCL bitwise against the run without); each
#     failing test again with CUDA_LAUNCH_BLOCKING=1 (<= 90 s, errors reported where the kernel ran) and under
#     compute-sanitizer when the toolkit has it (<= 120 s)
#   probe_memory <= 60 s: GPT-2 124M, 3 steps: the plan against cudaMemGetInfo
#   bench_attention_gpu <= 60 s   bench_attention_torch.py <= 90 s   bench_train_gpu.py <= 300 s
# A stage gets at most what is left of the budget, so a slow build shortens the benchmarks instead of the whole run
# overrunning. Without a GPU (or with none visible) it says so first, builds, runs the start-up checks and stops
# there. Exit status: 0 when the build, the start-up checks and the tests pass, 1 when one fails, 2 when a tool is
# missing, 3 when no GPU is visible (the build and the start-up checks passed; nothing ran on a GPU). To try the
# script on a slow CPU-only machine: GPU_CHECK_BUDGET=3000 GPU_CHECK_BUILD_CAP=2800 scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-470}

# ---------------------------------------------------------------------------------------------- tools
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
missing=()
for t in cmake make gcc nvcc python3 timeout; do
  command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
# The libraries snug links (libyaml, jansson, PCRE2, utf8proc) and OpenBLAS: the system's, or else the Debian
# packages scripts/fetch-deps.sh put in deps/debs, unpacked here into deps/root and built against alone.
sys_deps=1
if command -v pkg-config >/dev/null 2>&1; then
  for m in yaml-0.1 jansson libpcre2-8 libutf8proc; do pkg-config --exists "$m" || sys_deps=0; done
else
  sys_deps=0
fi
compgen -G '/usr/lib/*/openblas-openmp/libopenblas.so.0' >/dev/null || compgen -G '/usr/lib/*/libopenblas.so.0' >/dev/null ||
  sys_deps=0
DEPS_ARGS=()
DEPS="system"
if [ $sys_deps = 0 ]; then
  if ls deps/debs/*.deb >/dev/null 2>&1; then
    rm -rf deps/root
    python3 scripts/unpack_debs.py deps/debs deps/root
    DEPS_ARGS=("-DSNUG_DEPS_ROOT=$ROOT/deps/root")
    DEPS="deps/root (unpacked from deps/debs)"
  else
    missing+=("the -dev packages of libyaml, jansson, PCRE2, utf8proc and OpenBLAS: run scripts/fetch-deps.sh where\
 Debian's packages can be fetched and bring deps/ along (or install them: scripts/setup.sh)")
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-check: missing:"
  for m in "${missing[@]}"; do echo "  $m"; done
  exit 2
fi

# offline, whatever the environment says
export PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

BUILD=${SNUG_GPU_BUILD:-$(mktemp -d /tmp/snug-gpu-check.XXXXXX)}
rm -rf "$BUILD"
mkdir -p "$BUILD/logs"
LOGS=$BUILD/logs

GPU="none visible"
HAVE_GPU=0
ARCH_FLAG=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ]; then
  HAVE_GPU=1
  GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ "$cc" =~ ^[0-9]+$ ]] && ARCH_FLAG=("-DCMAKE_CUDA_ARCHITECTURES=$cc") # this GPU only: half the compile time
fi
if [ $HAVE_GPU = 0 ]; then
  echo "gpu-check: NO GPU IS VISIBLE (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES is empty): this run only builds"
  echo "gpu-check: and checks that every binary starts; the CUDA tests, probes and benchmarks need a GPU"
fi
SAN=$(command -v compute-sanitizer 2>/dev/null || true)
[ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
HAVE_TORCH=0
python3 -c 'import torch, transformers; assert torch.cuda.is_available()' >/dev/null 2>&1 && HAVE_TORCH=1
echo "gpu-check: GPU: $GPU; build in $BUILD; libraries: $DEPS; PyTorch with CUDA: $([ $HAVE_TORCH = 1 ] && echo yes || echo no)"

# ---------------------------------------------------------------------------------------------- stages
declare -A RESULT SECS
ORDER=()
# stage NAME CAP LOG QUIET COMMAND...: runs COMMAND under timeout (CAP or what is left of the budget), output to LOG
# (and to the terminal unless QUIET=1); records the result; never fails the script.
stage() {
  local name=$1 cap=$2 log=$3 quiet=$4
  shift 4
  ORDER+=("$name")
  local left=$((BUDGET - (SECONDS - START)))
  local lim=$((cap < left ? cap : left))
  if [ "$lim" -lt 5 ]; then
    RESULT[$name]="not run (budget spent)"
    SECS[$name]=0
    return 0
  fi
  echo "== $name (at most ${lim}s)"
  local t0=$SECONDS rc=0
  if [ "$quiet" = 1 ]; then
    timeout --kill-after=10 "$lim" "$@" >"$log" 2>&1 || rc=$?
  else
    timeout --kill-after=10 "$lim" "$@" 2>&1 | tee "$log" || rc=$?
  fi
  SECS[$name]=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    RESULT[$name]=ok
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    RESULT[$name]="TIMED OUT (${lim}s)"
  else
    RESULT[$name]="FAILED (exit $rc)"
  fi
  if [ $rc -ne 0 ] && [ "$quiet" = 1 ]; then
    echo "-- last lines of $log:"
    tail -n 30 "$log" || true
  fi
  return 0
}
skip() {
  ORDER+=("$1")
  RESULT[$1]="skipped: $2"
  SECS[$1]=0
}

stage configure 60 "$LOGS/configure.log" 1 cmake -S "$ROOT" -B "$BUILD" -DSNUG_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  "${ARCH_FLAG[@]}" "${DEPS_ARGS[@]}"
if [ "${RESULT[configure]}" = ok ] && ! grep -q "CUDA backend: on" "$LOGS/configure.log"; then
  RESULT[configure]="FAILED (CUDA backend off: see $LOGS/configure.log)"
fi
if [ "${RESULT[configure]}" = ok ]; then
  stage build "${GPU_CHECK_BUILD_CAP:-200}" "$LOGS/build.log" 1 cmake --build "$BUILD" -j"$(nproc)"
else
  skip build "configure failed"
fi

# startup.sh BUILD ROOT: the start-up checks (see the top); one line per check, exit 1 when any fails
cat > "$BUILD/startup.sh" <<'SH'
set -u
B=$1 ROOT=$2 bad=0
say() { printf '  %-64s %s\n' "$1" "$2"; }
nexe=0 nmiss=0
for f in "$B"/snug "$B"/test_* "$B"/bench_* "$B"/bench/gpu/bench_*; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  nexe=$((nexe + 1))
  miss=$(ldd "$f" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
  if [ -n "$miss" ]; then say "$(basename "$f") loads" "FAILED: $miss not found"; nmiss=$((nmiss + 1)); fi
done
if [ $nmiss = 0 ] && [ $nexe -gt 0 ]; then say "$nexe executables: every library resolves (ldd)" ok; else bad=1; fi
if ldd "$B/snug" 2>&1 | grep -q libnccl; then say "snug does not link libnccl (it opens it at run time)" FAILED; bad=1
else say "snug does not link libnccl (it opens it at run time)" ok; fi
if "$B/snug" --help > "$B/logs/startup_help.txt" 2>&1; then say "snug --help" ok; else say "snug --help" FAILED; bad=1; fi
export CUDA_VISIBLE_DEVICES=
printf '{"text": "a line of text to train on, repeated for a few steps."}\n%.0s' $(seq 50) > "$B/startup.jsonl"
rc=0
"$B/snug" train --dataset "$B/startup.jsonl" --tokenizer "$ROOT/assets/tokenizer" --model_preset tiny-llama \
  --sequence_len 32 --micro_batch_size 2 --max_steps 1 --sample_tokens 0 --val_set_size 0 --device cuda \
  --output_dir "$B/startup_out" > "$B/logs/startup_train.txt" 2>&1 || rc=$?
if [ $rc = 2 ] && grep -q "no CUDA GPU" "$B/logs/startup_train.txt"; then
  say "no GPU visible: snug train --device cuda is refused (exit 2)" ok
else
  say "no GPU visible: snug train --device cuda is refused (exit 2)" "FAILED (exit $rc: $(tail -1 "$B/logs/startup_train.txt"))"
  bad=1
fi
n=$(ctest --test-dir "$B" -N -L cuda | grep -c 'Test *#') || true
ctest --test-dir "$B" -L cuda > "$B/logs/startup_ctest.txt" 2>&1 || true
skipped=$(grep -c 'Test *#.*Skipped' "$B/logs/startup_ctest.txt") || true
if [ "$n" -gt 0 ] && [ "$skipped" = "$n" ] && ! grep -qE 'Failed|Exception|SEGFAULT|Timeout' "$B/logs/startup_ctest.txt"; then
  say "no GPU visible: the $n CUDA tests skip (exit 77)" ok
else
  say "no GPU visible: the $n CUDA tests skip (exit 77)" "FAILED ($skipped skipped; see logs/startup_ctest.txt)"
  grep -E 'Test *#' "$B/logs/startup_ctest.txt" | sed 's/^/    /'
  bad=1
fi
exit $bad
SH
if [ "${RESULT[build]}" = ok ]; then
  stage startup 60 "$LOGS/startup.log" 0 bash "$BUILD/startup.sh" "$BUILD" "$ROOT"
else
  skip startup "no build"
fi
if [ "${RESULT[build]}" = ok ] && [ $HAVE_GPU = 1 ]; then
  stage ctest_cuda 200 "$LOGS/ctest.log" 0 ctest --test-dir "$BUILD" -L cuda -LE nccl --output-on-failure
  if [ "${RESULT[ctest_cuda]}" = ok ] && grep -q "Skipped" "$LOGS/ctest.log"; then
    RESULT[ctest_cuda]="SKIPPED (no GPU seen by the test)"
  fi
  stage nccl 120 "$LOGS/nccl.log" 0 ctest --test-dir "$BUILD" -L nccl --output-on-failure
  if [ "${RESULT[nccl]}" = ok ] && grep -q "Skipped" "$LOGS/nccl.log"; then
    RESULT[nccl]="SKIPPED (no GPU seen by the test)"
  fi
  # each failing test again: with every launch synchronous, so the error names the kernel that failed, and under
  # compute-sanitizer (its memcheck: out-of-bounds and misaligned accesses, CUDA API errors)
  for t in $(cat "$LOGS/ctest.log" "$LOGS/nccl.log" 2>/dev/null | grep -v '(Skipped)' | sed -n 's/^[[:space:]]*[0-9]* - \([A-Za-z0-9_]*\) (.*$/\1/p' | sort -u); do
    stage "rerun $t" 90 "$LOGS/rerun_$t.log" 1 env CUDA_LAUNCH_BLOCKING=1 ctest --test-dir "$BUILD" -R "^$t\$" \
      --output-on-failure
    if [ -n "$SAN" ]; then
      stage "sanitize $t" 120 "$LOGS/sanitize_$t.log" 1 "$SAN" --target-processes all --error-exitcode 99 \
        --print-limit 20 ctest --test-dir "$BUILD" -R "^$t\$" --output-on-failure
    else
      skip "sanitize $t" "no compute-sanitizer in this toolkit"
    fi
  done
  pm=$BUILD/probe_memory
  mkdir -p "$pm"
  printf '{"text": "a line of text to train on, repeated for a few steps."}\n%.0s' $(seq 400) > "$pm/data.jsonl"
  stage probe_memory 60 "$LOGS/probe_memory.log" 0 "$BUILD/snug" train --dataset "$pm/data.jsonl" \
    --tokenizer "$ROOT/assets/tokenizer" --model_preset gpt2-124m --device cuda --bf16 true --sequence_len 1024 \
    --micro_batch_size 4 --sample_packing true --max_steps 3 --sample_tokens 0 --val_set_size 0 --output_dir "$pm/out"
  stage bench_attention_gpu 60 "$LOGS/bench_attention_gpu.log" 0 "$BUILD/bench/gpu/bench_attention_gpu"
elif [ "${RESULT[build]}" = ok ]; then
  skip ctest_cuda "no GPU visible"
  skip nccl "no GPU visible"
  skip probe_memory "no GPU visible"
  skip bench_attention_gpu "no GPU visible"
else
  skip ctest_cuda "no build"
  skip nccl "no build"
  skip probe_memory "no build"
  skip bench_attention_gpu "no build"
fi
if [ $HAVE_TORCH = 1 ]; then
  stage bench_attention_torch 90 "$LOGS/bench_attention_torch.log" 0 python3 "$ROOT/bench/gpu/bench_attention_torch.py"
else
  skip bench_attention_torch "PyTorch with CUDA not importable by python3"
fi
if [ $HAVE_TORCH = 1 ] && [ "${RESULT[build]}" = ok ]; then
  left=$((BUDGET - (SECONDS - START)))
  per_run=$(((left < 300 ? left : 300) / 4)) # two models, each trained by snug and by PyTorch
  stage bench_train_gpu 300 "$LOGS/bench_train_gpu.log" 0 python3 "$ROOT/bench/gpu/bench_train_gpu.py" \
    --snug "$BUILD/snug" --steps 8 --timeout "$per_run"
else
  skip bench_train_gpu "needs the build and PyTorch with CUDA"
fi

# ---------------------------------------------------------------------------------------------- summary
echo
echo "==================================== gpu-check summary ===================================="
echo "GPU: $GPU    logs: $LOGS    total $((SECONDS - START)) s"
printf "%-28s %-52s %6s\n" stage result seconds
for s in "${ORDER[@]}"; do
  printf "%-28s %-52s %6s\n" "$s" "${RESULT[$s]}" "${SECS[$s]}"
done
if [ -f "$LOGS/probe_memory.log" ]; then # the plan's arenas against the device's use (context + workspace + scratch)
  echo "probe_memory (GPT-2 124M, bf16, 4 x 1024):"
  grep -E "^  (memory|total|device memory in use)" "$LOGS/probe_memory.log" || true
fi
python3 - "$LOGS" <<'EOF'
import os, sys
logs = sys.argv[1]

def lines(name, tag):
    p = os.path.join(logs, name)
    if not os.path.exists(p):
        return []
    out = []
    for l in open(p, errors="replace"):
        if l.startswith(tag + " "):
            out.append(dict(kv.split("=", 1) for kv in l.split()[1:] if "=" in kv))
    return out

attn = lines("bench_attention_gpu.log", "attn") + lines("bench_attention_torch.log", "attn")
if attn:
    impls = list(dict.fromkeys(r["impl"] for r in attn))
    shapes = list(dict.fromkeys((r["B"], r["T"], r["NH"], r["HD"]) for r in attn))
    got = {(r["impl"], r["B"], r["T"], r["NH"], r["HD"]): r for r in attn}
    print("\nattention, causal: TFLOP/s forward / forward+backward")
    print(f"{'B':>2} {'T':>5} {'NH':>3} {'HD':>4}  " + "  ".join(f"{i:>20}" for i in impls))
    for s in shapes:
        cells = []
        for i in impls:
            r = got.get((i,) + s)
            cells.append(f"{float(r['fwd_tflops']):8.1f} / {float(r['fwdbwd_tflops']):7.1f}" if r else f"{'-':>20}")
        print(f"{s[0]:>2} {s[1]:>5} {s[2]:>3} {s[3]:>4}  " + "  ".join(f"{c:>20}" for c in cells))
train = lines("bench_train_gpu.log", "train")
if train:
    print("\ntraining: tokens/s, MFU (bf16 peak), peak memory (GiB); ratio = snug / PyTorch")
    print(f"{'model':<10} {'B':>2} {'T':>5} {'snug tok/s':>11} {'torch tok/s':>12} {'ratio':>6} {'snug MFU':>9} "
          f"{'torch MFU':>9} {'snug GiB':>9} {'torch GiB':>9}  notes")
    for r in train:
        st, tt = float(r["snug_tok_s"]), float(r["torch_tok_s"])
        ratio = f"{st / tt:5.2f}x" if st and tt else "   n/a"
        notes = f"snug peak: {r['snug_peak_kind']}; torch optimizer: {r['torch_optimizer']}"
        print(f"{r['model']:<10} {r['B']:>2} {r['T']:>5} {st:>11.0f} {tt:>12.0f} {ratio} {r['snug_mfu']:>8}% "
              f"{r['torch_mfu']:>8}% {r['snug_peak_gib']:>9} {r['torch_peak_gib']:>9}  {notes}")
EOF
case "${RESULT[build]}/${RESULT[startup]}/${RESULT[ctest_cuda]}/${RESULT[nccl]}" in
  ok/ok/ok/ok) exit 0 ;;
  "ok/ok/skipped: no GPU visible/skipped: no GPU visible")
    echo "gpu-check: NO GPU was visible: the build and the start-up checks passed; nothing ran on a GPU"
    exit 3 ;;
  *) exit 1 ;;
esac
