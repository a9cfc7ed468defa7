# lib.sh: the harness every CLI test sources first (`. "$(dirname "$0")/lib.sh"`; not a test itself). It sets
#   SNUG  the snug binary under test (SNUG_BIN, or build/snug), an absolute path
#   SRC   the source tree (SNUG_SOURCE_DIR, or .), an absolute path
#   W     a temporary folder, removed at exit (after the commands given to on_exit)
#   TEST  the test's name: its file name without .sh
# and the one family of checks, counted in pass and fail:
#   ok                  one check passed
#   bad MSG [LOG]       one check failed: prints "FAIL: MSG", then the last lines of the file LOG when given
#   check MSG CMD...    runs CMD: ok when it succeeds, else bad MSG
#   skip REASON         the test cannot run here: prints why and exits 77 (ctest's SKIP_RETURN_CODE)
#   fatal MSG [LOG]     bad MSG [LOG], then finish: for a failure that leaves nothing more to check
#   finish [NOTE]       the summary line "TEST: N passed, M failed" and the exit status: 1 when a check failed or
#                       when none was made (a test that checks nothing passes nothing), else 0
# and, for a test that starts several ranks:
#   mpi_setup           sets MPI (mpirun with what it needs here) and one OpenMP thread per rank; fails (1) when
#                       there is no mpirun, for the test to skip what needs it
#   need_mpi            mpi_setup, or the whole test skipped (77) without mpirun
# A test that ends without finish, skip or an exit status of its own fails: its checks would go uncounted.
set -u
SNUG=$(realpath -m "${SNUG_BIN:-build/snug}")
SRC=$(realpath -m "${SNUG_SOURCE_DIR:-.}")
TEST=$(basename "$0" .sh)
W=$(mktemp -d)
pass=0 fail=0
_lib_done=0
_lib_on_exit=()

# on_exit CMD: CMD (a string, evaluated) runs at exit, before $W is removed
on_exit() { _lib_on_exit+=("$1"); }

_lib_exit() {
  local st=$? c
  for c in ${_lib_on_exit[@]+"${_lib_on_exit[@]}"}; do eval "$c"; done
  cd / && rm -rf "$W"
  if [ "$st" -eq 0 ] && [ "$_lib_done" != 1 ]; then
    echo "FAIL: $TEST ended without its summary ($pass passed, $fail failed so far)"
    exit 1
  fi
  exit "$st"
}
trap _lib_exit EXIT

ok() { pass=$((pass + 1)); }

bad() {
  fail=$((fail + 1))
  echo "FAIL: $1"
  if [ -n "${2:-}" ] && [ -f "$2" ]; then tail -n 5 "$2" | head -c 800 | sed 's/^/  /'; fi
  return 0
}

check() {
  local msg=$1; shift
  if "$@"; then ok; else bad "$msg"; fi
}

skip() {
  _lib_done=1
  echo "$TEST: skipped: $*"
  exit 77
}

fatal() {
  bad "$@"
  finish
}

finish() {
  _lib_done=1
  echo "$TEST: $pass passed, $fail failed${1:+ ($1)}"
  if [ $((pass + fail)) -eq 0 ]; then
    echo "FAIL: $TEST made no checks"
    exit 1
  fi
  [ "$fail" -eq 0 ] && exit 0
  exit 1
}

mpi_setup() {
  MPI=(mpirun --oversubscribe)
  [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
  export OMP_NUM_THREADS=1 # (3 ranks share 2 cores)
  command -v mpirun >/dev/null
}

need_mpi() { mpi_setup || skip "no mpirun (scripts/setup.sh installs openmpi-bin)"; }
