# untied_base.sh: shared by the multi-rank CLI tests (sourced, not a test itself). Needs W, SNUG, tok and
# $W/ids.yaml (ids_data.sh). Writes $W/tied (tiny-llama after one step) and $W/base: the same weights with the
# embedding copied into an untied lm_head (tie_word_embeddings false).
"$SNUG" train "$W/ids.yaml" $tok --max_steps 1 --output_dir "$W/tied" \
  > "$W/tied.log" 2>&1 || { echo "FAIL: the base did not train"; tail -3 "$W/tied.log"; exit 1; }
python3 - "$W/tied" "$W/base" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1:3]
os.makedirs(dst)
for f in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(src, f), dst)
path = os.path.join(dst, "model.safetensors")
blob = open(path, "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
head, data = json.loads(blob[8:8 + n]), blob[8 + n:]
emb = next(k for k in head if k.endswith("embed_tokens.weight"))
a, b = head[emb]["data_offsets"]
head["lm_head.weight"] = {**head[emb], "data_offsets": [len(data), len(data) + b - a]}
data += data[a:b]
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
cfg = json.load(open(os.path.join(dst, "config.json")))
cfg["tie_word_embeddings"] = False
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
PY
