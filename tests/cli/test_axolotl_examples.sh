#!/usr/bin/env bash
# Axolotl's llama-3 examples as published (tests/data/axolotl: lora-1b, qlora-1b, instruct-lora-8b, fft-8b), each
# trained for a few steps with only its paths changed: base_model to a tiny Llama built here (Llama 3's special tokens,
# max_position_embeddings as Llama 3.1's), the datasets to local files in the published formats (alpaca; messages
# with role and content), output_dir to this folder. Each saves what it says (an adapter, or the model) with the pad
# token special_tokens names. Then fft-8b on a base whose tokenizer lacks that pad token: the token is added as
# Axolotl adds it, the embedding grows by one row, and the saved folder holds the grown tokenizer and config.
. "$(dirname "$0")/lib.sh"
cd "$W" || exit 1

# a tokenizer with Llama 3's special tokens, and one without <|end_of_text|>
mkdir -p tok tok_nopad
python3 - "$SRC/assets/tokenizer/tokenizer.json" <<'PY'
import json, sys
for out, skip in (("tok", None), ("tok_nopad", "<|end_of_text|>")):
    t = json.load(open(sys.argv[1]))
    n = max(max(t["model"]["vocab"].values()), max(a["id"] for a in t["added_tokens"])) + 1
    for s in ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]:
        if s != skip:
            t["added_tokens"].append({"id": n, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                                      "normalized": False, "special": True})
            n += 1
    json.dump(t, open(out + "/tokenizer.json", "w"), ensure_ascii=False)
PY
cp "$SRC/assets/tokenizer/tokenizer_config.json" tok/
cp "$SRC/assets/tokenizer/tokenizer_config.json" tok_nopad/
python3 - <<'PY'
import json, random
random.seed(3)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
say = lambda k: " ".join(random.choice(words) for _ in range(k))
with open("alpaca.jsonl", "w") as al, open("messages.jsonl", "w") as ms:
    for i in range(40):
        al.write(json.dumps({"instruction": say(5), "input": say(3) if i % 2 else "", "output": say(8)}) + "\n")
        ms.write(json.dumps({"messages": [{"role": "user", "content": say(6)},
                                          {"role": "assistant", "content": say(9)}]}) + "\n")
PY
# the bases: a tiny Llama after one step from scratch, cut to 2 layers of width 64 (the published sequence lengths
# stay cheap), its positions as Llama 3.1's (RoPE has no weights to grow)
for b in base:tok base_nopad:tok_nopad; do
  printf 'tokenizer: %s\ndatasets:\n  - path: alpaca.jsonl\n    type: alpaca\nsequence_len: 128\nmax_steps: 1\nsample_tokens: 0\noutput_dir: %s\n' \
    "${b#*:}" "${b%%:*}" > "${b%%:*}.yml"
  "$SNUG" train "${b%%:*}.yml" > "${b%%:*}.log" 2>&1 || fatal "the base ${b%%:*} did not train" "${b%%:*}.log"
  python3 - "${b%%:*}" <<'PY' || fatal "cutting the base ${b%%:*}"
import json, re, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
C, I, HD = 64, 128, c["hidden_size"] // c["num_attention_heads"]  # the heads keep their width: 2 heads, 1 KV head
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr, body = json.loads(raw[8:8 + n]), raw[8 + n:]
want = {"q_proj": (2 * HD, C), "k_proj": (HD, C), "v_proj": (HD, C), "o_proj": (C, 2 * HD), "gate_proj": (I, C),
        "up_proj": (I, C), "down_proj": (C, I), "embed_tokens": (c["vocab_size"], C), "lm_head": (c["vocab_size"], C)}
out, blobs, at = {}, [], 0
for name, t in hdr.items():
    m = re.search(r"layers\.(\d+)\.", name)
    if name == "__metadata__" or (m and int(m[1]) >= 2):
        continue
    shape = next((v for k, v in want.items() if k in name), (C,))  # else a norm
    a, b = t["data_offsets"]
    src, cols = body[a:b], t["shape"][-1]
    data = (b"".join(src[r * cols * 4:(r * cols + shape[1]) * 4] for r in range(shape[0])) if len(shape) == 2
            else src[:C * 4])
    out[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(data)]}
    blobs.append(data)
    at += len(data)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
c.update(hidden_size=C, intermediate_size=I, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
         head_dim=HD, max_position_embeddings=131072)
json.dump(c, open(d + "/config.json", "w"), indent=2)
PY
done

# each example, its paths changed (nothing else), a few steps
local_paths() { # EXAMPLE BASE OUT: the published file with base_model, datasets' path and output_dir pointed here
  sed -e "s#^base_model: .*#base_model: $2#" -e "s#^output_dir: .*#output_dir: $3#" \
    -e 's#  - path: teknium/GPT4-LLM-Cleaned#  - path: alpaca.jsonl#' -e 's#  - path: tatsu-lab/alpaca#  - path: alpaca.jsonl#' \
    -e 's#  - path: fozziethebeat/alpaca_messages_2k_test#  - path: messages.jsonl#' "$SRC/tests/data/axolotl/$1"
}
for ex in lora-1b.yml:adapter qlora-1b.yml:adapter instruct-lora-8b.yml:adapter fft-8b.yaml:model; do
  f=${ex%%:*} name=${f%.*}
  local_paths "$f" base "out_$name" > "$name.yml"
  # only the paths differ from the published file
  [ "$(diff "$SRC/tests/data/axolotl/$f" "$name.yml" | grep -c '^>')" -le 3 ] || bad "$f: more than its paths changed"
  "$SNUG" train "$name.yml" --max_steps 2 > "$name.log" 2>&1 || { bad "$f did not train" "$name.log"; continue; }
  saved=out_$name/model.safetensors
  [ "${ex#*:}" = adapter ] && saved=out_$name/adapter_model.safetensors
  [ -f "$saved" ] && grep -q '"pad_token": "<|end_of_text|>"' "out_$name/tokenizer_config.json" && ok ||
    bad "$f: $saved or its pad_token not saved" "$name.log"
done
grep -q "INT8 base\|8-bit" instruct-lora-8b.log && grep -qi "nf4\|4-bit" qlora-1b.log && ok ||
  bad "the quantized bases were not used" qlora-1b.log
# the instruct example's chat_template: llama3 is snug's built-in Llama 3 template (the tokenizer ships none)
grep -q "messages.jsonl (chat, llama3)" instruct-lora-8b.log && ok ||
  bad "instruct-lora-8b did not read its messages with the llama3 template" instruct-lora-8b.log

# fft-8b on a tokenizer without <|end_of_text|>: added with the next id, the embedding grown, all of it saved
local_paths fft-8b.yaml base_nopad out_grown > grown.yml
"$SNUG" plan grown.yml > grown_plan.txt 2>&1 || bad "plan with an added token" grown_plan.txt
"$SNUG" train grown.yml --max_steps 2 > grown.log 2>&1 || bad "fft-8b with the pad token added" grown.log
grep -q "tokenizer .*, 1 token added: the embedding and lm_head grown from [0-9]* to [0-9]* rows, the new ones normal(0, 0.02)" \
  grown.log && ok || bad "the header does not say the token was added" grown.log
if python3 - base_nopad out_grown grown_plan.txt <<'PY'
import json, sys
base, out, plan = sys.argv[1:4]
v0 = json.load(open(base + "/config.json"))["vocab_size"]
v = json.load(open(out + "/config.json"))["vocab_size"]
added = {a["content"]: a["id"] for a in json.load(open(out + "/tokenizer.json"))["added_tokens"]}
dec = json.load(open(out + "/tokenizer_config.json"))["added_tokens_decoder"]
hdr = open(out + "/model.safetensors", "rb")
n = int.from_bytes(hdr.read(8), "little")
shape = json.loads(hdr.read(n))["model.embed_tokens.weight"]["shape"]
print(f"  vocabulary {v0} -> {v}; <|end_of_text|> id {added.get('<|end_of_text|>')}; embed_tokens {shape}")
sys.exit(0 if v == v0 + 1 and added.get("<|end_of_text|>") == v0 and shape == [v, shape[1]] and
         dec.get(str(v0), {}).get("special") is True and f"vocab {v})" in open(plan).read() else 1)
PY
then ok; else bad "the grown vocabulary in the saved folder and the plan" grown_plan.txt; fi
# a plan whose tokenizer snug cannot load (a normalizer it lacks) still counts the token the run would add
mkdir -p tok_unread && python3 -c "import json; t = json.load(open('tok_nopad/tokenizer.json'))
t['normalizer'] = {'type': 'BertNormalizer', 'clean_text': True, 'handle_chinese_chars': True, 'strip_accents': None,
                   'lowercase': False}
json.dump(t, open('tok_unread/tokenizer.json', 'w'))"
v=$(python3 -c "import json; print(json.load(open('out_grown/config.json'))['vocab_size'])")
"$SNUG" plan grown.yml --tokenizer tok_unread > unread_plan.txt 2>&1 && grep -q "vocab $v)" unread_plan.txt && ok ||
  bad "a plan with a tokenizer snug cannot load did not count the added token (want vocab $v)" unread_plan.txt

finish
