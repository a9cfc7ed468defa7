#!/usr/bin/env bash
# Exact resume and safe stops. A run stopped at a checkpoint and resumed logs the same losses, learning rates, gradient
# norms and epochs, and ends with the same weights, bit for bit, as the run that never stopped: for fp32, GPT-2
# (transposed weights), bf16 with and without master weights, fp16's loss scaling, 8-bit and paged AdamW, accumulation
# across epoch ends, checkpointing, packing, grouping, auto_fit, reduce_lr_on_plateau's state and LoRA (fp32 with
# dropout; bf16 with 8-bit AdamW and checkpointing). SIGTERM and SIGINT finish the step, write a checkpoint and exit
# 0; SIGKILL at random moments (also during a checkpoint write) loses only the work since the last checkpoint and never
# leaves one that loads; a damaged checkpoint is refused naming the file; a changed configuration is refused naming the
# setting; an output_dir that holds a run is refused unless resumed or overwritten.
. "$(dirname "$0")/lib.sh"
head -n 3000 "$SRC/data/fortunes.jsonl" > "$W/data.jsonl"
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sequence_len 48 --micro_batch_size 4
        --sample_tokens 0 --learning_rate 2e-3 --logging_steps 1 --val_set_size 8 --eval_steps 4
        --dataset_prepared_path $W/prepared"
# The exactness checks run on a 0.2M-parameter Llama (width 64, 2 layers) and a GPT-2 of the same scale: what they
# compare is bits, which any size shows; the signal and SIGKILL checks keep the 3.7M tiny-llama preset, whose steps
# last long enough to be interrupted.
python3 - "$W" <<'PY'
import json, os, random, struct, sys
W = sys.argv[1]


def write(d, config, shapes, is_one):
    """config.json and an fp32 model.safetensors of seeded gauss(0, 0.02) values (1.0 where is_one(name))"""
    os.makedirs(d)
    json.dump(config, open(d + "/config.json", "w"))
    random.seed(1)
    header, blobs, off = {}, [], 0
    for name, shape in shapes.items():
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        vals = [1.0] * n if is_one(name) else [random.gauss(0, 0.02) for _ in range(n)]
        blobs.append(struct.pack(f"<{n}f", *vals))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * n]}
        off += 4 * n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


C, L, V, H, KV, I = 64, 2, 2048, 4, 2, 160
D = C // H
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                   p + "self_attn.q_proj.weight": [C, C], p + "self_attn.k_proj.weight": [KV * D, C],
                   p + "self_attn.v_proj.weight": [KV * D, C], p + "self_attn.o_proj.weight": [C, C],
                   p + "mlp.gate_proj.weight": [I, C], p + "mlp.up_proj.weight": [I, C],
                   p + "mlp.down_proj.weight": [C, I]})
write(W + "/small", {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V, "hidden_size": C,
                     "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": H,
                     "num_key_value_heads": KV, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
                     "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True},
      shapes, lambda name: "norm" in name)

# GPT-2 (its Conv1D weights stored transposed)
C, L, V, P = 32, 2, 2056, 64
shapes = {"wte.weight": [V, C], "wpe.weight": [P, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for i in range(L):
    for k, shape in {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
                     "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C],
                     "ln_2.weight": [C], "ln_2.bias": [C], "mlp.c_fc.weight": [C, 4 * C], "mlp.c_fc.bias": [4 * C],
                     "mlp.c_proj.weight": [4 * C, C], "mlp.c_proj.bias": [C]}.items():
        shapes[f"h.{i}.{k}"] = shape
write(W + "/gpt2-base", {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_embd": C,
                         "n_layer": L, "n_head": 2, "n_positions": P, "n_inner": None,
                         "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True},
      shapes, lambda name: "ln_" in name and name.endswith("weight"))
PY
fast="$common --base_model $W/small"

# same NAME REF: the logged curve and the final weights of two runs, bit for bit
same() {
  if python3 - "$W/$1" "$W/$2" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:3]]
keys = ("step", "epoch", "loss", "lr", "grad_norm", "val_loss", "loss_scale", "skipped_steps")
a, b = ([[r.get(k) for k in keys] for r in rs] for rs in rows)
import os
weights = lambda d: d + ("/adapter_model.safetensors" if os.path.exists(d + "/adapter_config.json") else "/model.safetensors")
w = [open(weights(d), "rb").read() for d in sys.argv[1:3]]
print(f"  {sys.argv[1].split('/')[-1]:<22} {len(a)} steps: curve {'same' if a == b else 'DIFFERS'}, weights "
      f"{'same' if w[0] == w[1] else 'DIFFER'}")
sys.exit(0 if a == b and a and w[0] == w[1] else 1)
PY
  then ok; else bad "$1 is not $2 resumed"; fi
}

# resumed NAME ARGS: the uninterrupted run, and a run that keeps only its checkpoint at step 4 and resumes from it
resumed() {
  local name=$1; shift
  local common=$fast
  case " $* " in *" --base_model "*) common=${fast% --base_model *} ;; esac
  "$SNUG" train $common "$@" --output_dir "$W/$name.full" > "$W/$name.full.log" 2>&1 || { bad "$name: $(tail -2 "$W/$name.full.log")"; return; }
  "$SNUG" train $common "$@" --save_steps 4 --output_dir "$W/$name" > "$W/$name.log" 2>&1 || { bad "$name: $(tail -2 "$W/$name.log")"; return; }
  for c in "$W/$name"/checkpoint-*; do [ "$c" = "$W/$name/checkpoint-4" ] || rm -rf "$c"; done
  rm -f "$W/$name/model.safetensors" "$W/$name/adapter_model.safetensors"
  if "$SNUG" train $common "$@" --save_steps 4 --output_dir "$W/$name" --resume_from_checkpoint latest > "$W/$name.resume.log" 2>&1 &&
     grep -q "resumed from .*checkpoint-4 at step 4" "$W/$name.resume.log"
  then same "$name" "$name.full"; else bad "$name did not resume: $(grep error "$W/$name.resume.log")"; fi
}

# the sanitizer build (several times slower) interrupts fewer runs below
quick=${SNUG_SANITIZED:-0}
resumed fp32 --max_steps 10
# GPT-2 stores its Conv1D weights transposed: the checkpoint keeps the fp32 weights only in model.safetensors, so
# resume reads them back through the transpose
resumed gpt2 --max_steps 10 --base_model "$W/gpt2-base"
[ -e "$W/gpt2/checkpoint-4/model.safetensors" ] && [ ! -e "$W/gpt2/checkpoint-4/state-params.bin" ] && ok ||
  bad "gpt2: the checkpoint holds $(ls "$W/gpt2/checkpoint-4" | tr '\n' ' ')"
resumed bf16 --max_steps 10 --bf16 true
resumed bf16_sr --max_steps 10 --bf16 true --master_weights false
resumed fp16 --max_steps 10 --fp16 true
# metrics.jsonl's keys are the ones README.md lists where it describes the file: this run (fp16, evaluating) writes
# each of them, and nothing else; every line holds all but val_loss, written on the steps that evaluate
python3 - "$SRC/README.md" "$W/fp16.full/metrics.jsonl" <<'PY' && ok || bad "metrics.jsonl's keys are not README.md's"
import json, re, sys
text = open(sys.argv[1]).read()
at = text.index("`metrics.jsonl`, one JSON object per")
listed = re.findall(r"`([a-z_0-9]+)`", text[at + len("`metrics.jsonl`"):text.index("`memory.json`", at)])
rows = [json.loads(l) for l in open(sys.argv[2])]
written = sorted({k for r in rows for k in r})
every = all(set(r) | {"val_loss"} == set(listed) for r in rows)
print(f"  metrics.jsonl: {len(rows)} lines, keys {written}; README.md lists {sorted(listed)}")
sys.exit(0 if rows and written == sorted(listed) and len(listed) == len(set(listed)) and every else 1)
PY
resumed adamw8 --max_steps 10 --optimizer adamw_8bit --gradient_checkpointing full
resumed sync --max_steps 10 --async_checkpoint false
resumed paged --max_steps 10 --optimizer paged_adamw_8bit --bf16 true
resumed epochs --num_epochs 2 --gradient_accumulation_steps 5 --micro_batch_size 32 --sample_packing true
resumed grouped --max_steps 10 --group_by_length true --gradient_accumulation_steps 2 --gradient_checkpointing selective
resumed lora --max_steps 10 --adapter lora --lora_target_linear true --lora_dropout 0.1
resumed lora_bf16 --max_steps 10 --adapter lora --lora_r 4 --bf16 true --optimizer adamw_8bit --gradient_checkpointing full
resumed dora --max_steps 10 --adapter lora --lora_target_linear true --peft_use_dora true
resumed int8 --max_steps 10 --adapter lora --load_in_8bit true --lora_target_linear true
resumed fitted --max_steps 10 --bf16 true --micro_batch_size 8 --auto_fit true --memory_budget 30MB
# reduce_lr_on_plateau: the learning rate the evaluations before the checkpoint made (halved at every evaluation that
# does not improve), and its count, are part of it
printf 'lr_scheduler: reduce_lr_on_plateau\nlr_scheduler_kwargs: {patience: 0, factor: 0.5, threshold: 0.05}\n' \
  > "$W/plateau.yaml"
resumed plateau "$W/plateau.yaml" --max_steps 12 --eval_steps 2 --learning_rate 2e-2
python3 -c "import json, sys; sys.exit(0 if len({json.loads(l)['lr'] for l in open(sys.argv[1])}) > 1 else 1)" \
  "$W/plateau.full/metrics.jsonl" && ok || bad "plateau: the learning rate never dropped" 

# save_only_model: a checkpoint holds the model files alone (no state-*.bin), their weights byte for byte those of the
# full checkpoint of the same step; the snapshot arena is planned without the optimizer state (as measured, below the
# full run's); a resume from it is refused with exit 2, naming the fix
for kind in "full:--bf16 true" "lora:--adapter lora --lora_target_linear true"; do
  name=${kind%%:*} args=${kind#*:}
  if ! "$SNUG" train $fast $args --max_steps 8 --save_steps 4 --output_dir "$W/ck_$name" > "$W/ck_$name.log" 2>&1 ||
     ! "$SNUG" train $fast $args --max_steps 8 --save_steps 4 --save_only_model true --output_dir "$W/mo_$name" \
       > "$W/mo_$name.log" 2>&1; then
    bad "save_only_model $name: $(tail -1 "$W/ck_$name.log" "$W/mo_$name.log")"
    continue
  fi
  python3 - "$W/mo_$name" "$W/ck_$name" <<'PY' && ok || bad "save_only_model $name: the checkpoint or the plan"
import json, os, sys
mo, ck = sys.argv[1], sys.argv[2]
files = sorted(os.listdir(mo + "/checkpoint-4"))
weights = "adapter_model.safetensors" if "adapter_config.json" in files else "model.safetensors"
state = json.load(open(mo + "/checkpoint-4/trainer_state.json"))
same = open(f"{mo}/checkpoint-4/{weights}", "rb").read() == open(f"{ck}/checkpoint-4/{weights}", "rb").read()
m, f = (json.load(open(d + "/memory.json")) for d in (mo, ck))
snap = (m["plan"]["checkpoint snapshot"], f["plan"]["checkpoint snapshot"])
print(f"  save_only_model {os.path.basename(mo)}: {len(files)} files, {weights} {'the same' if same else 'DIFFERENT'}, "
      f"snapshot {snap[0]} B against {snap[1]} B")
sys.exit(0 if not [x for x in files if x.startswith("state-")] and state.get("model_only") is True and same and
         m["plan"] == m["measured"] and snap[0] < snap[1] else 1)
PY
  "$SNUG" train $fast $args --max_steps 8 --save_steps 4 --save_only_model true --output_dir "$W/mo_$name" \
    --resume_from_checkpoint "$W/mo_$name/checkpoint-4" > "$W/mo_$name.resume.log" 2>&1
  [ $? -eq 2 ] && grep -q "was saved with save_only_model: true" "$W/mo_$name.resume.log" && ok ||
    bad "save_only_model $name: resume not refused: $(tail -1 "$W/mo_$name.resume.log")"
done

# SIGTERM and SIGINT: the step finishes, a checkpoint is written, exit 0; resuming completes the same run
sigs="TERM INT"
[ "$quick" = 1 ] && sigs=TERM
for sig in $sigs; do
  d=$W/sig$sig
  "$SNUG" train $common --max_steps 40 --output_dir "$d" > "$d.log" 2>&1 &
  pid=$!
  for i in $(seq 50); do [ -s "$d/metrics.jsonl" ] && [ "$(wc -l < "$d/metrics.jsonl")" -ge 3 ] && break; sleep 0.1; done
  kill -$sig $pid
  wait $pid
  rc=$?
  step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\) of 40.*/\1/p' "$d.log")
  if [ $rc -eq 0 ] && [ -n "$step" ] && [ -f "$d/checkpoint-$step/trainer_state.hash" ] && grep -q "resume_from_checkpoint latest" "$d.log"
  then ok; else bad "SIG$sig: rc=$rc, $(tail -2 "$d.log")"; continue; fi
  "$SNUG" train $common --max_steps 40 --output_dir "$d" --resume_from_checkpoint latest > "$d.resume.log" 2>&1 ||
    bad "SIG$sig resume: $(tail -2 "$d.resume.log")"
done
"$SNUG" train $common --max_steps 40 --output_dir "$W/sigfull" > "$W/sigfull.log" 2>&1
for sig in $sigs; do same sig$sig sigfull; done
# a second signal stops at once
"$SNUG" train $common --max_steps 40 --output_dir "$W/twice" > "$W/twice.log" 2>&1 &
pid=$!
for i in $(seq 50); do [ -s "$W/twice/metrics.jsonl" ] && break; sleep 0.1; done
kill -TERM $pid; kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || grep -q "stopped by a signal" "$W/twice.log" && ok || bad "two signals: rc=$rc"

# SIGKILL at random moments, resuming each time from the newest complete checkpoint: the same run in the end
python3 - "$SNUG" "$W" "$quick" $common <<'PY' && ok || bad "SIGKILL and resume did not end in the same run"
import os, random, signal, subprocess, sys, time
snug, W, quick, common = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
nkill = 8 if quick else 20
d = W + "/killed"
args = [snug, "train", *common, "--max_steps", "60", "--save_steps", "3", "--save_total_limit", "2", "--output_dir", d]
random.seed(7)
ref = W + "/killref"
subprocess.run([snug, "train", *common, "--max_steps", "60", "--output_dir", ref], check=True, stdout=subprocess.DEVNULL)

def logged():
    try:
        with open(d + "/metrics.jsonl") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0

# Each kill falls inside the part of the run still to do whatever the machine's speed or load: the run is followed
# until it has logged a step drawn from the ones it has not done yet, then killed a random part of a step later (a
# step's time measured on this run), so it may fall in a step, in its logging or in a checkpoint's writing.
kills = 0
for attempt in range(60):
    extra = ["--resume_from_checkpoint", "latest"] if any(n.startswith("checkpoint-") and not n.endswith(".partial")
                                                          for n in (os.listdir(d) if os.path.isdir(d) else [])) else []
    if not extra and os.path.isdir(d):
        extra = ["--overwrite_output_dir", "true"]
    p = subprocess.Popen(args + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kills < nkill:
        done = max([int(n.split("-")[1]) for n in (os.listdir(d) if os.path.isdir(d) else [])
                    if n.startswith("checkpoint-") and not n.endswith(".partial")] or [0])
        target, part = random.randint(done + 1, 59), random.random()
        t0, n0 = time.time(), logged()
        while p.poll() is None and logged() < target:
            time.sleep(0.002)
        n1 = logged()
        time.sleep(part * (time.time() - t0) / max(n1 - n0, 1))
        if p.poll() is None:
            p.kill()
            kills += 1
            p.wait()
            continue
    err = p.communicate()[1].decode()
    if p.returncode:
        print("  run failed:", err.strip().splitlines()[-1:])
        sys.exit(1)
    break
print(f"  {kills} kills, then a complete run")
import json
k = ("step", "epoch", "loss", "lr", "grad_norm", "val_loss")
a, b = ([[json.loads(l).get(x) for x in k] for l in open(p + "/metrics.jsonl")] for p in (d, ref))
same = a == b and open(d + "/model.safetensors", "rb").read() == open(ref + "/model.safetensors", "rb").read()
print("  curve and weights", "same" if same else "DIFFER", "; checkpoints kept:",
      sorted(n for n in os.listdir(d) if n.startswith("checkpoint-")))
sys.exit(0 if same and kills >= nkill * 3 // 4 else 1)
PY

# a damaged checkpoint is refused, naming the file
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$@" > "$W/out" 2> "$W/err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -Eq "snug: error: .*$pattern" "$W/err"; then ok; else bad "$name: rc=$rc: $(head -c 400 "$W/err")"; fi
}
ck=$W/fp32/checkpoint-4
for f in state-optim.bin model.safetensors config.json trainer_state.json; do
  cp -r "$ck" "$W/damaged"
  python3 - "$W/damaged/$f" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[len(b) // 2] ^= 0x10
open(sys.argv[1], "wb").write(b)
PY
  expect_error "flipped byte in $f" "damaged/.*(trainer_state|$f)" \
    "$SNUG" train $fast --max_steps 10 --output_dir "$W/fp32" --resume_from_checkpoint "$W/damaged"
  rm -rf "$W/damaged"
done
for f in model.safetensors state-optim.bin; do
  rm -rf "$W/damaged"; cp -r "$ck" "$W/damaged"; truncate -s 100 "$W/damaged/$f"
  expect_error "truncated $f" "damaged.*$f is 100 bytes" \
    "$SNUG" train $fast --max_steps 10 --output_dir "$W/fp32" --resume_from_checkpoint "$W/damaged"
done
# a listed file grown past its size is not read to its end (a device or a huge file in its place)
rm -rf "$W/damaged"; cp -r "$ck" "$W/damaged"; printf 'xx' >> "$W/damaged/state-optim.bin"
expect_error "longer state-optim.bin" "damaged: state-optim.bin is missing, unreadable, not a plain file or longer than" \
  "$SNUG" train $fast --max_steps 10 --output_dir "$W/fp32" --resume_from_checkpoint "$W/damaged"
# the state without the hash, or the hash without the state: incomplete
rm -rf "$W/damaged"; cp -r "$ck" "$W/damaged"; rm "$W/damaged/trainer_state.json"
expect_error "no trainer_state.json" "damaged: not a complete checkpoint: trainer_state.json is missing" \
  "$SNUG" train $fast --max_steps 10 --output_dir "$W/fp32" --resume_from_checkpoint "$W/damaged"
rm -rf "$W/damaged"; cp -r "$ck" "$W/damaged"
rm "$W/damaged/trainer_state.hash"
expect_error incomplete "damaged: not a complete checkpoint" \
  "$SNUG" train $fast --max_steps 10 --output_dir "$W/fp32" --resume_from_checkpoint "$W/damaged"
# a changed setting that changes the results is refused; a new max_steps is not
expect_error changed "trained with micro_batch_size 4, this run has 8" \
  "$SNUG" train $fast --max_steps 10 --micro_batch_size 8 --output_dir "$W/fp32" --resume_from_checkpoint "$ck"
# (so is another accumulation: a step would take other micro-batches, and the fix is named)
expect_error accumulation \
  "steps take 1 micro-batch \\(1 rank x gradient_accumulation_steps 1\\), this run's 2 \\(1 x 2\\).*set gradient_accumulation_steps to 1" \
  "$SNUG" train $fast --max_steps 10 --gradient_accumulation_steps 2 --output_dir "$W/fp32" --resume_from_checkpoint "$ck"
"$SNUG" train $fast --max_steps 12 --output_dir "$W/fp32" --resume_from_checkpoint "$ck" > "$W/more.log" 2>&1 &&
  grep -q "resumed from .* at step 4 of 12" "$W/more.log" && ok || bad "a new max_steps: $(tail -2 "$W/more.log")"
# an output_dir that holds a run
expect_error occupied "already holds a run.*resume_from_checkpoint: latest.*overwrite_output_dir: true" \
  "$SNUG" train $fast --max_steps 2 --output_dir "$W/fp32"
"$SNUG" train $fast --max_steps 2 --output_dir "$W/fp32" --overwrite_output_dir true > /dev/null 2>&1 &&
  [ -z "$(ls -d "$W/fp32"/checkpoint-* 2>/dev/null)" ] && ok || bad "overwrite_output_dir kept the old checkpoints"
# save_total_limit keeps the newest complete ones
"$SNUG" train $fast --max_steps 10 --save_steps 2 --save_total_limit 2 --output_dir "$W/limit" > /dev/null 2>&1
[ "$(cd "$W/limit" && ls -d checkpoint-* | tr '\n' ' ')" = "checkpoint-6 checkpoint-8 " ] && ok ||
  bad "save_total_limit 2 kept: $(cd "$W/limit" && ls -d checkpoint-*)"

# a save that fails part way (the disk full: here a file-size limit) leaves nothing that looks complete: no config.json
# in output_dir, no checkpoint folder under its own name
(trap '' XFSZ; ulimit -f 2048; exec "$SNUG" train $common --max_steps 4 --save_steps 2 --output_dir "$W/full_disk") \
  > "$W/full_disk.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ ! -e "$W/full_disk/config.json" ] && [ ! -e "$W/full_disk/checkpoint-2" ] &&
   grep -q "snug: error: .*full_disk" "$W/full_disk.log"
then ok; else bad "a failed save: rc=$rc, left $(ls "$W/full_disk" 2>/dev/null | tr '\n' ' '): $(tail -1 "$W/full_disk.log")"; fi
expect_error partial-latest "holds no complete checkpoint" \
  "$SNUG" train $common --max_steps 4 --output_dir "$W/full_disk" --resume_from_checkpoint latest

finish
