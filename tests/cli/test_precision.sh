#!/usr/bin/env bash
# Mixed precision over a real training run: the same 300 steps in fp32, bf16 (with and without fp32 master weights)
# and fp16 (dynamic loss scaling) on fortune-like text, judged against the noise floor of fp32 itself, measured here:
# two more fp32 runs that differ only in their data order (data_seed). Which BLAS kernels run and how many threads
# they use moves every curve a little; the bounds move with the floor, so they hold on any machine.
# - curve: in every window of 25 steps, a 16-bit run's mean loss is no further from fp32's than twice the largest
#   gap between fp32 and its reordered runs over all windows;
# - end: its mean loss over the last 100 steps is within 3 standard errors of fp32's, the standard error being that
#   of a difference of two such means over independently drawn batches (from the per-step spread of the fp32 runs);
# - and the loss falls to under half its first window's.
# Their measured memory must show the 16-bit storage: parameters and saved activations half of fp32's, gradients
# smaller. Under AddressSanitizer (a Debug build, many times slower) the runs are 40 steps and only the memory is
# compared.
. "$(dirname "$0")/lib.sh"
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
[ $steps -eq 300 ] && train fp32_order --data_seed 4 && train fp32_order2 --data_seed 5
train bf16 --bf16 true
train bf16_nomaster --bf16 true --master_weights false
train fp16 --fp16 true
for run in bf16 bf16_nomaster fp16; do
  [ $steps -eq 300 ] || break
  if python3 - "$W" "$run" <<'PY'
import math, sys
w, run = sys.argv[1], sys.argv[2]
load = lambda name: [float(x) for x in open(f"{w}/{name}.loss").read().split()]
a, ref, alts = load(run), load("fp32"), [load("fp32_order"), load("fp32_order2")]
if not len(a) == len(ref) == 300 or any(len(x) != 300 for x in alts):
    sys.exit(1)
win, tail = 25, 100
means = lambda xs: [sum(xs[i:i + win]) / win for i in range(0, len(xs), win)]
ma, mr = means(a), means(ref)
dev = max(abs(x - y) / y for x, y in zip(ma, mr))
floor = max(abs(x - y) / y for alt in alts for x, y in zip(means(alt), mr))
def tail_stats(xs):
    t = xs[-tail:]
    m = sum(t) / tail
    return m, sum((x - m) ** 2 for x in t) / (tail - 1)
(ta, _), (tr, vr) = tail_stats(a), tail_stats(ref)
to, vo = tail_stats(alts[0])
se = math.sqrt((vr + sum(tail_stats(x)[1] for x in alts) / len(alts)) / tail)
falls = ma[-1] < 0.5 * ma[0]
print(f"  {run:<14} loss {ma[0]:.3f} -> {ma[-1]:.3f} (fp32 {mr[0]:.3f} -> {mr[-1]:.3f}); windows of {win}: worst "
      f"{100 * dev:.2f}% (fp32 noise floor {100 * floor:.2f}%, bound {200 * floor:.2f}%); last {tail} steps "
      f"{ta:.4f} vs {tr:.4f} (fp32 other order {to:.4f}; bound +-{3 * se:.4f})")
sys.exit(0 if dev <= 2 * floor and abs(ta - tr) <= 3 * se and falls else 1)
PY
  then ok; else bad "$run does not track fp32's loss curve within fp32's own noise"; fi
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
finish
