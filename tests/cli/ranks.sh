# ranks.sh: shared by the multi-rank CLI tests (sourced after lib.sh and its mpi_setup or need_mpi, not a test
# itself). Needs `common` (the options every run shares) set by the sourcing script before the first run.

# run NAME NP ARGS...: `snug train` as NP ranks (0: one process without mpirun) into $W/NAME, its output in
# $W/NAME.log
run() {
  local name=$1 np=$2; shift 2
  local pre=()
  [ "$np" -gt 0 ] && pre=("${MPI[@]}" -np "$np")
  # the sanitizer build: Open MPI's own allocations at exit are not snug's leaks
  [ "$np" -gt 0 ] && [ "${SNUG_SANITIZED:-0}" = 1 ] && pre=(env ASAN_OPTIONS=detect_leaks=0 "${pre[@]}")
  "${pre[@]}" "$SNUG" train $common --output_dir "$W/$name" "$@" > "$W/$name.log" 2>&1
}

# skip_without_mpi ARGS...: a 2-rank probe run with ARGS; skips (77) when this snug was built without MPI
skip_without_mpi() {
  if ! run probe 2 "$@" && grep -q "built without MPI" "$W/probe.log"; then
    skip "this snug was built without MPI"
  fi
}

# refused NAME NP PATTERN ARGS...: the run exits 2 on every rank before anything is written, its error matching PATTERN
refused() {
  local name=$1 np=$2 pat=$3; shift 3
  run "$name" "$np" "$@"
  local st=$?
  [ $st -eq 2 ] && grep -q "$pat" "$W/$name.log" && [ ! -e "$W/$name" ] && ok ||
    bad "$name: exit $st, $(grep -a error "$W/$name.log" | head -1)"
}

# stopped NAME NP ARGS...: `snug train` as NP ranks into $W/NAME (its output in $W/NAME.log), every rank sent SIGTERM
# once it has logged 3 steps; returns its exit status
stopped() {
  local name=$1 np=$2; shift 2
  local pre=("${MPI[@]}" -np "$np")
  [ "${SNUG_SANITIZED:-0}" = 1 ] && pre=(env ASAN_OPTIONS=detect_leaks=0 "${pre[@]}")
  "${pre[@]}" "$SNUG" train $common "$@" --output_dir "$W/$name" > "$W/$name.log" 2>&1 &
  local mp=$! i
  for i in $(seq 200); do
    [ -s "$W/$name/metrics.jsonl" ] && [ "$(wc -l < "$W/$name/metrics.jsonl")" -ge 3 ] && break
    sleep 0.1
  done
  pkill -TERM -P "$mp" -f -- "--output_dir $W/$name\$"
  wait $mp
}

# text_data FILE: 240 completion examples of 3 to 40 words (a fixed seed)
text_data() {
  python3 - "$1" <<'PY'
import json, random, sys
random.seed(3)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(240):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(3, 40)))}) + "\n")
PY
}
