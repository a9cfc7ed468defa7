# losses.sh: shared by the CLI tests that compare runs by their logged losses (sourced, not a test itself).
# Needs lib.sh (SNUG, W, ok, bad) and `common` (the options every run shares) set by the sourcing script.

# train NAME ARGS...: one run into $W/NAME; its losses, one per step, into $W/NAME.loss
train() {
  local name=$1; shift
  if ! "$SNUG" train $common --output_dir "$W/$name" "$@" > "$W/$name.log" 2>&1; then
    bad "$name did not train"; tail -3 "$W/$name.log"; return 1
  fi
  python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" \
    "$W/$name/metrics.jsonl" > "$W/$name.loss"
}

# worst NAME REF: the worst relative difference of two runs' logged losses (inf when their steps differ)
worst() {
  python3 - "$W/$1.loss" "$W/$2.loss" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1]).read().split()]
b = [float(x) for x in open(sys.argv[2]).read().split()]
print(max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) and a else float("inf"))
PY
}

# compare NAME REF TOL: every logged loss of NAME within relative TOL of REF's (0: bitwise)
compare() {
  if python3 - "$W/$1.loss" "$W/$2.loss" "$3" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1]).read().split()]
b = [float(x) for x in open(sys.argv[2]).read().split()]
tol = float(sys.argv[3])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) and a else float("inf")
print(f"  {sys.argv[1].split('/')[-1][:-5]:<28} vs {sys.argv[2].split('/')[-1][:-5]:<12} worst rel {worst:.1e}")
sys.exit(0 if worst <= tol else 1)
PY
  then ok; else bad "$1 losses differ from $2"; fi
}
