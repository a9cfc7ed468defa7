# untie.sh: shared by the CLI tests (sourced, not a test itself). `untie SRC DST` copies the model folder SRC (a
# tied Llama) to DST with its embedding copied into an untied lm_head.weight and tie_word_embeddings false.
untie() {
  python3 - "$1" "$2" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1:3]
shutil.copytree(src, dst)
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
}
