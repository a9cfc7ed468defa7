#!/usr/bin/env bash
# The CPU runtime as a user meets it: the training header names the GEMM kernels, chosen from cpuid unless
# OPENBLAS_CORETYPE says otherwise (and then said so, with a warning when they are slower than the CPU allows), and
# under bf16 where the GEMMs run and why; a BLAS that cannot be opened, or a SNUG_CPU_GEMM not understood, is one
# clear error; and the log is written line by line when stdout is a file, so a run
# killed mid-way keeps every line it printed.
. "$(dirname "$0")/lib.sh"
pid=
on_exit 'kill -9 $pid 2>/dev/null'

printf '{"text": "a small line of training text that repeats, with a few more words."}\n%.0s' $(seq 300) > "$W/data.jsonl"
T="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --model_preset tiny-llama --sequence_len 32
   --micro_batch_size 2 --sample_tokens 0 --val_set_size 0 --logging_steps 1"
tier=$(grep -m1 -o -w 'avx512f\|avx2' /proc/cpuinfo | sort | tail -1) # avx2 or avx512f ("" if neither)

# the header names the kernels, chosen from cpuid
env -u OPENBLAS_CORETYPE "$SNUG" train $T --max_steps 1 --output_dir "$W/a" > "$W/a.log" 2>&1
want='^  gemm +OpenBLAS [0-9.]+, [A-Za-z]+ kernels \('
[ -n "$tier" ] && want="${want}chosen from cpuid; CPU: "
if grep -Eq "$want" "$W/a.log"; then ok
else bad "header does not name the kernels chosen from cpuid: $(grep gemm "$W/a.log")"; fi
echo "  $(grep '^  gemm' "$W/a.log")"
if [ -n "$tier" ] && grep '^  gemm' "$W/a.log" | grep -Eq 'Prescott|Core2|Nehalem|Penryn|Atom|Barcelona|slower'; then
  bad "generic GEMM kernels on a CPU with $tier"
else ok; fi

# OPENBLAS_CORETYPE from the user wins and is named; generic kernels on an AVX2 CPU are flagged
if [ -n "$tier" ]; then
  OPENBLAS_CORETYPE=Haswell "$SNUG" train $T --max_steps 1 --output_dir "$W/b" > "$W/b.log" 2>&1
  if grep -q 'Haswell kernels (OPENBLAS_CORETYPE from the environment' "$W/b.log"; then ok
  else bad "OPENBLAS_CORETYPE=Haswell not honoured: $(grep gemm "$W/b.log")"; fi
  OPENBLAS_CORETYPE=Prescott "$SNUG" train $T --max_steps 1 --output_dir "$W/c" > "$W/c.log" 2>&1
  if grep -q 'Prescott kernels .*slower than this CPU allows: unset OPENBLAS_CORETYPE' "$W/c.log"; then ok
  else bad "generic kernels forced by hand are not flagged: $(grep gemm "$W/c.log")"; fi
fi

# a BLAS that cannot be opened: one error line, exit 2
SNUG_BLAS=$W/no-such-libopenblas.so.0 "$SNUG" train $T --max_steps 1 --output_dir "$W/d" > "$W/d.out" 2> "$W/d.err"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c 'snug: error:' "$W/d.err")" -eq 1 ] && grep -q 'no-such-libopenblas.*SNUG_BLAS' "$W/d.err"
then ok; else bad "unopenable BLAS: rc=$rc, $(head -c 300 "$W/d.err")"; fi

# bf16: the header says where the GEMMs run and why (oneDNN on the bf16 units, or OpenBLAS and the reason: on a CPU
# without bf16 units, that it has none); an unknown SNUG_CPU_GEMM is one clear error
env -u SNUG_CPU_GEMM "$SNUG" train $T --bf16 true --max_steps 1 --output_dir "$W/f" > "$W/f.log" 2>&1
if grep -Eq '^  gemm +(oneDNN [0-9.]+ bf16 on |OpenBLAS .*; fp32 GEMMs under bf16: .+)' "$W/f.log"; then ok
else bad "the bf16 header does not say where the GEMMs run: $(grep gemm "$W/f.log")"; fi
echo "  $(grep '^  gemm' "$W/f.log")"
if ! grep -qw 'avx512_bf16\|amx_bf16' /proc/cpuinfo; then
  if grep -q 'fp32 GEMMs under bf16: this CPU has no bf16 units' "$W/f.log"; then ok
  else bad "a CPU without bf16 units is not named as such: $(grep gemm "$W/f.log")"; fi
fi
SNUG_CPU_GEMM=fast "$SNUG" train $T --bf16 true --max_steps 1 --output_dir "$W/g" > "$W/g.out" 2> "$W/g.err"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c 'snug: error:' "$W/g.err")" -eq 1 ] && grep -q 'SNUG_CPU_GEMM=fast' "$W/g.err"
then ok; else bad "unknown SNUG_CPU_GEMM: rc=$rc, $(head -c 300 "$W/g.err")"; fi
# oneDNN forced where it cannot be opened (or was not built in): one error line naming the cause, exit 2
SNUG_CPU_GEMM=f32 SNUG_DNNL=$W/no-such-libdnnl.so.2 "$SNUG" train $T --max_steps 1 --output_dir "$W/h" > "$W/h.out" \
  2> "$W/h.err"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c 'snug: error:' "$W/h.err")" -eq 1 ] &&
   grep -Eq 'SNUG_CPU_GEMM=f32: (cannot open oneDNN .*no-such-libdnnl|this snug was built without oneDNN)' "$W/h.err"
then ok; else bad "unopenable oneDNN: rc=$rc, $(head -c 300 "$W/h.err")"; fi

# line-buffered log: with stdout a file, step lines appear while the run goes on, and a run killed with SIGKILL
# (no chance to flush) leaves only whole lines, the last logged step among them
"$SNUG" train $T --max_steps 100000 --output_dir "$W/e" > "$W/e.log" 2>&1 &
pid=$!
seen=0
for _ in $(seq 600); do
  n=$(grep -c '^step ' "$W/e.log")
  [ "$n" -ge 3 ] && { seen=1; break; }
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
alive=0; kill -0 $pid 2>/dev/null && alive=1
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null; pid=
if [ $seen -eq 1 ] && [ $alive -eq 1 ]; then ok; else bad "no step lines in the log while the run was going on"; fi
if [ -s "$W/e.log" ] && [ "$(tail -c 1 "$W/e.log" | od -An -c | tr -d ' ')" = '\n' ] &&
   tail -1 "$W/e.log" | grep -Eq '^step +[0-9]+/'; then ok
else bad "killed run's log does not end with a whole step line: $(tail -c 200 "$W/e.log")"; fi

finish
