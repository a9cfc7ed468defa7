"""snug's 4-bit quantization (src/model/quant4.c) against bitsandbytes' own, byte for byte, on the CPU.

tests/parity/quant4_driver.c, compiled here with gcc from a few src files, quantizes tensors this test writes and saves
the tensors bitsandbytes' Linear4bit would save for them, plus its dequantization. The reference is the installed
bitsandbytes: functional.quantize_4bit / dequantize_4bit on CPU tensors (its default torch op quantizes the 4-bit
codes, its native CPU kernel the nested absmax). For every case (NF4 and FP4, nested and not, blocksize 64, 128,
256, 32; real shapes, odd sizes with a short last block, a single short block, an odd last dimension, blocks of zeros
and of subnormals, values on the code midpoints, values that tell x * (1 / absmax) from x / absmax, a constant
weight, fp32, bf16 and fp16 input) it checks:
  - the packed bytes, the absmax (fp32 bits, or the uint8 codes when nested), nested_absmax, quant_map and
    nested_quant_map (bits), each saved tensor's dtype and shape, and the key set of Linear4bit's state dict;
  - the quant_state blob: the bytes of bitsandbytes' pack_dict_to_tensor(as_dict(packed=True)) (so the nested_offset
    too, to the last digit of its repr);
  - the dequantized weight, fp32 and in the weight's dtype, equal to dequantize_4bit (every bit but the sign of
    FP4's negative-zero code, on which bitsandbytes' own kernels disagree: same_value), with bitsandbytes' generic
    CPU arithmetic as the reference (common.bnb_generic_cpu: its native AVX-512 kernel is not that arithmetic);
  - that bitsandbytes' QuantState.from_dict takes snug's tensors and dequantizes them to the same values;
  - that snug reads a file of bitsandbytes' tensors in place (snug_q4_st_view), with uint8 and bf16 quant_storage,
    and dequantizes it bit-equal to bitsandbytes.
End to end: a tiny bf16 Llama quantized by transformers (BitsAndBytesConfig) and by snug from the same file gives
the same model.safetensors tensor for tensor; transformers loads snug's folder (same logits) and snug reads
transformers' file. Also snug_json_py_float against json.dumps on 14,000 values, and snug_q4_torch_mean against
torch.mean with 1 and 2 threads on both sides of torch's 32768 grain size.

torch's CPU mean (the nested offset) depends on the vector width, so the test pins torch to AVX2 kernels
(ATEN_CPU_CAPABILITY=avx2, which snug reproduces); on a CPU without AVX2 it checks the offset-dependent parts only to
within rounding. Above 32768 blocks torch's mean also depends on its thread count: that case runs bitsandbytes with
torch.set_num_threads(1), which is what snug reproduces."""
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bnb_generic_cpu, check, finish  # noqa: E402

ROOT = os.environ.get("SNUG_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SOURCES = ["tests/parity/quant4_driver.c", "src/model/quant4.c", "src/model/quant4_io.c",
           "src/model/safetensors.c", "src/core/quant_map.c",
           "src/core/error.c", "src/core/dtype.c", "src/core/json_util.c", "src/core/fileio.c", "src/core/hash.c"]


def build_driver(tmp):
    exe = os.path.join(tmp, "quant4_driver")
    flags = []
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson"], capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        flags = ["-ljansson"]
    cmd = [os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-D_GNU_SOURCE", "-fopenmp", "-Wall", "-Wextra",
           "-Wno-unused-parameter", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src"),
           *[os.path.join(ROOT, s) for s in SOURCES], *flags, "-lm", "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def bits(t):
    t = t.contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16) if t.element_size() == 2 else t


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def same_value(a, b):
    """Dequantized weights: the same values, where -0.0 equals +0.0. FP4's code 8 is a negative zero, and
    bitsandbytes' own paths disagree on its sign (its CUDA kernel multiplies the code's sign into the zero, as did its
    native CPU kernel on the AVX2 machines this test passed on bit for bit; its generic torch implementation and its
    AVX-512 kernel give +0.0), which no product or sum can tell apart."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def first_diff(a, b, by_value=False):
    a, b = (a.flatten(), b.flatten()) if by_value else (bits(a).flatten(), bits(b).flatten())
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    d = (a != b).nonzero().flatten()
    return f"{d.numel()} differ, first at {d[:1].tolist()}" if d.numel() else "equal"


def midpoint_weight():
    """[16, 64]: each row starts with 1.0 (absmax 1, so the scaled value is the value itself), then every NF4 and FP4
    midpoint, every code, the values one ulp either side of each midpoint, +-0 and tiny values of both signs."""
    from bitsandbytes.functional import get_4bit_type
    vals = []
    for qt in ("nf4", "fp4"):
        c = torch.sort(get_4bit_type(qt, device="cpu"))[0]
        mid = (c[:-1] + c[1:]) / 2
        vals += [c, mid, torch.nextafter(mid, torch.tensor(2.0)), torch.nextafter(mid, torch.tensor(-2.0))]
    vals.append(torch.tensor([0.0, -0.0, 1e-3, -1e-3, 2.6e-3, -2.6e-3, 1e-30, -1e-30]))
    v = torch.cat(vals).float()
    out = torch.zeros(16, 64)
    out[:, 0] = 1.0
    flat = out[:, 1:].reshape(-1)
    flat[:v.numel()] = v
    out[:, 1:] = flat.reshape(16, 63)
    return out


def zero_block_weight():
    """[3, 50] (150 elements; with blocksize 64: blocks 0-63, 64-127, 128-149): a normal block, a full block of
    zeros (absmax 0) and a short block of zeros (bitsandbytes stores absmax 1e-38 for it)."""
    torch.manual_seed(3)
    w = torch.zeros(150)
    w[:64] = torch.randn(64)
    return w.reshape(3, 50)


def division_weight():
    """[1, 104] with blocksize 64: a full block and a short one, each led by its absmax am, then values x for which
    x * (1 / am) and x / am fall on different sides of an NF4 midpoint: the full block must take the product and
    the short block the quotient to match bitsandbytes."""
    from bitsandbytes.functional import get_4bit_type
    c = get_4bit_type("nf4", device="cpu").numpy()
    bounds = ((c[:-1] + c[1:]) / np.float32(2)).astype(np.float32)
    am = np.float32(3.0)
    inv = np.float32(1) / am
    picked = []
    for b in bounds:
        x = np.float32(b * am)
        for _ in range(6):
            x = np.nextafter(x, np.float32(-10))
        for _ in range(12):
            if (np.float32(x / am) > b) != (np.float32(x * inv) > b) and abs(x) < am:
                picked.append(x)
            x = np.nextafter(x, np.float32(10))
    assert picked, "no value tells a product from a quotient"
    w = np.zeros(104, np.float32)
    for lo, hi in ((0, 64), (64, 104)):
        w[lo] = am
        k = min(hi - lo - 1, len(picked))
        w[lo + 1:lo + 1 + k] = picked[:k]
    return torch.from_numpy(w).reshape(1, 104)


def cases():
    torch.manual_seed(0)
    g = lambda *s: torch.randn(*s)  # noqa: E731
    sub = torch.zeros(4, 64)
    sub[0] = torch.randn(64) * 1e-39  # absmax below 1e-38: bitsandbytes scales by 1 / 1e-38
    sub[1] = torch.randn(64)
    sub[2] = torch.randn(64) * 1e-42
    sub[3] = torch.randn(64) * 1e30
    c = [
        ("a", g(256, 576), "nf4", 64, True),
        ("b", g(256, 576), "nf4", 64, False),
        ("c", g(256, 576), "fp4", 64, True),
        ("d", g(256, 576), "fp4", 64, False),
        ("e", g(1536, 576).bfloat16(), "nf4", 128, True),
        ("f", g(1536, 576).bfloat16(), "fp4", 128, False),
        ("g", g(7, 13), "nf4", 64, True),
        ("h", g(7, 13), "fp4", 64, False),
        ("i", g(5, 7), "nf4", 64, True),  # one short block: absmax - offset is 0 (a nested block of zeros)
        ("j", g(5, 7), "fp4", 32, True),
        ("k", zero_block_weight(), "nf4", 64, True),
        ("l", zero_block_weight(), "fp4", 64, False),
        ("m", sub, "nf4", 64, False),
        ("n", sub, "fp4", 64, True),
        ("o", midpoint_weight(), "nf4", 64, False),
        ("p", midpoint_weight(), "fp4", 64, False),
        ("u", midpoint_weight().reshape(1024, 1), "fp4", 64, True),  # odd last dimension: bnb's torch fallback
        ("v", division_weight(), "nf4", 64, False),
        ("q", torch.ones(64, 128), "nf4", 64, True),  # constant: every absmax equals the offset
        ("r", (g(96, 130) * torch.exp(2 * g(96, 130))).half(), "nf4", 256, True),  # fp16, wide range
        ("s", (g(33, 1001) * 0.02).bfloat16(), "nf4", 64, True),  # odd and a short last block, bf16
        ("t", (g(2048, 1088) * 0.02).bfloat16(), "nf4", 64, True),  # 34816 blocks: torch's mean goes parallel
    ]
    return [(f"model.layers.0.mlp.{k}_proj.weight", w, qt, bs, nested) for k, w, qt, bs, nested in c]


def bnb_quantize(F, w, qt, bs, nested):
    big = w.numel() // bs >= 32768
    threads = torch.get_num_threads()
    if big:
        torch.set_num_threads(1)
    try:
        return F.quantize_4bit(w, blocksize=bs, compress_statistics=nested, quant_type=qt)
    finally:
        torch.set_num_threads(threads)


def dequant_as(F, q, qs, dtype):
    d = qs.dtype
    qs.dtype = dtype
    try:
        return F.dequantize_4bit(q, qs)
    finally:
        qs.dtype = d


def transformers_roundtrip(exe, tmp):
    """A tiny bf16 Llama quantized by transformers (BitsAndBytesConfig nf4, double quantization) and by snug from the
    same bf16 file: the two model.safetensors must hold the same tensors bit for bit, transformers must load snug's
    folder as a bnb-4bit model giving the same logits, and snug must read transformers' file."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=160, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(7)
    base, hfq, mine = (os.path.join(tmp, d) for d in ("base", "hf-bnb4", "snug-bnb4"))
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(base)
    bc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=torch.bfloat16)
    q = AutoModelForCausalLM.from_pretrained(base, quantization_config=bc, device_map="cpu", dtype=torch.bfloat16)
    q.save_pretrained(hfq)
    ref = load_file(os.path.join(hfq, "model.safetensors"))
    src = load_file(os.path.join(base, "model.safetensors"))
    specs = [f"{k}:nf4:64:1" if f"{k}.quant_state.bitsandbytes__nf4" in ref else f"{k}:copy" for k in src]
    os.makedirs(mine)
    r = subprocess.run([exe, "export", os.path.join(base, "model.safetensors"), os.path.join(mine, "model.safetensors"),
                        *specs], capture_output=True, text=True)
    check(r.returncode == 0, f"quant4_driver export: {r.stderr.strip()}")
    if r.returncode != 0:
        return
    for f in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(hfq, f)):
            shutil.copy(os.path.join(hfq, f), mine)
    got = load_file(os.path.join(mine, "model.safetensors"))
    check(sorted(got) == sorted(ref), f"transformers' bnb-4bit file has keys {sorted(set(ref) - set(got))} snug's "
                                      f"lacks, snug's has {sorted(set(got) - set(ref))} extra")
    diff = [k for k in ref if k in got and not same(got[k], ref[k])]
    check(not diff, f"tensors of snug's bnb-4bit file differ from transformers': {diff[:5]}")
    nq = sum(1 for k in ref if ".quant_state." in k)
    q2 = AutoModelForCausalLM.from_pretrained(mine, device_map="cpu")
    check(type(q2.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit",
          "transformers loads snug's folder as a bnb-4bit model")
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        check(torch.equal(q(ids).logits, q2(ids).logits), "logits of snug's bnb-4bit folder equal transformers' own")
    names = [k[:-len(".quant_state.bitsandbytes__nf4")] for k in ref if ".quant_state." in k]
    vout = os.path.join(tmp, "hfview.safetensors")
    r = subprocess.run([exe, "view", os.path.join(hfq, "model.safetensors"), vout, *names], capture_output=True,
                       text=True)
    check(r.returncode == 0, f"quant4_driver view of transformers' file: {r.stderr.strip()}")
    if r.returncode == 0:
        v = load_file(vout)
        mods = dict(q.named_modules())
        import bitsandbytes.functional as F
        bad = [n for n in names if not same_value(v[f"snug/{n}.out"], F.dequantize_4bit(
            mods[n[:-len(".weight")]].weight.data, mods[n[:-len(".weight")]].weight.quant_state))]
        check(not bad, f"snug's view of transformers' file dequantizes differently: {bad[:3]}")
    qc = json.load(open(os.path.join(mine, "config.json"))).get("quantization_config", {})
    print(f"transformers {nq} bnb-4bit weights: snug's file equals transformers' tensor for tensor: {not diff}; "
          f"loads as {qc.get('quant_method')} {qc.get('bnb_4bit_quant_type')}, same logits")


def main():
    try:
        import bitsandbytes.functional as F
        from bitsandbytes.functional import QuantState
    except ImportError as err:  # the venv is made by scripts/venv.sh, which installs bitsandbytes
        print(f"test_quant4_parity: cannot import bitsandbytes ({err}); pip install bitsandbytes", file=sys.stderr)
        sys.exit(1)
    note = bnb_generic_cpu()
    if note:
        print(note)
    exact_offset = torch.backends.cpu.get_cpu_capability() == "AVX2"
    if not exact_offset:
        print("test_quant4_parity: torch does not run AVX2 kernels here; nested offsets checked to within rounding")
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        cs = cases()
        src, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({name: w.clone().contiguous() for name, w, *_ in cs}, src)
        r = subprocess.run([exe, "quant", src, out] + [f"{n}:{qt}:{bs}:{int(nst)}" for n, _, qt, bs, nst in cs],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"quant4_driver quant: {r.stderr.strip()}")
        if r.returncode != 0:
            finish("test_quant4_parity")
        got = load_file(out)
        bnb_files = {}
        for name, w, qt, bs, nested in cs:
            tag = f"{name.split('.')[-2]} {tuple(w.shape)} {w.dtype} {qt} bs={bs} nested={nested}"
            q, qs = bnb_quantize(F, w, qt, bs, nested)
            ref = {name: q, **{f"{name}.{k}": v for k, v in qs.as_dict(packed=True).items()}}
            bnb_files[name] = ref
            mine = {k: v for k, v in got.items() if k == name or k.startswith(name + ".")}
            check(sorted(mine) == sorted(ref), f"{tag}: keys {sorted(mine)} vs bitsandbytes {sorted(ref)}")
            for k, v in ref.items():
                if k not in mine:
                    continue
                m = mine[k]
                ok = m.dtype == v.dtype and m.shape == v.shape
                check(ok, f"{tag}: {k} is {m.dtype} {tuple(m.shape)}, bitsandbytes {v.dtype} {tuple(v.shape)}")
                offset_dependent = nested and (k.endswith(".absmax") or k.endswith(".nested_absmax")
                                               or ".quant_state." in k)
                if ok and (exact_offset or not offset_dependent):
                    what = bytes(m.tolist()).decode() + " vs " + bytes(v.tolist()).decode() \
                        if ".quant_state." in k else first_diff(m, v)
                    check(same(m, v), f"{tag}: {k}: {what}")
            # dequantized, in fp32 and in the weight's dtype
            ref32 = dequant_as(F, q, qs, torch.float32)
            refdt = F.dequantize_4bit(q, qs)
            tol = 0 if exact_offset else 1e-6
            for k, r_ in ((f"snug/{name}.f32", ref32), (f"snug/{name}.out", refdt)):
                m = got[k]
                if tol == 0:
                    check(same_value(m, r_), f"{tag}: dequantized {k}: {first_diff(m, r_, True)}")
                else:
                    check(torch.allclose(m.float(), r_.float(), rtol=1e-2, atol=0),
                          f"{tag}: dequantized {k} far from bitsandbytes")
            # bitsandbytes reads snug's tensors
            parts = {k[len(name) + 1:]: v for k, v in mine.items() if k != name}
            qs2 = QuantState.from_dict(parts, torch.device("cpu"))
            d2 = F.dequantize_4bit(mine[name], qs2)
            check(torch.equal(d2.float(), got[f"snug/{name}.out"].float()) and d2.dtype == w.dtype,
                  f"{tag}: bitsandbytes' QuantState.from_dict of snug's tensors dequantizes differently")
            err = (ref32.double() - w.double()).abs().max().item()
            if name.endswith(("a_proj.weight", "e_proj.weight", "t_proj.weight")):
                print(f"{tag}: bit-equal; max |w - dequant| {err:.3g}, offset "
                      f"{qs.offset.item() if nested else '-'}")

        # snug reads bitsandbytes' files in place: uint8 and bf16 quant_storage
        for storage in (torch.uint8, torch.bfloat16):
            sel = [c for c in cs if c[0].split(".")[-2] in ("a_proj", "c_proj", "e_proj", "g_proj", "k_proj", "r_proj")]
            files, names = {}, []
            for name, w, qt, bs, nested in sel:
                if storage != torch.uint8 and ((w.numel() + 1) // 2) % 2:
                    continue  # bitsandbytes cannot view an odd number of bytes as bf16
                q, qs = F.quantize_4bit(w, blocksize=bs, compress_statistics=nested, quant_type=qt,
                                        quant_storage=storage)
                files[name] = q
                files.update({f"{name}.{k}": v for k, v in qs.as_dict(packed=True).items()})
                names.append((name, q, qs))
            path, vout = os.path.join(tmp, "bnb.safetensors"), os.path.join(tmp, "view.safetensors")
            save_file(files, path)
            r = subprocess.run([exe, "view", path, vout] + [n for n, *_ in names], capture_output=True, text=True)
            check(r.returncode == 0, f"quant4_driver view ({storage}): {r.stderr.strip()}")
            if r.returncode == 0:
                v = load_file(vout)
                for name, q, qs in names:
                    ref = F.dequantize_4bit(q, qs)
                    check(same_value(v[f"snug/{name}.out"], ref),
                          f"view of bitsandbytes' {name} ({storage}): {first_diff(v[f'snug/{name}.out'], ref, True)}")
                    check(same_value(v[f"snug/{name}.f32"], dequant_as(F, q, qs, torch.float32)),
                          f"view of bitsandbytes' {name} ({storage}) in fp32")
            print(f"snug reads bitsandbytes' files ({storage} storage): {len(names)} weights")

        transformers_roundtrip(exe, tmp)

        # Python's float repr (the nested_offset in the JSON): random doubles, fp32 values, every power of two
        import json
        import random
        import struct
        rnd = random.Random(1)
        vals = [struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0] for _ in range(5000)]
        vals += [float(np.frombuffer(struct.pack("<I", rnd.getrandbits(32)), np.float32)[0]) for _ in range(5000)]
        vals += [2.0 ** k for k in range(-1074, 1024)] + [float(np.float32(rnd.random() * 3)) for _ in range(2000)]
        vals = [v for v in vals if np.isfinite(v)]
        r = subprocess.run([exe, "repr"], input="".join(v.hex() + "\n" for v in vals), capture_output=True, text=True)
        mine = r.stdout.split("\n")
        bad = [(v, m) for v, m in zip(vals, mine) if m != json.dumps(v)]
        check(not bad, f"snug_json_py_float differs from json.dumps: {[(json.dumps(v), m) for v, m in bad[:5]]}")
        print(f"snug_json_py_float equals json.dumps on {len(vals)} values: {not bad}")

        # torch's mean, threads and sizes around the grain size
        lanes = 8
        if exact_offset:
            torch.manual_seed(5)
            bad = 0
            for n in (1, 2, 7, 8, 9, 63, 64, 65, 255, 1000, 4097, 32767, 32768, 40000, 65537, 100003, 262144):
                x = (torch.rand(n) * torch.rand(n) * 3).float()
                path = os.path.join(tmp, "m.bin")
                x.numpy().astype("<f4").tofile(path)
                for thr in (1, 2):
                    torch.set_num_threads(thr)
                    ref = int(np.array([x.mean().item()], dtype=np.float32).view(np.uint32)[0])
                    mine = int(subprocess.run([exe, "mean", path, str(lanes), str(thr)], capture_output=True,
                                              text=True).stdout.strip(), 16)
                    if mine != ref:
                        bad += 1
                        check(False, f"torch mean n={n} threads={thr}: snug {mine:08x}, torch {ref:08x}")
            torch.set_num_threads(2)
            check(bad == 0, "snug_q4_torch_mean equals torch.mean")
            print(f"snug_q4_torch_mean: torch.mean's bits for 17 sizes, 1 and 2 threads: {bad == 0}")
    finish("test_quant4_parity")


if __name__ == "__main__":
    main()
