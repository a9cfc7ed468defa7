"""The folder a full fine-tune saves, as transformers would have saved the base after the same training.

A small Mistral with a sliding window (8 < sequence_len) is made by transformers in bf16 and in fp16, each with an
fp32 twin, with an unknown key in its config.json, and `snug train` runs 2 steps on each with
special_tokens.pad_token set. Then, for each folder:
- config.json is the base's key for key (sliding_window kept, the unknown key kept, the dtype as saved), but for
  pad_token_id, which training set;
- model.safetensors holds every tensor in the base's dtype (half the fp32 size for bf16 and fp16), each the fp32
  weights that the same run on the base's fp32 twin (the same values stored fp32) saves, rounded by torch's
  .to(dtype), bit for bit, and transformers loads the folder to those values in that dtype;
- tokenizer_config.json, config.json and generation_config.json agree on the pad, bos and eos ids."""
import json
import os
import shutil
import struct
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
from common import check, finish, run_snug  # noqa: E402

ROOT = os.environ.get("SNUG_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
torch.manual_seed(0)
NAMES = {torch.bfloat16: ("bfloat16", "BF16"), torch.float16: ("float16", "F16"), torch.float32: ("float32", "F32")}


def header_dtypes(path):
    """The dtypes a safetensors file's header names, with the file's size."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return {v["dtype"] for k, v in h.items() if k != "__metadata__"}, os.path.getsize(path)


def make_base(work, dtype):
    """The base in dtype and its fp32 twin (the same values), each with the tokenizer; their folders and the
    tokenizer."""
    tok_src = os.path.join(ROOT, "assets", "tokenizer")
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(tok_src)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = transformers.MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     rms_norm_eps=1e-5, sliding_window=8, tie_word_embeddings=False, bos_token_id=eos,
                                     eos_token_id=eos)
    cfg.a_key_snug_does_not_know = {"kept": [1, 2]}
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype)
    dirs = []
    for name in ("base", "base32"):
        d = os.path.join(work, name)
        (model if name == "base" else model.float()).save_pretrained(d)  # (.float() converts in place: last)
        for f in os.listdir(tok_src):
            shutil.copy(os.path.join(tok_src, f), d)
        dirs.append(d)
    return dirs[0], dirs[1], tok


def train(work, base, pad):
    """2 steps of a full fine-tune of base with pad as special_tokens.pad_token; the output folder, or None."""
    data = os.path.join(work, "data.jsonl")
    with open(data, "w") as f:
        for i in range(24):
            f.write(json.dumps({"text": f"example {i} " + "words and more words " * (i % 5 + 1)}) + "\n")
    out = base + ".out"
    yml = base + ".yaml"
    with open(yml, "w") as f:
        f.write(f"base_model: {base}\ndatasets:\n  - path: {data}\n    type: completion\n"
                f"sequence_len: 32\nmicro_batch_size: 2\nmax_steps: 2\nlearning_rate: 0.01\n"
                f"sample_tokens: 0\nspecial_tokens:\n  pad_token: {json.dumps(pad)}\noutput_dir: {out}\n"
                f"dataset_prepared_path: {os.path.join(work, 'prep')}\n")
    r = run_snug("train", yml)
    check(r.returncode == 0, f"snug train {base} failed ({r.returncode}): {r.stderr[-2000:]}")
    return None if r.returncode else out


def check_folder(name, dtype, base, out, tok, pad):
    """config.json, the dtype of model.safetensors and the special ids of one saved folder; its tensors and size."""
    st = NAMES[dtype][1]
    got, want = json.load(open(os.path.join(out, "config.json"))), json.load(open(os.path.join(base, "config.json")))
    pad_id = tok.convert_tokens_to_ids(pad)
    for k in sorted(set(got) | set(want)):
        if k == "pad_token_id":
            check(got.get(k) == pad_id, f"{name}: config.json pad_token_id {got.get(k)}, want {pad_id}")
        else:
            check(got.get(k) == want.get(k), f"{name}: config.json {k} is {got.get(k)!r}, the base's {want.get(k)!r}")
    check(got.get("sliding_window") == 8, f"{name}: sliding_window {got.get('sliding_window')!r}")
    kinds, size = header_dtypes(os.path.join(out, "model.safetensors"))
    check(kinds == {st}, f"{name}: saved dtypes {kinds}, want {st}")
    saved = load_file(os.path.join(out, "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    loaded = dict(model.named_parameters())
    wrong = [k for k in saved if loaded[k].dtype != dtype or not torch.equal(loaded[k].detach(), saved[k])]
    check(not wrong, f"{name}: transformers loads other values or dtypes: {wrong[:4]}")
    t = transformers.AutoTokenizer.from_pretrained(out)
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    check(t.pad_token == pad and t.pad_token_id == got.get("pad_token_id") == gen.get("pad_token_id") == pad_id,
          f"{name}: pad: tokenizer {t.pad_token_id}, config {got.get('pad_token_id')}, generation "
          f"{gen.get('pad_token_id')}")
    for role in ("eos", "bos"):
        tid = getattr(t, f"{role}_token_id")
        check(tid == got.get(f"{role}_token_id") == gen.get(f"{role}_token_id"),
              f"{name}: {role}: tokenizer {tid}, config {got.get(f'{role}_token_id')}, generation "
              f"{gen.get(f'{role}_token_id')}")
    return saved, size


def run(work, dtype):
    name = NAMES[dtype][0]
    base, base32, tok = make_base(work, dtype)
    pad = tok.convert_ids_to_tokens(7)  # a token of the vocabulary that is not the EOS
    out, out32 = train(work, base, pad), train(work, base32, pad)
    if not out or not out32:
        return
    saved, size = check_folder(name, dtype, base, out, tok, pad)
    master, size32 = check_folder(name + "'s fp32 twin", torch.float32, base32, out32, tok, pad)
    check(abs(size - size32 / 2) < 4096, f"{name}: model.safetensors is {size} bytes, the fp32 one's {size32}")
    differ = [k for k in master if not torch.equal(saved[k], master[k].to(dtype))]
    check(not differ and saved.keys() == master.keys(), f"{name}: tensors not torch's rounding of fp32: {differ[:4]}")
    before = load_file(os.path.join(base32, "model.safetensors"))
    moved = [k for k in master if not torch.equal(master[k], before[k])]
    check(len(moved) > len(master) // 2, f"{name}: training moved only {len(moved)} of {len(master)} tensors")
    print(f"{name}: config.json the base's but pad_token_id; {len(saved)} tensors {NAMES[dtype][1]} ({size} bytes, "
          f"fp32 {size32}), torch's rounding of the fp32 twin's bit for bit; the special ids agree")


def main():
    for dtype in (torch.bfloat16, torch.float16):
        run(tempfile.mkdtemp(), dtype)
    finish("test_saved_folder_parity")


if __name__ == "__main__":
    main()
