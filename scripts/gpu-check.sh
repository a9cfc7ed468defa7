#!/usr/bin/env bash
# gpu-check.sh: builds snug with the CUDA backend on a machine with one NVIDIA GPU, checks that every binary starts,
# runs the CUDA tests (a failing one again with CUDA_LAUNCH_BLOCKING=1 and under compute-sanitizer), a memory probe
# and the GPU benchmarks against PyTorch, and ends with one summary table. Made for a short lease on a lent GPU
# machine (docs/GPU.md gives the call): it records the machine first and writes each result the moment it is known,
# so a run cut short still says what it found. Offline: nothing is downloaded or installed. Uses the system python3
# (PyTorch and transformers installed there; without them the PyTorch benchmarks are skipped). On a machine without
# Debian's -dev packages (or without pkg-config) it builds against deps/debs (scripts/fetch-deps.sh, run beforehand
# where the packages can be fetched), unpacked here into deps/root.
#
#     scripts/gpu-check.sh                   # every stage below
#     scripts/gpu-check.sh --only TEST       # one ctest test again (CUDA_LAUNCH_BLOCKING=1 in front: launches in order)
#     scripts/gpu-check.sh --sanitize TEST   # one ctest test under compute-sanitizer (memcheck)
#
# Environment:
#   SNUG_GPU_BUILD    build folder, absolute or relative to the repository's root (default: a fresh
#                     /tmp/snug-gpu-check.XXXXXX). A folder that already holds a configured build of this checkout with
#                     the same generator is reused, not deleted: cmake --build then rebuilds only what changed, and
#                     --only / --sanitize skip configure and build altogether when its last build succeeded
#                     (GPU_CHECK_REBUILD=1 rebuilds first all the same).
#   GPU_CHECK_OUT     where the results go (default: $OUT where set, else BUILD/logs): env.txt (the machine: GPU,
#                     driver, nvcc, gcc, cmake, make/ninja/pkg-config, where libcublasLt and libnccl are, PyTorch),
#                     written first; summary.txt, one line per stage as it starts and ends, then the final table and
#                     the benchmark tables; failures.txt, the log (or its tail) of each stage that failed, the failing
#                     tests' output among them; logs.tar.gz, every log, at the end. Four files at most.
#   GPU_CHECK_BUDGET  seconds for the whole run (default 470, under 8 minutes), GPU_CHECK_BUILD_CAP the build's share
#                     (default 200), GPU_CHECK_CUDA_ARCH the architectures to build for (default: the visible GPU's,
#                     else CMake's list, 80;90).
#
# Stages, each under `timeout` and all within the one budget, the time to record the machine included:
#   configure (cmake -DSNUG_CUDA=ON -DSNUG_CUDA_WERROR=OFF: the machine's gcc may warn where ours does not)
#     <= 60 s, with make, else Ninja (ninja on the PATH or python3's ninja package); neither: exit 2
#   build <= 200 s (GPU_CHECK_BUILD_CAP)
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
# there. Exit status: 0 when the build, the start-up checks and the tests pass (with --only / --sanitize: when that
# test passes), 1 when one fails, 2 when a tool is missing or the arguments are wrong, 3 when no GPU is visible (the
# build and the start-up checks passed, or the one test ran and skipped; nothing ran on a GPU). To try the script on
# a slow CPU-only machine: GPU_CHECK_BUDGET=3000 GPU_CHECK_BUILD_CAP=2800 SNUG_GPU_BUILD=build-gpu scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-470}

usage() {
  echo "usage: scripts/gpu-check.sh [--only TEST | --sanitize TEST]   (TEST: a ctest name, e.g. test_cuda_ops)" >&2
  exit 2
}
MODE=all
TEST=
case "${1-}" in
  "") ;;
  --only | --sanitize)
    if [ $# != 2 ] || ! [[ "$2" =~ ^[A-Za-z0-9_]+$ ]]; then usage; fi
    MODE=${1#--}
    TEST=$2 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) usage ;;
esac

# ---------------------------------------------------------------------------------------------- folders
if [ -n "${SNUG_GPU_BUILD-}" ]; then
  BUILD=$(realpath -m "$SNUG_GPU_BUILD") # relative to the repository's root: we are there
else
  BUILD=$(mktemp -d /tmp/snug-gpu-check.XXXXXX)
fi
bdir=${BUILD%/}
case "$ROOT/" in
  "$bdir"/*) echo "gpu-check: SNUG_GPU_BUILD=$BUILD holds the repository itself; name a folder inside it" >&2; exit 2 ;;
esac
LOGS=$BUILD/logs
OUTD=$(realpath -m "${GPU_CHECK_OUT:-${OUT:-$LOGS}}")
SUMMARY=$OUTD/summary.txt
FAILURES=$OUTD/failures.txt

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# The generator: the one an existing build of this checkout was configured with while its tool is here (so it is
# reused), else make, else Ninja (also python3's ninja package, which a machine with PyTorch often has).
have() { command -v "$1" >/dev/null 2>&1; }
if ! have ninja; then
  nb=$(python3 -c 'import ninja, os; print(ninja.BIN_DIR)' 2>/dev/null || true)
  [ -n "$nb" ] && [ -x "$nb/ninja" ] && export PATH=$PATH:$nb
fi
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" 2>/dev/null | head -1 || true; }
old_gen=$(cache_get CMAKE_GENERATOR)
old_home=$(cache_get CMAKE_HOME_DIRECTORY)
GEN=""
if [ "$old_gen" = "Unix Makefiles" ] && have make; then GEN=$old_gen
elif [ "$old_gen" = Ninja ] && have ninja; then GEN=Ninja
elif have make; then GEN="Unix Makefiles"
elif have ninja; then GEN=Ninja
fi

# Reuse the build folder when it holds a configured build of this checkout with this generator; else start it
# afresh, but delete only what looks like a build folder (never a folder named by mistake).
REUSE=0
if [ -f "$BUILD/CMakeCache.txt" ] && [ "$old_home" = "$ROOT" ] && [ "$old_gen" = "$GEN" ] && [ -n "$GEN" ]; then
  REUSE=1
elif [ -d "$BUILD" ] && [ -n "$(ls -A "$BUILD")" ]; then
  if [ -f "$BUILD/CMakeCache.txt" ] || [ -d "$BUILD/logs" ]; then
    rm -rf "$BUILD"
  else
    echo "gpu-check: $BUILD is not empty and holds no build: name another SNUG_GPU_BUILD" >&2
    exit 2
  fi
fi
BUILT=0 # the last build in this folder succeeded
[ $REUSE = 1 ] && [ -f "$BUILD/.gpu-check-built" ] && BUILT=1
if [ "$MODE" = all ]; then
  rm -rf "$LOGS" # last run's logs would be taken for this one's
fi
mkdir -p "$LOGS" "$OUTD"
rm -f "$OUTD/env.txt" "$SUMMARY" "$FAILURES" "$OUTD/logs.tar.gz"
note() { echo "$*" >>"$SUMMARY"; } # summary.txt, written as we go: it survives the run being killed
# keep TITLE FILE [LINES]: a failing stage's log (or its last LINES lines) into failures.txt
keep() {
  [ -f "$2" ] || return 0
  { echo "=================== $1 ($2)"; if [ -n "${3-}" ]; then tail -n "$3" "$2"; else cat "$2"; fi; echo; } \
    >>"$FAILURES" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------- the machine
# env.txt first: what the rest of the run stands on, before anything can fail or hang. Each probe has a time limit.
probe() {
  echo "## $*"
  timeout --kill-after=5 60 "$@" 2>&1 || echo "(exit $?)"
  echo
}
NVCC_NOTE=""
{
  echo "# gpu-check environment, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), $(nproc) cores"
  echo "repository: $ROOT at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '(no git)'); build: $BUILD" \
    "(reused: $([ $REUSE = 1 ] && echo yes || echo no)); mode: $MODE $TEST"
  echo
  probe nvidia-smi
  probe nvidia-smi -L
  probe nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  probe nvcc --version
  probe gcc --version
  probe cmake --version
  echo "## tools"
  for t in make ninja pkg-config compute-sanitizer python3 ldd ldconfig; do
    printf '%-18s %s\n' "$t" "$(command -v "$t" || echo 'NOT FOUND')"
  done
  echo "generator: ${GEN:-none (neither make nor ninja)}"
  echo
  echo "## libcublasLt and libnccl: ldconfig -p"
  { ldconfig -p 2>/dev/null || true; } | grep -E 'libcublasLt|libnccl' || echo "(none)"
  echo "## libcublasLt and libnccl: the toolkit's folders"
  nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
  for d in "$nvcc_dir/../lib64" "$nvcc_dir"/../targets/*/lib /usr/local/cuda/lib64 \
    "/usr/lib/$(gcc -print-multiarch 2>/dev/null)"; do
    [ -d "$d" ] && find "$d/" -maxdepth 1 \( -name 'libcublasLt.so*' -o -name 'libnccl.so*' \) 2>/dev/null
  done | xargs -r realpath -s | sort -u
  echo "## libcublasLt and libnccl: python3's nvidia packages"
  timeout 60 python3 - <<'EOF' 2>&1 || true
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception as e:
    roots = []
    print(f"(no nvidia package: {e})")
found = [f for r in roots for pat in ("libcublasLt.so*", "libnccl.so*")
         for f in sorted(glob.glob(os.path.join(r, "**", pat), recursive=True))]
print("\n".join(found) if found else f"(none under {roots})")
EOF
  echo
  probe python3 -c "import torch; print(torch.__version__, torch.version.cuda, 'GPU:', torch.cuda.is_available())"
  # nvcc against this machine's host compiler: an unsupported gcc would turn the CUDA backend off at configure
  echo "## nvcc compiles a kernel (host compiler: $(gcc -dumpfullversion 2>/dev/null || echo '?'))"
  p=$(mktemp -d)
  printf '__global__ void k(float *x) { x[0] = 1.0f; }\n' >"$p/k.cu"
  if timeout 60 nvcc -c "$p/k.cu" -o "$p/k.o" >"$p/log" 2>&1; then
    echo ok
  elif grep -qi 'unsupported GNU version\|unsupported .* version' "$p/log"; then
    cat "$p/log"
    echo "-> building with NVCC_APPEND_FLAGS=-allow-unsupported-compiler"
  else
    cat "$p/log"
  fi
  rm -rf "$p"
} >"$OUTD/env.txt" 2>&1 || true
if grep -q '^-> building with NVCC_APPEND_FLAGS' "$OUTD/env.txt"; then
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS-} -allow-unsupported-compiler"
  NVCC_NOTE="; nvcc: -allow-unsupported-compiler (see env.txt)"
fi
echo "gpu-check: the machine is recorded in $OUTD/env.txt ($((SECONDS - START)) s)"

# ---------------------------------------------------------------------------------------------- tools
missing=()
for t in cmake gcc nvcc python3 timeout; do
  have "$t" || missing+=("$t")
done
[ -z "$GEN" ] && missing+=("make or ninja (CMake needs one of them to build)")
# The libraries snug links (libyaml, jansson, PCRE2, utf8proc) and OpenBLAS: the system's, or else the Debian
# packages scripts/fetch-deps.sh put in deps/debs, unpacked here into deps/root and built against alone.
sys_deps=1
if have pkg-config; then
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
    # the files keep the packages' dates, so unpacking again does not make a reused build rebuild
    rm -rf deps/root
    if python3 scripts/unpack_debs.py deps/debs deps/root >"$LOGS/unpack_debs.log" 2>&1; then
      DEPS_ARGS=("-DSNUG_DEPS_ROOT=$ROOT/deps/root")
      DEPS="deps/root (unpacked from deps/debs)"
    else
      missing+=("deps/root: scripts/unpack_debs.py failed: $(tail -1 "$LOGS/unpack_debs.log")")
    fi
  else
    missing+=("the -dev packages of libyaml, jansson, PCRE2, utf8proc and OpenBLAS: run scripts/fetch-deps.sh where\
 Debian's packages can be fetched and bring deps/debs along (or install them: scripts/setup.sh)")
  fi
fi
SAN=$(command -v compute-sanitizer 2>/dev/null || true)
[ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
[ "$MODE" = sanitize ] && [ -z "$SAN" ] && missing+=("compute-sanitizer (not in this CUDA toolkit)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-check: missing:" | tee -a "$SUMMARY"
  for m in "${missing[@]}"; do echo "  $m"; done | tee -a "$SUMMARY"
  exit 2
fi

# offline, whatever the environment says
export PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONUNBUFFERED=1 # a benchmark cut short still leaves its lines in the log

GPU="none visible"
HAVE_GPU=0
ARCH_FLAG=()
if have nvidia-smi && timeout 30 nvidia-smi -L >/dev/null 2>&1 && [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ]; then
  HAVE_GPU=1
  GPU=$(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  cc=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ "$cc" =~ ^[0-9]+$ ]] && ARCH_FLAG=("-DCMAKE_CUDA_ARCHITECTURES=$cc") # this GPU only: half the compile time
fi
[ -n "${GPU_CHECK_CUDA_ARCH-}" ] && ARCH_FLAG=("-DCMAKE_CUDA_ARCHITECTURES=$GPU_CHECK_CUDA_ARCH")
if [ $HAVE_GPU = 0 ]; then
  echo "gpu-check: NO GPU IS VISIBLE (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES is empty): this run only builds"
  echo "gpu-check: and checks that every binary starts; the CUDA tests, probes and benchmarks need a GPU"
fi
HAVE_TORCH=0
if [ "$MODE" = all ]; then
  timeout 60 python3 -c 'import torch, transformers; assert torch.cuda.is_available()' >/dev/null 2>&1 && HAVE_TORCH=1
fi
line="gpu-check: GPU: $GPU; build in $BUILD ($GEN, $([ $REUSE = 1 ] && echo reused || echo new)); libraries: $DEPS"
line+="; PyTorch with CUDA: $([ $HAVE_TORCH = 1 ] && echo yes || echo no)$NVCC_NOTE"
echo "$line"
note "$line"

# ---------------------------------------------------------------------------------------------- stages
declare -A RESULT SECS
ORDER=()
RESULT[environment]="recorded (env.txt)"
SECS[environment]=$((SECONDS - START))
ORDER+=(environment)
# done_ NAME: the stage's line into summary.txt
done_() { note "$(printf '[%4d s] done  %-28s %s (%s s)' $((SECONDS - START)) "$1" "${RESULT[$1]}" "${SECS[$1]}")"; }
# stage NAME CAP LOG QUIET COMMAND...: runs COMMAND under timeout (CAP or what is left of the budget), output to LOG
# (and to the terminal unless QUIET=1); records the result, in summary.txt at once; never fails the script.
stage() {
  local name=$1 cap=$2 log=$3 quiet=$4
  shift 4
  ORDER+=("$name")
  local left=$((BUDGET - (SECONDS - START)))
  local lim=$((cap < left ? cap : left))
  if [ "$lim" -lt 5 ]; then
    RESULT[$name]="not run (budget spent)"
    SECS[$name]=0
    done_ "$name"
    return 0
  fi
  echo "== $name (at most ${lim}s)"
  note "$(printf '[%4d s] start %-28s (at most %s s)' $((SECONDS - START)) "$name" "$lim")"
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
  done_ "$name"
  return 0
}
skip() {
  ORDER+=("$1")
  RESULT[$1]="skipped: $2"
  SECS[$1]=0
  done_ "$1"
}
# amend NAME RESULT: a stage's result corrected after a look at its log
amend() {
  RESULT[$1]=$2
  note "$(printf '[%4d s] note  %-28s %s' $((SECONDS - START)) "$1" "$2")"
}

# configure and build: always for the whole run; for --only / --sanitize only when no build is here to run
BUILD_OK=0
if [ "$MODE" = all ] || [ $BUILT = 0 ] || [ "${GPU_CHECK_REBUILD:-0}" = 1 ]; then
  rm -f "$BUILD/.gpu-check-built"
  stage configure 60 "$LOGS/configure.log" 1 cmake -S "$ROOT" -B "$BUILD" -G "$GEN" -DSNUG_CUDA=ON \
    -DSNUG_CUDA_WERROR=OFF -DCMAKE_BUILD_TYPE=Release "${ARCH_FLAG[@]}" "${DEPS_ARGS[@]}"
  if [ "${RESULT[configure]}" = ok ] && ! grep -q "CUDA backend: on" "$LOGS/configure.log"; then
    amend configure "FAILED (CUDA backend off: see logs/configure.log)"
  fi
  [ "${RESULT[configure]}" = ok ] || keep configure "$LOGS/configure.log" 150
  if [ "${RESULT[configure]}" = ok ]; then
    stage build "${GPU_CHECK_BUILD_CAP:-200}" "$LOGS/build.log" 1 cmake --build "$BUILD" -j"$(nproc)"
    if [ "${RESULT[build]}" = ok ]; then
      BUILD_OK=1
      touch "$BUILD/.gpu-check-built"
    else
      keep build "$LOGS/build.log" 200
    fi
  else
    skip build "configure failed"
  fi
else
  skip configure "build reused (GPU_CHECK_REBUILD=1 rebuilds)"
  skip build "build reused"
  BUILD_OK=1
fi

# one_test KIND: --only or --sanitize on $TEST; its stage's name in ONE
one_test() {
  local kind=$1 st
  if [ $BUILD_OK = 0 ]; then
    st="$kind $TEST"
    skip "$st" "no build"
  elif [ "$kind" = only ]; then
    st="$TEST"
    stage "$st" 10000 "$LOGS/only_$TEST.log" 0 ctest --test-dir "$BUILD" -R "^$TEST\$" --no-tests=error \
      --output-on-failure
    if [ "${RESULT[$st]}" = ok ] && grep -q "Skipped" "$LOGS/only_$TEST.log"; then
      amend "$st" "SKIPPED (no GPU seen by the test)"
    fi
    [ "${RESULT[$st]}" = ok ] || [ $HAVE_GPU = 0 ] || keep "$st" "$LOGS/only_$TEST.log"
  else
    st="sanitize $TEST"
    stage "$st" 10000 "$LOGS/sanitize_$TEST.log" 0 "$SAN" --target-processes all --error-exitcode 99 \
      --print-limit 20 ctest --test-dir "$BUILD" -R "^$TEST\$" --no-tests=error --output-on-failure
    [ "${RESULT[$st]}" = ok ] || keep "$st" "$LOGS/sanitize_$TEST.log"
  fi
  ONE=$st
}

if [ "$MODE" != all ]; then
  one_test "$MODE"
else
# startup.sh BUILD ROOT: the start-up checks (see the top); one line per check, exit 1 when any fails
cat >"$BUILD/startup.sh" <<'SH'
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
rm -rf "$B/startup_out"
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
  if [ "${RESULT[startup]}" != ok ]; then
    keep startup "$LOGS/startup.log"
    keep "startup: snug train --device cuda" "$LOGS/startup_train.txt" 40
    keep "startup: ctest -L cuda with no GPU visible" "$LOGS/startup_ctest.txt" 100
  fi
else
  skip startup "no build"
fi
if [ "${RESULT[build]}" = ok ] && [ $HAVE_GPU = 1 ]; then
  stage ctest_cuda 200 "$LOGS/ctest.log" 0 ctest --test-dir "$BUILD" -L cuda -LE nccl --output-on-failure
  if [ "${RESULT[ctest_cuda]}" = ok ] && grep -q "Skipped" "$LOGS/ctest.log"; then
    amend ctest_cuda "SKIPPED (no GPU seen by the test)"
  fi
  [ "${RESULT[ctest_cuda]}" = ok ] || keep ctest_cuda "$LOGS/ctest.log"
  stage nccl 120 "$LOGS/nccl.log" 0 ctest --test-dir "$BUILD" -L nccl --output-on-failure
  if [ "${RESULT[nccl]}" = ok ] && grep -q "Skipped" "$LOGS/nccl.log"; then
    amend nccl "SKIPPED (no GPU seen by the test)"
  fi
  [ "${RESULT[nccl]}" = ok ] || keep nccl "$LOGS/nccl.log"
  # each failing test again: with every launch synchronous, so the error names the kernel that failed, and under
  # compute-sanitizer (its memcheck: out-of-bounds and misaligned accesses, CUDA API errors)
  # shellcheck disable=SC2013 # ctest names are single words
  for t in $(cat "$LOGS/ctest.log" "$LOGS/nccl.log" 2>/dev/null | grep -v '(Skipped)' | sed -n 's/^[[:space:]]*[0-9]* - \([A-Za-z0-9_]*\) (.*$/\1/p' | sort -u); do
    stage "rerun $t" 90 "$LOGS/rerun_$t.log" 1 env CUDA_LAUNCH_BLOCKING=1 ctest --test-dir "$BUILD" -R "^$t\$" \
      --output-on-failure
    keep "rerun $t (CUDA_LAUNCH_BLOCKING=1): ${RESULT[rerun $t]}" "$LOGS/rerun_$t.log"
    if [ -n "$SAN" ]; then
      stage "sanitize $t" 120 "$LOGS/sanitize_$t.log" 1 "$SAN" --target-processes all --error-exitcode 99 \
        --print-limit 20 ctest --test-dir "$BUILD" -R "^$t\$" --output-on-failure
      keep "sanitize $t: ${RESULT[sanitize $t]}" "$LOGS/sanitize_$t.log"
    else
      skip "sanitize $t" "no compute-sanitizer in this toolkit"
    fi
  done
  pm=$BUILD/probe_memory
  rm -rf "$pm"
  mkdir -p "$pm"
  printf '{"text": "a line of text to train on, repeated for a few steps."}\n%.0s' $(seq 400) >"$pm/data.jsonl"
  stage probe_memory 60 "$LOGS/probe_memory.log" 0 "$BUILD/snug" train --dataset "$pm/data.jsonl" \
    --tokenizer "$ROOT/assets/tokenizer" --model_preset gpt2-124m --device cuda --bf16 true --sequence_len 1024 \
    --micro_batch_size 4 --sample_packing true --max_steps 3 --sample_tokens 0 --val_set_size 0 --output_dir "$pm/out"
  [ "${RESULT[probe_memory]}" = ok ] || keep probe_memory "$LOGS/probe_memory.log" 100
  stage bench_attention_gpu 60 "$LOGS/bench_attention_gpu.log" 0 "$BUILD/bench/gpu/bench_attention_gpu"
  [ "${RESULT[bench_attention_gpu]}" = ok ] || keep bench_attention_gpu "$LOGS/bench_attention_gpu.log" 100
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
  [ "${RESULT[bench_attention_torch]}" = ok ] || keep bench_attention_torch "$LOGS/bench_attention_torch.log" 100
else
  skip bench_attention_torch "PyTorch with CUDA not importable by python3"
fi
if [ $HAVE_TORCH = 1 ] && [ "${RESULT[build]}" = ok ]; then
  left=$((BUDGET - (SECONDS - START)))
  per_run=$(((left < 300 ? left : 300) / 4)) # two models, each trained by snug and by PyTorch
  stage bench_train_gpu 300 "$LOGS/bench_train_gpu.log" 0 python3 "$ROOT/bench/gpu/bench_train_gpu.py" \
    --snug "$BUILD/snug" --steps 8 --timeout "$per_run"
  [ "${RESULT[bench_train_gpu]}" = ok ] || keep bench_train_gpu "$LOGS/bench_train_gpu.log" 100
else
  skip bench_train_gpu "needs the build and PyTorch with CUDA"
fi
fi # MODE = all

# ---------------------------------------------------------------------------------------------- summary
# The table and the benchmark tables, on the terminal and at the end of summary.txt
{
  echo
  echo "==================================== gpu-check summary ===================================="
  echo "GPU: $GPU    logs: $LOGS    results: $OUTD    total $((SECONDS - START)) s"
  printf "%-28s %-52s %6s\n" stage result seconds
  for s in "${ORDER[@]}"; do
    printf "%-28s %-52s %6s\n" "$s" "${RESULT[$s]}" "${SECS[$s]}"
  done
  if [ "$MODE" = all ] && [ -f "$LOGS/probe_memory.log" ]; then # the plan's arenas against the device's use
    echo "probe_memory (GPT-2 124M, bf16, 4 x 1024):"
    grep -E "^  (memory|total|device memory in use)" "$LOGS/probe_memory.log" || true
  fi
  [ "$MODE" = all ] && python3 - "$LOGS" <<'EOF'
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
} 2>&1 | tee -a "$SUMMARY" || true

if [ "$MODE" = all ]; then
  case "${RESULT[build]}/${RESULT[startup]}/${RESULT[ctest_cuda]}/${RESULT[nccl]}" in
    ok/ok/ok/ok) status=0 ;;
    "ok/ok/skipped: no GPU visible/skipped: no GPU visible")
      echo "gpu-check: NO GPU was visible: the build and the start-up checks passed; nothing ran on a GPU" |
        tee -a "$SUMMARY"
      status=3 ;;
    *) status=1 ;;
  esac
else
  case "${RESULT[$ONE]}" in
    ok) status=0; [ $HAVE_GPU = 0 ] && status=3 ;;
    "SKIPPED (no GPU seen by the test)") status=1; [ $HAVE_GPU = 0 ] && status=3 ;;
    *) status=1 ;;
  esac
fi
# every log, compressed, beside the summary (not when the results go into the logs folder itself)
if [ "$OUTD" != "$LOGS" ]; then
  tar -czf "$OUTD/logs.tar.gz" -C "$BUILD" logs 2>/dev/null || true
fi
note "gpu-check: exit $status"
exit $status
