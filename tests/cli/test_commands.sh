#!/usr/bin/env bash
# The program's own flags, which a first user tries before anything else:
# - `snug --version` (and `snug version`) prints the version of src/core/version.h and exits 0;
# - `snug generate --help` (or -h, anywhere among its arguments) exits 0 and lists every flag the command takes, each
#   from the key table with its default; `snug help` points to it;
# - `snug help`, `snug train --help` and `snug plan --help` exit 0; an unknown command exits 2 naming it;
# - on a terminal, the progress bar's loss is the loss metrics.jsonl logs for that step, the smoothed one said so;
# - README.md's quick start runs as written (its YAML, plan, train, generate, merge), on a tiny base named as its
#   base_model and 64 alpaca lines: the adapter folder and the merged model folder are written.
. "$(dirname "$0")/lib.sh"

want=$(sed -n 's/^#define SNUG_VERSION "\(.*\)"$/\1/p' "$SRC/src/core/version.h")
[ -n "$want" ] || fatal "no SNUG_VERSION in src/core/version.h"
for v in --version version; do
  out=$("$SNUG" $v 2>&1); st=$?
  [ $st -eq 0 ] && [ "$out" = "snug $want" ] && ok || bad "snug $v: exit $st, '$out' (want 'snug $want')"
done

for h in "--help" "-h" "/some/model --prompt x --help"; do
  "$SNUG" generate $h > "$W/gen_help.log" 2>&1; st=$?
  [ $st -eq 0 ] || bad "snug generate $h: exit $st" "$W/gen_help.log"
  for flag in prompt max_new_tokens temperature top_k top_p seed threads adapter; do
    grep -q -- "--$flag" "$W/gen_help.log" && grep -qE "^  ([a-z_]+: .*\(also: .*\b$flag\b|$flag: )" "$W/gen_help.log" &&
      ok || bad "snug generate $h does not list --$flag with its line" "$W/gen_help.log"
  done
done
grep -q "sample_tokens: int = 64" "$W/gen_help.log" && ok || bad "generate --help: max_new_tokens without its default"
"$SNUG" help | grep -q "snug generate" && "$SNUG" help | grep -q -- "--version" && ok ||
  bad "snug help names neither generate --help nor --version"

for c in "help" "train --help" "plan --help" "preprocess --help"; do
  "$SNUG" $c > "$W/help.log" 2>&1 && [ -s "$W/help.log" ] && ok || bad "snug $c did not exit 0" "$W/help.log"
done
"$SNUG" frobnicate > "$W/unknown.log" 2>&1; st=$?
[ $st -eq 2 ] && grep -q "unknown command 'frobnicate'" "$W/unknown.log" && ok || bad "unknown command: exit $st" "$W/unknown.log"

# a terminal (util-linux's script gives the run one): each redraw of the bar against metrics.jsonl's step
if command -v script > /dev/null; then
  script -qc "'$SNUG' train --model_preset tiny-llama --max_steps 3 --logging_steps 1 --sample_tokens 0 --threads 2 \
    --sequence_len 64 --dataset '$SRC/data/fortunes.jsonl' --output_dir '$W/bar'" /dev/null > "$W/bar.tty" 2>&1 < /dev/null
  bar=$(tr '\r' '\n' < "$W/bar.tty" | sed -n 's#^\[[#.]*\] \([0-9]*\)/3 loss \([0-9.]*\) (smoothed [0-9.]*) .*#\1 \2#p')
  # the same number printed two ways (%.4f; metrics.jsonl's 9 digits): equal within the last printed digit
  python3 -c 'import json,sys
logged = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1])) if "loss" in j and "step" in j}
bar = [l.split() for l in sys.argv[2].splitlines()]
sys.exit(not (bar and len(bar) == len(logged) and all(abs(float(x) - logged[int(s)]) <= 6e-5 for s, x in bar)))' \
    "$W/bar/metrics.jsonl" "$bar" && ok || bad "the bar's losses ($bar) are not metrics.jsonl's" "$W/bar.tty"
else
  echo "  (no script: the progress bar's check skipped)"
fi

# README's quick start, as written: a tiny Llama saved under the base_model name it uses
mkdir -p "$W/qs" && cd "$W/qs" || fatal "no $W/qs"
"$SNUG" train --model_preset tiny-llama --max_steps 1 --sample_tokens 0 --sequence_len 64 --threads 2 \
  --dataset "$SRC/data/fortunes.jsonl" --output_dir base > base.log 2>&1 || fatal "the tiny base did not train" base.log
base=$(sed -n 's/^base_model: *\([^ ]*\).*/\1/p' "$SRC/README.md" | head -1)
[ -n "$base" ] && mv base "$base" || fatal "README's quick start names no base_model"
python3 -c 'import json
with open("data.jsonl", "w") as f:
    for i in range(64):
        f.write(json.dumps({"instruction": "Add %d and %d." % (i, i + 1), "input": "", "output": str(2 * i + 1)}) + "\n")'
sed -n "/^cat > instruct.yaml <<'EOF'$/,/^EOF$/p" "$SRC/README.md" | sed '1d;$d' > instruct.yaml
sed -n '/^snug plan instruct.yaml/,/^snug merge /p' "$SRC/README.md" > quickstart.sh
[ -s instruct.yaml ] && [ "$(wc -l < quickstart.sh)" -ge 4 ] || fatal "README's quick start not found"
snug() { "$SNUG" "$@"; }
export -f snug; export SNUG
if bash -e quickstart.sh > quickstart.log 2>&1 && [ -f out/instruct/adapter_model.safetensors ] &&
   [ -f out/merged/model.safetensors ] && grep -q "fits" quickstart.log; then ok
else bad "README's quick start did not run as written" quickstart.log; fi
cd - > /dev/null
finish
