#!/usr/bin/env bash
# Mixed precision over a real training run: the same 300 steps in fp32, bf16 (with and without fp32 master weights)
# and fp16 (dynamic loss scaling) on fortune-like text. The 16-bit runs must track fp32's loss curve (means over
# windows of 25 steps within 5% while the loss falls fast, and the last window within 1.5%), and their measured
# memory must show the 16-bit storage: parameters and saved activations half of fp32's, gradients smaller. Under
# AddressSanitizer (a Debug build, many times slower) the runs are 40 steps and only the memory is compared.
set -u
SNUG=${SNUG_BIN:-build/snug}
SRC=${SNUG_SOURCE_DIR:-.}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pass=0 fail=0
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(11)
subjects = "the cat|a wizard|my neighbour|the old sailor|every programmer|a quiet fox|the committee".split("|")
verbs = "eats|writes|forgets|admires|rebuilds|sings about|argues with|dreams of".split("|")
objects = "the moon|a green apple|seven bridges|the final exam|an honest answer|the compiler|cold coffee".split("|")
with open(sys.argv[1], "w") as f:
    for i in range(3000):
        n = random.randint(1, 4)
        text = " ".join(f"{random.choice(subjects)} {random.choice(verbs)} {random.choice(objects)}." for _ in range(n))
        f.write(json.dumps({"text": text.capitalize()}) + "\n")
PY
steps=300
if ldd "$SNUG" 2>/dev/null | grep -q libasan; then steps=40; fi
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --model_preset tiny-llama --sequence_len 64
        --micro_batch_size 4 --sample_packing true --max_steps $steps --learning_rate 2e-3 --lr_scheduler cosine
        --warmup_steps 20 --sample_tokens 0 --logging_steps 1 --val_set_size 0 --seed 3"

. "$(dirname "$0")/losses.sh"

train fp32
train bf16 --bf16 true
train bf16_nomaster --bf16 true --master_weights false
train fp16 --fp16 true
for run in bf16 bf16_nomaster fp16; do
  [ $steps -eq 300 ] || break
  if python3 - "$W/$run.loss" "$W/fp32.loss" "$run" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1]).read().split()]
b = [float(x) for x in open(sys.argv[2]).read().split()]
win = 25
ma = [sum(a[i:i + win]) / win for i in range(0, len(a), win)]
mb = [sum(b[i:i + win]) / win for i in range(0, len(b), win)]
worst = max(abs(x - y) / y for x, y in zip(ma, mb))
last = abs(ma[-1] - mb[-1]) / mb[-1]
print(f"  {sys.argv[3]:<14} loss {a[0]:.3f} -> {ma[-1]:.3f} (fp32 {b[0]:.3f} -> {mb[-1]:.3f}); windows of {win}: "
      f"worst {100 * worst:.2f}%, last {100 * last:.2f}%")
sys.exit(0 if len(a) == len(b) == 300 and worst <= 0.05 and last <= 0.015 else 1)
PY
  then ok; else bad "$run does not track fp32's loss curve"; fi
done
# fp16 logs its loss scale and skipped steps
if grep -q '"loss_scale"' "$W/fp16/metrics.jsonl" && grep -q "fp16 loss scaling:" "$W/fp16.log"; then ok
else bad "fp16 run does not report its loss scaling"; fi
# the measured (arena high-water) memory of each category against fp32's
if python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
m = {r: json.load(open(f"{w}/{r}/memory.json"))["measured"] for r in ("fp32", "bf16", "bf16_nomaster", "fp16")}
ok = True
for r in ("bf16", "bf16_nomaster", "fp16"):
    p = m[r]["parameters"] / m["fp32"]["parameters"]
    a = m[r]["saved activations"] / m["fp32"]["saved activations"]
    g = m[r]["gradients"] / m["fp32"]["gradients"]
    mw = m[r]["master weights"]
    print(f"  {r:<14} parameters {p:.3f}x, saved activations {a:.3f}x, gradients {g:.3f}x of fp32; "
          f"master weights {mw / 2**20:.2f} MiB")
    ok &= abs(p - 0.5) < 1e-6 and a < 0.55 and g < 1.0 and (mw == 0) == (r == "bf16_nomaster")
sys.exit(0 if ok else 1)
PY
then ok; else bad "16-bit storage does not show in the measured memory"; fi
echo "test_precision: $pass passed, $fail failed"
[ $fail -eq 0 ]
