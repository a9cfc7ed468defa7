#!/usr/bin/env bash
# Axolotl's example configs as written: a config with every key of Axolotl's llama-3 LoRA, instruct and full
# fine-tune examples (model_type, special_tokens, the config-wide chat_template with ShareGPT field names and role
# mappings, evals_per_epoch, saves_per_epoch, the loss watchdog, gradient_checkpointing_kwargs, attn_implementation,
# the empty keys) trains with its base_model and datasets pointed at local files, and each key does what it says:
# the evaluations and checkpoints fall where Axolotl's fractions put them, the pad token changes no bit of the run
# and is saved with the tokenizer, an eos_token ends every example, ShareGPT fields and roles give the tokens of the
# same conversation written as messages, the watchdog ends a run as at its end (and its count survives a resume),
# debug prints the examples. Keys asking for what snug does not do are refused: exit 2, one error naming the key.
. "$(dirname "$0")/lib.sh"
cd "$W" || exit 1 # the test runs in its own folder (SNUG and SRC are absolute)

# a tokenizer with Llama 3's and ChatML's special tokens (the built-in one plus added tokens)
mkdir -p tok
python3 - "$SRC/assets/tokenizer/tokenizer.json" tok/tokenizer.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
n = max(max(t["model"]["vocab"].values()), max(a["id"] for a in t["added_tokens"])) + 1
for s in ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|end_of_text|>"]:
    t["added_tokens"].append({"id": n, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True})
    n += 1
json.dump(t, open(sys.argv[2], "w"), ensure_ascii=False)
PY
cp "$SRC/assets/tokenizer/tokenizer_config.json" tok/
python3 - <<'PY'
import json, random
random.seed(5)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
say = lambda k: " ".join(random.choice(words) for _ in range(k))
with open("sharegpt.jsonl", "w") as sg, open("messages.jsonl", "w") as ms, open("alpaca.jsonl", "w") as al:
    for i in range(48):
        turns = [("system", "Be brief."), ("human", say(random.randint(2, 9))), ("gpt", say(random.randint(2, 12)))]
        sg.write(json.dumps({"conversations": [{"from": f, "value": v} for f, v in turns]}) + "\n")
        role = {"system": "system", "human": "user", "gpt": "assistant"}
        ms.write(json.dumps({"messages": [{"role": role[f], "content": v} for f, v in turns]}) + "\n")
        al.write(json.dumps({"instruction": say(4), "input": "", "output": say(random.randint(2, 9))}) + "\n")
PY
# the base: a tiny Llama after one step, a Hugging Face folder with this tokenizer
cat > base.yml <<'EOF'
tokenizer: tok
datasets:
  - path: alpaca.jsonl
    type: alpaca
sequence_len: 256
max_steps: 1
sample_tokens: 0
dataset_prepared_path: prep
output_dir: base
EOF
"$SNUG" train base.yml > base.log 2>&1 || fatal "the base did not train" base.log

# Axolotl's llama-3 instruct LoRA example, keys and empty keys as written there, the paths local
cat > lora.yml <<'EOF'
base_model: base
model_type: LlamaForCausalLM
tokenizer_type: AutoTokenizer
is_llama_derived_model: true
trust_remote_code: true

load_in_8bit: false
load_in_4bit: false
strict: false

chat_template: llama3
datasets:
  - path: sharegpt.jsonl
    type: chat_template
    field_messages: conversations
    message_field_role: from
    message_field_content: value
    roles:
      user:
        - human
      assistant:
        - gpt
      system:
        - system
    roles_to_train: ["assistant"]
dataset_prepared_path: prep
val_set_size: 0.1
output_dir: ./out

sequence_len: 64
sample_packing: true
eval_sample_packing: true
pad_to_sequence_len: true

adapter: lora
lora_model_dir:
lora_r: 8
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
lora_fan_in_fan_out:

wandb_project:
wandb_entity:
wandb_watch:
wandb_name:
wandb_log_model:

gradient_accumulation_steps: 1
micro_batch_size: 2
num_epochs: 1
optimizer: adamw_bnb_8bit
lr_scheduler: cosine
learning_rate: 0.0002

train_on_inputs: false
group_by_length: false
bf16: auto
fp16:
tf32: false

gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
early_stopping_patience:
resume_from_checkpoint:
local_rank:
logging_steps: 1
xformers_attention:
flash_attention: true
s2_attention:
attn_implementation: flash_attention_2

loss_watchdog_threshold: 50.0
loss_watchdog_patience: 3

warmup_steps: 2
evals_per_epoch: 4
eval_table_size:
eval_max_new_tokens: 128
saves_per_epoch: 2
debug:
deepspeed:
weight_decay: 0.0
fsdp:
fsdp_config:
special_tokens:
  pad_token: "<|end_of_text|>"
sample_tokens: 0
EOF
"$SNUG" train lora.yml > lora.log 2>&1 || bad "Axolotl's LoRA example did not train" lora.log
# evaluations every ceil(steps / 4) steps and at the end, a checkpoint every ceil(steps / 2) before the end; the pad
# token in the saved tokenizer files
if python3 - lora.log out <<'PY'
import json, math, os, re, sys
log, out = open(sys.argv[1]).read(), sys.argv[2]
steps = int(re.search(r"schedule +(\d+) steps", log)[1])
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
evals = [r["step"] for r in rows if "val_loss" in r]
e = math.ceil(steps / 4)
want = sorted(set(list(range(e, steps + 1, e)) + [steps]))
s = math.ceil(steps / 2)
cks = sorted(int(d.split("-")[1]) for d in os.listdir(out) if d.startswith("checkpoint-"))
want_ck = [k for k in range(s, steps, s)]
tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
sm = json.load(open(os.path.join(out, "special_tokens_map.json")))
print(f"  {steps} steps: evaluated at {evals} (want {want}), checkpoints {cks} (want {want_ck}), pad_token "
      f"{tc.get('pad_token')} / {sm.get('pad_token')}, eos_token {tc.get('eos_token')}")
sys.exit(0 if evals == want and cks == want_ck and tc.get("pad_token") == sm.get("pad_token") == "<|end_of_text|>"
         and tc.get("eos_token") == "<|endoftext|>" and os.path.exists(os.path.join(out, "adapter_config.json"))
         else 1)
PY
then ok; else bad "evals_per_epoch / saves_per_epoch / special_tokens in the saved run"; fi
grep -q "data files .*sharegpt.jsonl (chat, llama3)" lora.log && ok || bad "the config-wide chat_template was not used" lora.log

# Axolotl's 8-bit LoRA (its llama-2 lora example's load_in_8bit: true) and a QLoRA written through bnb_config_kwargs
# (its FSDP QLoRA examples' block): each trains, and `snug plan` names the base it stored
sed -e 's/^load_in_8bit: false/load_in_8bit: true/' -e 's#output_dir: ./out#output_dir: ./out8#' \
  -e 's/^saves_per_epoch: 2/saves_per_epoch: 0/' lora.yml > lora8.yml
sed -e 's/^adapter: lora/adapter: qlora/' -e 's#output_dir: ./out#output_dir: ./outq#' \
  -e 's/^saves_per_epoch: 2/saves_per_epoch: 0/' lora.yml > qlora.yml
cat >> qlora.yml <<'EOF'
bnb_config_kwargs:
  llm_int8_has_fp16_weight: false
  bnb_4bit_quant_type: fp4
  bnb_4bit_use_double_quant: true
EOF
for c in "lora8:INT8 base" "qlora:FP4 base"; do
  "$SNUG" train "${c%%:*}.yml" --max_steps 2 > "${c%%:*}.log" 2>&1 && "$SNUG" plan "${c%%:*}.yml" 2>&1 |
    grep -q "${c#*:}" && ok || bad "${c%%:*}.yml did not train as a LoRA on its ${c#*:}" "${c%%:*}.log"
done

# the pad token is never attended to nor a target: the same run padding with the EOS has the same losses, bit for
# bit (the run pads: packed rows of 64 tokens hold one example each)
grep -q "padding" lora.log && sed -e '/^special_tokens:/,/pad_token/d' -e 's#output_dir: ./out#output_dir: ./out_eos#' \
  lora.yml > eos_pad.yml
"$SNUG" train eos_pad.yml > eos_pad.log 2>&1 || bad "the run padding with the EOS failed" eos_pad.log
if python3 - out/metrics.jsonl out_eos/metrics.jsonl <<'PY'
import json, sys
a, b = ([(r["loss"], r.get("val_loss")) for r in map(json.loads, open(p))] for p in sys.argv[1:3])
print(f"  losses with pad_token {a[-1]}, padding with the EOS {b[-1]} ({len(a)} steps)")
sys.exit(0 if a == b and len(a) > 2 else 1)
PY
then ok; else bad "pad_token changed the losses"; fi

# ShareGPT's fields and roles (given, or Axolotl's default roles) give the tokens of the same conversations written
# as messages with role and content, in both templates
cat > msgs.yml <<'EOF'
tokenizer: tok
chat_template: llama3
datasets:
  - path: messages.jsonl
    type: chat
sequence_len: 64
dataset_prepared_path: prep
EOF
cat > sg_default.yml <<'EOF'
tokenizer: tok
datasets:
  - path: sharegpt.jsonl
    type: chat_template
    chat_template: llama3
    field_messages: conversations
    message_property_mappings:
      role: from
      content: value
sequence_len: 64
dataset_prepared_path: prep
EOF
"$SNUG" preprocess msgs.yml --dump msgs.dump > msgs.log 2>&1 || bad "preprocess of messages" msgs.log
"$SNUG" preprocess sg_default.yml --dump sg.dump > sg.log 2>&1 || bad "preprocess of ShareGPT fields" sg.log
"$SNUG" preprocess lora.yml --dump sg_roles.dump > sg_roles.log 2>&1 || bad "preprocess of lora.yml" sg_roles.log
cmp -s msgs.dump sg.dump && cmp -s msgs.dump sg_roles.dump && [ -s msgs.dump ] && ok ||
  bad "ShareGPT fields and roles did not give the tokens of the same messages"
sed 's/chat_template: llama3/chat_template: chatml/' msgs.yml > msgs_ml.yml
sed 's/    chat_template: llama3/    chat_template: chatml/' sg_default.yml > sg_ml.yml
"$SNUG" preprocess msgs_ml.yml --dump a.dump > /dev/null 2>&1
"$SNUG" preprocess sg_ml.yml --dump b.dump > /dev/null 2>&1
cmp -s a.dump b.dump && [ -s a.dump ] && ! cmp -s a.dump msgs.dump && ok || bad "chatml: ShareGPT fields differ"
# a role value no mapping names: one error naming the line, the value and the values read
sed -e 's/- gpt/- bot/' lora.yml > badrole.yml
"$SNUG" preprocess badrole.yml > badrole.log 2>&1
[ $? -eq 2 ] && grep -q 'sharegpt.jsonl line 1: conversations\[2\].from is "gpt"; use one of "system" (system), "human" (user), "bot" (assistant)' badrole.log &&
  ok || bad "an unmapped role value" badrole.log

# eos_token: every alpaca example ends with it, and it is saved with the tokenizer
cat > eos.yml <<'EOF'
tokenizer: tok
datasets:
  - path: alpaca.jsonl
    type: alpaca
special_tokens:
  eos_token: <|im_end|>
sequence_len: 256
max_steps: 1
sample_tokens: 0
dataset_prepared_path: prep
output_dir: out_eos_token
EOF
"$SNUG" preprocess eos.yml --dump eos.dump > eos.log 2>&1 || bad "preprocess with eos_token" eos.log
"$SNUG" train eos.yml > eos_train.log 2>&1 || bad "train with eos_token" eos_train.log
if python3 - eos.dump tok/tokenizer.json out_eos_token/tokenizer_config.json <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
im_end = next(a["id"] for a in json.load(open(sys.argv[2]))["added_tokens"] if a["content"] == "<|im_end|>")
tc = json.load(open(sys.argv[3]))
ends = {r["input_ids"][-1] for r in rows}
print(f"  {len(rows)} examples end with {ends} (<|im_end|> is {im_end}); saved eos_token {tc.get('eos_token')}")
sys.exit(0 if ends == {im_end} and all(r["labels"][-1] == im_end for r in rows) and tc.get("eos_token") == "<|im_end|>"
         else 1)
PY
then ok; else bad "eos_token"; fi

# the loss watchdog ends the run as at its end: the model saved, the step said, exit 0
sed -e 's/loss_watchdog_threshold: 50.0/loss_watchdog_threshold: 0.001/' -e 's/loss_watchdog_patience: 3/loss_watchdog_patience: 2/' \
  -e 's#output_dir: ./out#output_dir: ./out_watch#' -e 's/^debug:$/debug: true/' lora.yml > watch.yml
"$SNUG" train watch.yml > watch.log 2>&1 || bad "the watched run failed" watch.log
grep -q "step 2: the loss has been above loss_watchdog_threshold 0.001 for 2 steps in a row: training ends here" \
  watch.log && [ "$(tail -1 out_watch/metrics.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')" = 2 ] &&
  [ -f out_watch/adapter_model.safetensors ] && grep -q "val_loss" out_watch/metrics.jsonl && ok ||
  bad "the loss watchdog did not end the run at step 2 with the model saved" watch.log
grep -Eq '^ +0 +[0-9]+ +no +"<\|begin_of_text\|>"' watch.log && grep -q "^example 3 of" watch.log && ok ||
  bad "debug: true did not print the examples" watch.log
# its count is state: resumed from the checkpoint of step 1 (one step over the threshold), the run ends at step 3
# again (a count started afresh would end it at step 4)
sed -e 's/^saves_per_epoch: 2$/save_steps: 1/' -e 's/loss_watchdog_patience: 2/loss_watchdog_patience: 3/' \
  -e 's#output_dir: ./out_watch#output_dir: ./out_resume#' -e 's/^debug: true$/debug:/' watch.yml > resume.yml
"$SNUG" train resume.yml > resume1.log 2>&1 || bad "the first watched run" resume1.log
"$SNUG" train resume.yml --resume_from_checkpoint out_resume/checkpoint-1 > resume2.log 2>&1 ||
  bad "the resumed watched run" resume2.log
grep -q "step 3: the loss has been above loss_watchdog_threshold 0.001 for 3 steps in a row" resume1.log &&
  grep -q "resumed from out_resume/checkpoint-1 at step 1" resume2.log &&
  grep -q "step 3: the loss has been above loss_watchdog_threshold 0.001 for 3 steps in a row" resume2.log && ok ||
  bad "the watchdog's count did not survive the resume" resume2.log

# early stopping as Hugging Face's EarlyStoppingCallback with Axolotl's load_best_model_at_end: a full fine-tune with a
# learning rate of 1 wrecks the model from its second step (the first, in warmup, changes nothing), so the validation
# loss rises; the run ends at the evaluation the callback's rules say, the model saved is the checkpoint with the
# lowest validation loss (kept from save_total_limit), and a resume from it ends alike
cat > es.yml <<'EOF'
base_model: base
datasets:
  - path: alpaca.jsonl
    type: alpaca
val_set_size: 0.1
sequence_len: 256
micro_batch_size: 2
eval_steps: 1
save_steps: 1
save_total_limit: 1
early_stopping_patience: 2
learning_rate: 1.0
lr_scheduler: constant_with_warmup
warmup_steps: 1
max_grad_norm: 0
sample_tokens: 0
dataset_prepared_path: prep
output_dir: out_es
EOF
"$SNUG" train es.yml > es.log 2>&1 || bad "the early-stopped run failed" es.log
if python3 - out_es es.log <<'PY'
import filecmp, json, os, sys
out, log = sys.argv[1], open(sys.argv[2]).read()
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
vals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
best, count, stop = None, 0, None  # the callback's rules: a lower loss resets the count, any other adds one
for step, v in vals:
    count = 0 if best is None or v < best else count + 1
    best = v if best is None or v < best else best
    if count >= 2:
        stop = step
        break
best_step = min(vals, key=lambda sv: sv[1])[0]
cks = sorted(int(d.split("-")[1]) for d in os.listdir(out) if d.startswith("checkpoint-"))
print(f"  validation losses {[round(v, 4) for _, v in vals]}: stopped at {rows[-1]['step']} (want {stop}), best at "
      f"{best_step}, checkpoints kept {cks} (want {sorted({best_step, stop - 1}) if stop else '?'})")
if stop is None or rows[-1]["step"] != stop or f"step {stop}: no validation loss lower than" not in log:
    sys.exit(1)
same = filecmp.cmp(os.path.join(out, "model.safetensors"),
                   os.path.join(out, f"checkpoint-{best_step}", "model.safetensors"), shallow=False)
sys.exit(0 if best_step < stop and same and cks == sorted({best_step, stop - 1}) and
         f"the model saved is checkpoint-{best_step}'s" in log else 1)
PY
then ok; else bad "early stopping / load_best_model_at_end" es.log; fi
best=$(grep -o "the model saved is checkpoint-[0-9]*" es.log | grep -o "[0-9]*$")
stop=$(grep -o "^step [0-9]*: no validation loss" es.log | grep -o "[0-9]*")
"$SNUG" train es.yml --resume_from_checkpoint "out_es/checkpoint-$best" > es2.log 2>&1 ||
  bad "the resumed early-stopped run failed" es2.log
grep -q "^step $stop: no validation loss lower than" es2.log && grep -q "the model saved is checkpoint-$best's" es2.log &&
  ok || bad "early stopping's state did not survive the resume (want the stop at $stop, checkpoint-$best)" es2.log
"$SNUG" train es.yml --output_dir out_es_last --load_best_model_at_end false > es3.log 2>&1
! cmp -s out_es/model.safetensors out_es_last/model.safetensors && grep -q "^step $stop: no validation loss" es3.log &&
  ! grep -q "load_best_model_at_end:" es3.log && ok || bad "load_best_model_at_end: false saved the best" es3.log

# the same from a base whose config.json says bfloat16: the model saved is the best checkpoint's fp32 weights in
# bf16, each rounded to nearest even, as the final save writes them (not the checkpoint's fp32 file copied)
rm -rf base16 && cp -r base base16
python3 - base16/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["torch_dtype"] = "bfloat16"; c.pop("dtype", None)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
"$SNUG" train es.yml --base_model base16 --output_dir out_es16 > es16.log 2>&1 || bad "the bf16 early-stopped run failed" es16.log
best16=$(grep -o "the model saved is checkpoint-[0-9]*" es16.log | grep -o "[0-9]*$")
if [ -n "$best16" ] && python3 - out_es16/model.safetensors "out_es16/checkpoint-$best16/model.safetensors" <<'PY'
import json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return h, b[8 + n:]
(hs, ds), (hc, dc) = read(sys.argv[1]), read(sys.argv[2])
bad = [k for k in hc if k not in hs or hs[k]["dtype"] != "BF16" or hc[k]["dtype"] != "F32" or hs[k]["shape"] != hc[k]["shape"]]
for k in hc:
    if k in bad:
        continue
    a, z = hc[k]["data_offsets"]; f = struct.unpack(f"<{(z - a) // 4}I", dc[a:z])
    a, z = hs[k]["data_offsets"]; g = struct.unpack(f"<{(z - a) // 2}H", ds[a:z])
    if any(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) != v for u, v in zip(f, g)):
        bad.append(k)
print(f"  {len(hc)} tensors of checkpoint-{sys.argv[2].split('checkpoint-')[1].split('/')[0]} saved as bf16; differing: {bad[:4]}")
sys.exit(1 if bad or len(hs) != len(hc) else 0)
PY
then ok; else bad "load_best_model_at_end with a bf16 base: the model saved is not the best checkpoint in bf16" es16.log; fi

# Hugging Face's TrainingArguments keys: save_strategy epoch, eval_strategy steps (every logging_steps when eval_steps
# is unset), save_first_step, cosine_min_lr_ratio (every logged lr against Axolotl's formula), disable_tqdm; then
# auto_resume_from_checkpoints picks up the newest checkpoint, and eval_strategy no evaluates nothing
cat > hf.yml <<'EOF'
base_model: base
datasets:
  - path: alpaca.jsonl
    type: alpaca
val_set_size: 0.1
sequence_len: 256
micro_batch_size: 4
num_epochs: 2
logging_steps: 3
save_strategy: epoch
eval_strategy: steps
save_first_step: true
learning_rate: 1e-3
lr_scheduler_type: cosine
cosine_min_lr_ratio: 0.1
warmup_steps: 2
disable_tqdm: true
report_to: none
dataloader_num_workers: 4
remove_unused_columns: false
sample_tokens: 0
dataset_prepared_path: prep
output_dir: out_hf
EOF
"$SNUG" train hf.yml > hf.log 2>&1 || bad "the TrainingArguments run failed" hf.log
if python3 - out_hf hf.log <<'PY'
import json, math, os, re, sys
out, log = sys.argv[1], open(sys.argv[2]).read()
m = re.search(r"schedule +(\d+) steps \((\d+) micro-batches per epoch\)", log)
total = int(m[1])
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
evals = [r["step"] for r in rows if "val_loss" in r]
want_evals = sorted(set(list(range(3, total + 1, 3)) + [total]))
cks = sorted(int(d.split("-")[1]) for d in os.listdir(out) if d.startswith("checkpoint-"))
want_cks = [1, total // 2]  # the first step, the end of the first epoch (the second's is the end of the run)
def lr(step):  # Axolotl's cosine with a floor, after a linear warmup of 2 steps
    if step < 2:
        return 1e-3 * step / 2
    p = (step - 2) / (total - 2)
    return 1e-3 * ((1 - 0.1) * 0.5 * (1 + math.cos(math.pi * p)) + 0.1)
lr_ok = all(abs(r["lr"] - lr(r["step"] - 1)) <= 1e-6 * 1e-3 + 1e-12 for r in rows)
print(f"  {total} steps: evaluated at {evals} (want {want_evals}), checkpoints {cks} (want {want_cks}), "
      f"last lr {rows[-1]['lr']:.4e} (want {lr(total - 1):.4e})")
sys.exit(0 if evals == want_evals and cks == want_cks and lr_ok and total % 2 == 0 else 1)
PY
then ok; else bad "save_strategy / eval_strategy / save_first_step / cosine_min_lr_ratio"; fi
"$SNUG" train hf.yml --auto_resume_from_checkpoints true --overwrite_output_dir true > hf2.log 2>&1 ||
  bad "auto_resume_from_checkpoints" hf2.log
grep -q "resumed from out_hf/checkpoint-[0-9]* at step" hf2.log && ok || bad "auto_resume did not resume" hf2.log
"$SNUG" train hf.yml --auto_resume_from_checkpoints true --output_dir out_hf_new --eval_strategy no \
  --save_strategy no --save_first_step false > hf3.log 2>&1 || bad "auto_resume with nothing to resume" hf3.log
! grep -q "resumed from" hf3.log && ! grep -q val_loss out_hf_new/metrics.jsonl &&
  [ -z "$(ls out_hf_new | grep checkpoint-)" ] && ok || bad "eval_strategy no / save_strategy no" hf3.log

# NEFTune: noise on the training step's embeddings only. The first step of a warmup changes no weight, so its
# validation loss is the base model's with the noise or without; its training loss is not; the noise is the same bits
# from run to run
neft="--max_steps 1 --warmup_steps 100 --eval_steps 0 --save_steps 0 --early_stopping_patience 0"
for run in 0:0 5:1 5:2; do
  a=${run%:*} k=${run#*:}
  "$SNUG" train es.yml $neft --neftune_noise_alpha $a --output_dir "out_neft$k" > "neft$k.log" 2>&1 ||
    bad "the run with neftune_noise_alpha $a failed" "neft$k.log"
done
if python3 - out_neft0/metrics.jsonl out_neft1/metrics.jsonl out_neft2/metrics.jsonl <<'PY'
import json, sys
a, b, c = (json.loads(open(p).readline()) for p in sys.argv[1:4])
print(f"  step 1: loss {a['loss']} without noise, {b['loss']} with (again {c['loss']}); validation loss "
      f"{a['val_loss']} / {b['val_loss']}")
sys.exit(0 if a["val_loss"] == b["val_loss"] == c["val_loss"] and a["loss"] != b["loss"] and b["loss"] == c["loss"]
         else 1)
PY
then ok; else bad "neftune_noise_alpha"; fi

# test_datasets: the validation set from its own files (all of datasets trains), tokenized alike; refused beside
# val_set_size
head -10 alpaca.jsonl > alpaca_test.jsonl
sed -e 's/^val_set_size: 0.1$/test_datasets:\n  - path: alpaca_test.jsonl\n    type: alpaca/' -e 's#output_dir: out_es#output_dir: out_td#' \
  es.yml > td.yml
"$SNUG" train td.yml --max_steps 2 --early_stopping_patience 0 --save_steps 0 > td.log 2>&1 || bad "test_datasets" td.log
grep -q "data  *48 examples, [0-9]* tokens (validation: 10 examples)" td.log &&
  grep -q "validation files *alpaca_test.jsonl (alpaca): 10 examples" td.log &&
  [ "$(grep -c val_loss out_td/metrics.jsonl)" = 2 ] && ok || bad "test_datasets did not give the validation set" td.log
printf '{"text": "held out number %d"}\n' $(seq 7) > text_test.jsonl # --test_datasets FILE: a completion file
"$SNUG" preprocess es.yml --val_set_size 0 --test_datasets text_test.jsonl > td2.log 2>&1 &&
  grep -q "validation 7 examples" td2.log && ok || bad "--test_datasets on the command line" td2.log
"$SNUG" train td.yml --val_set_size 0.1 --output_dir out_refused > refused.log 2>&1
[ $? -eq 2 ] && grep -q "test_datasets and val_set_size 0.1 both give a validation set; keep one" refused.log && ok ||
  bad "test_datasets beside val_set_size" refused.log

# attn_implementation: eager is flash_attention: false, activation_offloading is offload checkpointing
grep -v "^attn_implementation:" lora.yml > noattn.yml
"$SNUG" plan noattn.yml --attn_implementation eager --json > eager.json 2>eager.err &&
  "$SNUG" plan noattn.yml --flash_attention false --json > noflash.json 2>>eager.err &&
  "$SNUG" plan noattn.yml --activation_offloading true > offload.txt 2>>eager.err || bad "plan with the attention keys" eager.err
cmp -s eager.json noflash.json && ! "$SNUG" plan noattn.yml --json | cmp -s - eager.json && ok ||
  bad "attn_implementation: eager is not the plan of flash_attention: false"
grep -q "levers .*gradient_checkpointing offload" offload.txt && ok ||
  bad "activation_offloading is not offload checkpointing" offload.txt

# refusals: exit 2, one error naming the key and the fix, nothing written
refused() { # NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  rm -rf out_refused
  "$SNUG" train lora.yml --output_dir out_refused "$@" > refused.log 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -c 'snug: error:' refused.log)" -eq 1 ] && grep -Eq -- "$pattern" refused.log &&
     [ ! -e out_refused ]; then ok; else bad "$name (rc $rc)" refused.log; fi
}
refused early_nosplit "early_stopping_patience compares validation losses, and the run has no validation set" \
  --early_stopping_patience 2 --val_set_size 0
refused best_nosave "load_best_model_at_end keeps the checkpoint with the lowest validation loss, and the run saves none" \
  --load_best_model_at_end true --saves_per_epoch 0
refused save_both "save_strategy epoch and save_steps both say when to save" --save_strategy epoch --save_steps 3 \
  --saves_per_epoch 0
refused hub "hub_model_id is not supported yet" --hub_model_id me/model
refused model_type "model_type is MistralForCausalLM, but the model is a LlamaForCausalLM" --model_type MistralForCausalLM
refused derived "is_mistral_derived_model is true, but the model's model_type is llama" --is_mistral_derived_model true
refused fan_in_fan_out "lora_fan_in_fan_out is true, but this model's layers are nn.Linear" --lora_fan_in_fan_out true
sed -e 's/  pad_token: "<|end_of_text|>"/  pad_token: "<pad>"/' lora.yml > newtok.yml
# a new token grows the embedding and lm_head (tests/parity/test_added_tokens_parity.py): under an adapter without
# lora_modules_to_save (here a tied head) the grown tables are saved beside it as PEFT saves them; a new eos_token is
# refused as Axolotl refuses it
"$SNUG" train newtok.yml --output_dir out_newtok --max_steps 1 > newtok.log 2>&1 &&
  head -c 4096 out_newtok/adapter_model.safetensors | grep -aq '"base_model.model.lm_head.weight"' &&
  head -c 4096 out_newtok/adapter_model.safetensors | grep -aq '"base_model.model.model.embed_tokens.weight"' && ok ||
  bad "a new pad_token under LoRA with a tied head: the grown tables beside the adapter" newtok.log
sed -e 's/  pad_token: "<|end_of_text|>"/  eos_token: "<|eot|>"/' lora.yml > neweos.yml
"$SNUG" train neweos.yml --output_dir out_refused > refused.log 2>&1
[ $? -eq 2 ] && grep -q "special_tokens.eos_token '<|eot|>' is a new token, trained with an adapter: set lora_modules_to_save: \[embed_tokens, lm_head\]" refused.log &&
  [ ! -e out_refused ] && ok || bad "a new eos_token under LoRA" refused.log
sed -e 's/  pad_token: "<|end_of_text|>"/  unk_token: "<|im_start|>"/' lora.yml > unk.yml
"$SNUG" train unk.yml --output_dir out_refused > refused.log 2>&1
[ $? -eq 2 ] && grep -q "special_tokens.unk_token '<|im_start|>' is not the tokenizer's own" refused.log && ok ||
  bad "another unk_token" refused.log
mkdir -p base_notok && cp base/config.json base/model.safetensors base_notok/ # a model folder without a tokenizer
sed -e 's/^base_model: base$/base_model: base_notok/' lora.yml > notok.yml
"$SNUG" train notok.yml --output_dir out_refused > refused.log 2>&1
[ $? -eq 2 ] && grep -q "special_tokens.pad_token needs a tokenizer (tokenizer.json), and this run has none" \
  refused.log && [ ! -e out_refused ] && ok || bad "special_tokens without a tokenizer" refused.log
# a base_model path that does not exist is said to be one (not that special_tokens needs the tokenizer it would hold)
sed -e 's/^base_model: base$/base_model: no_such_base/' lora.yml > nobase.yml
for cmd in train plan; do
  "$SNUG" $cmd nobase.yml --output_dir out_refused > refused.log 2>&1
  [ $? -eq 2 ] && grep -q "base_model no_such_base: no such folder" refused.log && [ ! -e out_refused ] && ok ||
    bad "$cmd with a wrong base_model path" refused.log
done
# --dataset FILE --dataset_type TYPE on the command line: the tokens of the same file named so in a YAML; a type
# with no --dataset is refused
"$SNUG" preprocess --tokenizer tok --dataset alpaca.jsonl --dataset_type alpaca --dataset_prepared_path prep \
  --sequence_len 256 --dump cli_type.dump > cli_type.log 2>&1
sed -e '/^special_tokens:/,/eos_token/d' eos.yml > alpaca_yaml.yml
"$SNUG" preprocess alpaca_yaml.yml --dump yaml_type.dump > yaml_type.log 2>&1
cmp -s cli_type.dump yaml_type.dump && [ -s cli_type.dump ] && grep -q "alpaca.jsonl (alpaca)" cli_type.log && ok ||
  bad "--dataset_type alpaca did not read the file as alpaca" cli_type.log
"$SNUG" preprocess alpaca_yaml.yml --dataset_type alpaca > refused.log 2>&1
[ $? -eq 2 ] && grep -q "dataset_type alpaca sets the type of the files given with --dataset" refused.log && ok ||
  bad "--dataset_type without --dataset" refused.log
# relative paths as Axolotl reads them: from the current directory (a YAML in another folder), else from the
# YAML's folder
mkdir -p cfgdir && sed -e 's#output_dir: out_eos_token#output_dir: out_cwd#' alpaca_yaml.yml > cfgdir/cwd.yml
cp alpaca.jsonl cfgdir/only_here.jsonl && sed -e 's#path: alpaca.jsonl#path: only_here.jsonl#' alpaca_yaml.yml \
  > cfgdir/near.yml
"$SNUG" preprocess cfgdir/cwd.yml --dump cwd.dump > cwd.log 2>&1 && "$SNUG" preprocess cfgdir/near.yml \
  --dump near.dump > near.log 2>&1 && cmp -s cwd.dump yaml_type.dump && cmp -s near.dump yaml_type.dump &&
  grep -q "data files  *alpaca.jsonl (alpaca)" cwd.log && grep -q "cfgdir/only_here.jsonl (alpaca)" near.log && ok ||
  bad "relative dataset paths: the current directory's, else the YAML's folder's" cwd.log
sed -e 's/^eval_table_size:$/eval_table_size: 5/' lora.yml > table.yml
"$SNUG" train table.yml --output_dir out_refused > refused.log 2>&1
[ $? -eq 2 ] && grep -q "table.yml line [0-9]*: eval_table_size is not supported yet" refused.log && ok ||
  bad "eval_table_size" refused.log
sed -e 's/^evals_per_epoch: 4$/evals_per_epoch: 4\neval_steps: 3/' lora.yml > both.yml
"$SNUG" train both.yml --output_dir out_refused > refused.log 2>&1
[ $? -eq 2 ] && grep -q "evals_per_epoch 4 and eval_steps 3 both say when to evaluate" refused.log && ok ||
  bad "evals_per_epoch beside eval_steps" refused.log

finish
