"""Tokens added as Axolotl adds them, against transformers: special_tokens the tokenizer lacks (eos_token, pad_token:
add_special_tokens), `tokens` (add_tokens, one of them a word of the vocabulary) and special_tokens'
additional_special_tokens (add_special_tokens after them, one already a token) give the ids transformers' tokenizer
gives after the same calls, in snug's tokenized data and in the tokenizer snug saves; the embedding and lm_head grow
to len(tokenizer) as Axolotl's resize_token_embeddings(len(tokenizer)) grows them, the old rows unchanged and the new
ones the mean of the old (mean_resizing_embeddings: true, transformers' mean_resizing up to its 1e-9-covariance noise)
or drawn normal(0, initializer_range) (Axolotl's default); the saved config.json, tokenizer.json and
tokenizer_config.json load in transformers with the grown vocabulary; and after a short run, snug's loss and logits on
the saved model equal transformers' on it. Under LoRA with lora_modules_to_save, the adapter holds the grown tables,
PEFT loads it on the base resized to its tokenizer, and `snug merge` gives PEFT's merge_and_unload; without it (a new
pad_token, tied head or not) the adapter holds the grown tables frozen as PEFT's save_embedding_layers saves them, and
PEFT's logits and merge are snug's."""
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from tokenizers import AddedToken

sys.path.insert(0, os.path.dirname(__file__))
from common import aligned_labels, check, finish, relerr, run_snug, snug_parity  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NEW_EOS, NEW_PAD, TOKENS, EXTRA = "<|eot|>", "<|end_of_text|>", ["<tool>", "the"], ["<|im_start|>", "<tool>"]
TEXTS = ["hello<|end_of_text|> the<tool>x <tool> 12", "the theme of the day<|eot|>", "", "plain words, no tokens",
         "<|endoftext|>the<|eot|><|eot|> <tool>the<|im_start|>user"]

work = tempfile.mkdtemp()
torch.manual_seed(0)
base = os.path.join(work, "base")
cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                               tie_word_embeddings=False)
transformers.LlamaForCausalLM(cfg).save_pretrained(base)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(ROOT, "assets/tokenizer", f), base)
with open(os.path.join(work, "data.jsonl"), "w") as f:
    for t in TEXTS * 4:
        f.write(json.dumps({"text": t or "x"}) + "\n")


def config(name: str, extra: str) -> str:
    path = os.path.join(work, name + ".yml")
    with open(path, "w") as f:
        f.write(f"base_model: {base}\ndatasets:\n  - path: {work}/data.jsonl\n    type: completion\n"
                f"special_tokens:\n  eos_token: \"{NEW_EOS}\"\n  pad_token: \"{NEW_PAD}\"\n"
                f"  additional_special_tokens: {json.dumps(EXTRA)}\n"
                f"tokens: {json.dumps(TOKENS)}\nsequence_len: 64\nmicro_batch_size: 2\nsample_tokens: 0\n"
                f"dataset_prepared_path: {work}/prep\noutput_dir: {work}/{name}\n" + extra)
    return path


# the reference: Axolotl's calls on transformers' tokenizer (special_tokens in its order, then tokens)
ref = transformers.AutoTokenizer.from_pretrained(base)
for k, v in (("eos_token", NEW_EOS), ("pad_token", NEW_PAD)):
    ref.add_special_tokens({k: AddedToken(v, rstrip=False, lstrip=False, normalized=False)})
ref.add_tokens([AddedToken(t, rstrip=False, lstrip=False, normalized=False) for t in TOKENS])
ref.add_special_tokens({"additional_special_tokens": EXTRA})

# warmup's first step changes no weight: the saved model is the grown base
mean_yml = config("mean", "mean_resizing_embeddings: true\nmax_steps: 1\nwarmup_steps: 10\n")
r = run_snug("train", mean_yml)
check(r.returncode == 0, f"snug train with added tokens: {r.stderr[-600:]}")
out = os.path.join(work, "mean")
saved = transformers.AutoTokenizer.from_pretrained(out)
check(len(saved) == len(ref) == 2052 and list(saved.extra_special_tokens) == EXTRA and saved.pad_token == NEW_PAD and
      saved.eos_token == NEW_EOS and saved.pad_token_id == ref.pad_token_id and saved.eos_token_id == ref.eos_token_id,
      f"the saved tokenizer: {len(saved)} tokens (want {len(ref)}), pad {saved.pad_token_id}, eos {saved.eos_token_id}, "
      f"extra_special_tokens {saved.extra_special_tokens}")
same = all(saved(t)["input_ids"] == ref(t)["input_ids"] for t in TEXTS)
check(same, "the saved tokenizer's ids differ from transformers' after add_special_tokens / add_tokens")
r = run_snug("preprocess", mean_yml, "--dump", os.path.join(work, "dump.jsonl"))
rows = [json.loads(line)["input_ids"] for line in open(os.path.join(work, "dump.jsonl"))]
want = [ref(t or "x", add_special_tokens=False)["input_ids"] + [ref.eos_token_id] for t in TEXTS * 4]
check(r.returncode == 0 and rows == want, f"snug's tokens differ from transformers': {rows[:2]} vs {want[:2]}")
print(f"  ids of {len(TEXTS)} texts as transformers' after the same calls; pad {ref.pad_token_id}, eos "
      f"{ref.eos_token_id}, tokens {ref.convert_tokens_to_ids(TOKENS)}")

old = transformers.LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
grown = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
hf = transformers.LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
hf.resize_token_embeddings(len(ref))  # mean_resizing: the mean plus a draw of 1e-9 times the covariance
check(grown.config.vocab_size == len(ref), f"config.json vocab_size {grown.config.vocab_size}, want {len(ref)}")
for name, get in (("embed_tokens", lambda m: m.get_input_embeddings().weight),
                  ("lm_head", lambda m: m.get_output_embeddings().weight)):
    w0, w, wh = get(old).detach(), get(grown).detach(), get(hf).detach()
    mean_err = (w[2048:] - w0.mean(0)).abs().max().item()
    noise = (wh[2048:] - w0.mean(0)).abs().max().item()
    check(torch.equal(w[:2048], w0) and w.shape[0] == len(ref) and mean_err < 1e-7,
          f"{name}: old rows kept, new rows the mean (off by {mean_err:.1e})")
    print(f"  {name}: {w.shape[0]} rows, the new ones the mean of the old to {mean_err:.1e} (transformers' noise "
          f"around it: {noise:.1e})")

# Axolotl's default: the new rows normal(0, initializer_range)
r = run_snug("train", config("normal", "max_steps: 1\nwarmup_steps: 10\n"))
m = transformers.LlamaForCausalLM.from_pretrained(os.path.join(work, "normal"), dtype=torch.float32)
for w in (m.get_input_embeddings().weight.detach(), m.get_output_embeddings().weight.detach()):
    new = w[2048:]
    check(r.returncode == 0 and torch.equal(w[:2048], old.get_input_embeddings().weight.detach()
                                            if w.data_ptr() == m.get_input_embeddings().weight.data_ptr()
                                            else old.get_output_embeddings().weight.detach()) and
          abs(new.std().item() / cfg.initializer_range - 1) < 0.15 and abs(new.mean().item()) < 0.01,
          f"normal init: std {new.std().item():.4f} (want {cfg.initializer_range}), mean {new.mean().item():.4f}")

# a short run, then the saved model: snug's loss and logits equal transformers'
r = run_snug("train", config("run", "max_steps: 3\nlearning_rate: 0.001\n"))
check(r.returncode == 0, f"the short run: {r.stderr[-600:]}")
d = os.path.join(work, "run")
model = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32)
ids = torch.tensor([saved("hello<|end_of_text|> the<tool>x <tool> 12<|eot|>")["input_ids"]])
res = model(input_ids=ids, labels=ids)
got = snug_parity(d, ids, aligned_labels(ids))
e_logits = relerr(got["logits"], res.logits.detach())
check(e_logits < 1e-4 and abs(got["loss"].item() - res.loss.item()) < 1e-4 * abs(res.loss.item()),
      f"the trained model: logits relerr {e_logits:.1e}, loss {got['loss'].item()} vs {res.loss.item()}")
print(f"  after 3 steps: transformers loads {d} ({model.config.vocab_size} tokens); logits relerr {e_logits:.1e}")
# LoRA with the grown tables in lora_modules_to_save: the adapter holds them whole, PEFT loads it on the base
# resized to the saved tokenizer, and `snug merge` gives PEFT's merge_and_unload
r = run_snug("train", config("lora", "adapter: lora\nlora_r: 4\nlora_alpha: 8\nlora_target_linear: true\n"
                                     "lora_modules_to_save: [embed_tokens, lm_head]\nmax_steps: 2\nlearning_rate: 0.01\n"))
check(r.returncode == 0, f"the LoRA run with added tokens: {r.stderr[-600:]}")
adapter, merged = os.path.join(work, "lora"), os.path.join(work, "merged")
r = run_snug("merge", base, adapter, merged)
check(r.returncode == 0, f"snug merge of the grown adapter: {r.stderr[-600:]}")
import peft  # noqa: E402

ref_base = transformers.LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
ref_base.resize_token_embeddings(len(transformers.AutoTokenizer.from_pretrained(adapter)))
want = peft.PeftModel.from_pretrained(ref_base, adapter).merge_and_unload().state_dict()
got = transformers.LlamaForCausalLM.from_pretrained(merged, dtype=torch.float32).state_dict()
worst = max(relerr(got[k], v) for k, v in want.items())
check(got.keys() == want.keys() and worst < 1e-5, f"snug merge against PEFT's merge_and_unload: {worst:.1e}")
print(f"  LoRA with embed_tokens and lm_head saved: snug merge equals PEFT's merge_and_unload to {worst:.1e}")

# LoRA adding only pad_token (which Axolotl lets an adapter add without lora_modules_to_save): the adapter holds the
# grown embedding and lm_head as PEFT's save_embedding_layers="auto" saves them (both names, tied or not), PEFT loads it
# on the base resized to the saved tokenizer and gives snug's logits, and `snug merge` gives PEFT's merge_and_unload
from safetensors import safe_open  # noqa: E402

for tied in (False, True):
    tag = "tied" if tied else "untied"
    bdir = base
    if tied:
        bdir = os.path.join(work, "base_tied")
        cfg_t = transformers.LlamaConfig(**{**cfg.to_dict(), "tie_word_embeddings": True})
        transformers.LlamaForCausalLM(cfg_t).save_pretrained(bdir)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(ROOT, "assets/tokenizer", f), bdir)
    yml = os.path.join(work, f"pad_{tag}.yml")
    with open(yml, "w") as f:
        f.write(f"base_model: {bdir}\ndatasets:\n  - path: {work}/data.jsonl\n    type: completion\n"
                f"special_tokens:\n  pad_token: \"{NEW_PAD}\"\nsequence_len: 64\nmicro_batch_size: 2\n"
                f"sample_tokens: 0\ndataset_prepared_path: {work}/prep_{tag}\noutput_dir: {work}/pad_{tag}\n"
                "adapter: lora\nlora_r: 4\nlora_alpha: 8\nlora_target_linear: true\nmax_steps: 2\n"
                "learning_rate: 0.01\n")
    r = run_snug("train", yml)
    check(r.returncode == 0, f"the LoRA run adding pad_token ({tag}): {r.stderr[-600:]}")
    adapter = os.path.join(work, f"pad_{tag}")
    vocab = len(transformers.AutoTokenizer.from_pretrained(adapter))
    with safe_open(os.path.join(adapter, "adapter_model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if "lora_" not in k}
    want_shapes = {"base_model.model.model.embed_tokens.weight": (vocab, 64),
                   "base_model.model.lm_head.weight": (vocab, 64)}
    check(shapes == want_shapes, f"{tag}: the adapter's whole tables {shapes}, want {want_shapes}")
    ref_base = transformers.LlamaForCausalLM.from_pretrained(bdir, dtype=torch.float32)
    ref_base.resize_token_embeddings(vocab)
    pm = peft.PeftModel.from_pretrained(ref_base, adapter)
    ids = torch.tensor([transformers.AutoTokenizer.from_pretrained(adapter)(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        logits = pm(input_ids=ids).logits
    got = snug_parity(bdir, ids, aligned_labels(ids), "--adapter", adapter)
    e_logits = relerr(got["logits"], logits)
    check(e_logits < 1e-4, f"{tag}: snug's logits with the adapter against PEFT's: relerr {e_logits:.1e}")
    merged = os.path.join(work, f"merged_{tag}")
    r = run_snug("merge", bdir, adapter, merged)
    check(r.returncode == 0, f"snug merge of the pad_token adapter ({tag}): {r.stderr[-600:]}")
    want = pm.merge_and_unload().state_dict()
    got = transformers.LlamaForCausalLM.from_pretrained(merged, dtype=torch.float32).state_dict()
    worst = max(relerr(got[k], v) for k, v in want.items())
    check(got.keys() == want.keys() and worst < 1e-5, f"{tag}: snug merge against PEFT's merge_and_unload: {worst:.1e}")
    r = run_snug("generate", bdir, "--adapter", adapter, "--prompt", "hello", "--max_new_tokens", "3")
    check(r.returncode == 0, f"{tag}: snug generate --adapter: {r.stderr[-600:]}")
    print(f"  LoRA adding pad_token without lora_modules_to_save ({tag}): the adapter holds the {vocab}-row tables; "
          f"logits as PEFT's to {e_logits:.1e}, snug merge as merge_and_unload to {worst:.1e}")
shutil.rmtree(work)
finish("test_added_tokens_parity")
