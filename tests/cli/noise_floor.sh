# noise_floor.sh: shared by the multi-rank CLI tests that compare a split model with one process (sourced, not a
# test itself). Needs lib.sh (W, ok, bad). The noise floor: one process started from the base with every weight
# moved by one unit in the last place; a run whose arithmetic is the one process's up to rounding must stay within
# 10 times that floor's distance (near).

# nudge SRC DST BIT: a copy of the folder SRC whose F32 weights each have mantissa bit BIT flipped (0: one fp32 unit
# in the last place; 16: one bf16 unit, the last bit bf16 keeps)
nudge() {
  cp -r "$1" "$2" && python3 - "$2/model.safetensors" "$3" <<'PY'
import array, json, struct, sys
path, bit = sys.argv[1], int(sys.argv[2])
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
for name, t in json.loads(b[8:8 + n]).items():
    if name == "__metadata__" or t["dtype"] != "F32":
        continue
    s, e = t["data_offsets"]
    u = array.array("I")
    u.frombytes(bytes(b[8 + n + s:8 + n + e]))
    for k in range(len(u)):
        u[k] ^= 1 << bit
    b[8 + n + s:8 + n + e] = u.tobytes()
open(path, "wb").write(b)
PY
}

# near RUN REF FLOOR: RUN's logged losses, gradient norms and validation losses, and its final weights (each tensor's
# largest difference over its largest magnitude), within 10 times FLOOR's distance from REF
near() {
  if python3 - "$W" "$1" "$2" "$3" <<'PY'
import array, json, struct, sys
w, run, ref, floor = sys.argv[1:5]
def curve(name):
    rows = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
    return [(r["loss"], r["grad_norm"], r.get("val_loss")) for r in rows]
def weights(name):
    b = open(f"{w}/{name}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    out = {}
    for k, t in json.loads(b[8:8 + n]).items():
        if k == "__metadata__":
            continue
        s, e = t["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        if t["dtype"] == "BF16":
            h = array.array("H"); h.frombytes(raw)
            a = array.array("f"); a.frombytes(struct.pack(f"<{len(h)}I", *[x << 16 for x in h]))
        else:
            a = array.array("f"); a.frombytes(raw)
        out[k] = a
    return out
def dist_curve(a, b):
    if len(a) != len(b) or not a:
        sys.exit(f"  {len(a)} logged steps against {len(b)}")
    d = 0.0
    for p, q in zip(a, b):
        for x, y in zip(p, q):
            if (x is None) != (y is None):
                sys.exit("  validation losses logged at other steps")
            if x is not None:
                d = max(d, abs(x - y) / abs(y))
    return d
def dist_w(a, b):
    if a.keys() != b.keys():
        sys.exit("  other tensors saved")
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) / (max(abs(y) for y in b[k]) or 1.0) for k in a)
c, cf = dist_curve(curve(run), curve(ref)), dist_curve(curve(floor), curve(ref))
wr = weights(ref)
d, df = dist_w(weights(run), wr), dist_w(weights(floor), wr)
print(f"  {run:<10} vs {ref:<8} curve {c:.1e} (floor {cf:.1e}), weights {d:.1e} (floor {df:.1e})")
sys.exit(0 if cf > 0 and df > 0 and c <= 10 * cf and d <= 10 * df else 1)
PY
  then ok; else bad "$1 is further from $2 than 10 times the noise floor ($3)"; fi
}

# tiny_gpt2 DIR: a tiny random GPT-2 (2 layers, width 64, 4 heads, 64 positions, vocabulary 2048) in DIR: a fused
# c_attn stored transposed (file [in, out]), a position embedding, LayerNorms with biases, a tied head
tiny_gpt2() {
  python3 - "$1" <<'PY'
import array, json, os, random, struct, sys
d = sys.argv[1]
os.makedirs(d)
C, L, H, T, V, I = 64, 2, 4, 64, 2048, 256
json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": C, "n_layer": L, "n_head": H,
           "n_positions": T, "n_inner": I, "vocab_size": V, "layer_norm_epsilon": 1e-5, "bos_token_id": 0,
           "eos_token_id": 0}, open(os.path.join(d, "config.json"), "w"))
random.seed(13)
shapes = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [T, C], "transformer.ln_f.weight": [C],
          "transformer.ln_f.bias": [C]}
for l in range(L):
    p = f"transformer.h.{l}."
    shapes.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C], p + "attn.c_attn.weight": [C, 3 * C],
                   p + "attn.c_attn.bias": [3 * C], p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                   p + "ln_2.weight": [C], p + "ln_2.bias": [C], p + "mlp.c_fc.weight": [C, I],
                   p + "mlp.c_fc.bias": [I], p + "mlp.c_proj.weight": [I, C], p + "mlp.c_proj.bias": [C]})
head, data = {}, bytearray()
for k, sh in shapes.items():
    n = sh[0] * (sh[1] if len(sh) > 1 else 1)
    mean = 1.0 if "ln_" in k and k.endswith("weight") else 0.0
    b = array.array("f", [mean + random.gauss(0, 0.05) for _ in range(n)]).tobytes()
    head[k] = {"dtype": "F32", "shape": sh, "data_offsets": [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(os.path.join(d, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + bytes(data))
PY
}
