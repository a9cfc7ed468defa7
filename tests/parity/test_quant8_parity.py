"""snug's 8-bit base (load_in_8bit: bitsandbytes' LLM.int8 weights) against bitsandbytes, transformers and PEFT on
the CPU.

Quantizing (src/model/quant4.c, SNUG_Q4_INT8, through tests/parity/quant4_driver.c): for random weights in fp32,
bf16 and fp16, rows of zeros, rows with one outlier, values that land on a half after scaling, fp16 subnormals, a
constant row and a single column, snug's codes (bitsandbytes' CB) and row scales (SCB) equal, byte for byte, what
bitsandbytes' Int8Params gives when transformers' loader moves it to the CPU. The dequantized weight, in fp32 and in
the weight's dtype, equals bitsandbytes' MatMul8bitFp's (the path it trains with on a CPU): CB.to(dtype) times
SCB * (1 / 127). A weight past fp16's range, which bitsandbytes' fp16 cast would make infinite, is refused.

End to end, a small random Llama in bf16 loaded by transformers with BitsAndBytesConfig(load_in_8bit=True), LoRA
r=8 on all seven projections (PEFT):
- every Linear8bitLt's CB and SCB equal snug's quantization of the same 16-bit file;
- the loss and every adapter gradient of snug (the 8-bit matrices dequantized to bf16, fp32 compute) against an fp32
  reference on the same weights (PEFT on the 8-bit model with the other tensors widened to fp32), held to four times
  the distance of PEFT's own bf16 run from that reference: the noise floor of bf16, measured here;
- five AdamW steps: snug's loss curve as close to the reference's as PEFT's bf16 run is (times four);
- DoRA on the 8-bit base, magnitudes included, within the same floor;
- the memory levers: the 8-bit matrices dequantized 3 rows at a time (within the same floor), and
  offload_embedding (bit for bit the run without it);
- the folder transformers saves from its 8-bit model (I8 weights, SCB, weight_format) reads to bit for bit the loss
  and gradients of snug quantizing the 16-bit folder at load, and is refused, with the fix named, in a full fine-tune
  and with load_in_8bit false; a corrupt SCB and a column layout are refused naming the tensor.

One batch's bf16 loss lands anywhere from 2e-7 to 3e-4 from the reference (PEFT's and snug's alike, measured over
six batches), so one sample is no floor: the loss is checked on six batches, each within four times the largest
distance of PEFT's bf16 run, LoRA or DoRA, over them all. The gradients, a few hundred values each, are checked on
the first batch against PEFT's distance on the same tensor."""
import copy
import os
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ALL7, QUANT_LLAMA as LLAMA, adamw_curve, aligned_labels, check, finish  # noqa: E402
from common import curve_near, grads_near, snug_parity  # noqa: E402
from test_quant4_parity import build_driver, same  # noqa: E402

try:
    import bitsandbytes as bnb
    import peft
except ImportError as err:
    print(f"test_quant8_parity: cannot import peft/bitsandbytes ({err}); run scripts/venv.sh", file=sys.stderr)
    sys.exit(1)

def bnb_int8(w):
    """bitsandbytes' Int8Params moved to the CPU, as transformers' loader does: (CB, SCB)."""
    p = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False).to("cpu")
    return p.data, p.SCB


def bnb_weight(CB, SCB, dtype):
    """The weight MatMul8bitFp multiplies by in training."""
    return CB.to(dtype, copy=True).mul_(SCB.unsqueeze(1).mul(1.0 / 127.0))


def cases():
    torch.manual_seed(0)
    g = torch.randn
    ties = torch.zeros(8, 254)
    ties[:, 0] = 127.0  # absmax 127: y = x * ((1 / 127) * 127), and x runs over the halves k + 1/2
    ties[:, 1:] = (torch.arange(253).float() - 126.0 + 0.5)[None, :]
    special = g(6, 80) * 0.02
    special[0] = 0.0                 # a row of zeros
    special[1, 7] = 40.0             # one outlier
    special[2] = 3e-6 * g(80)        # fp16 subnormals
    special[3] = 0.5                 # constant
    special[4, :] = -special[4, :].abs()  # all negative
    return [
        ("a", g(128, 96) * 0.02),
        ("b", (g(192, 128) * 0.02).bfloat16()),
        ("c", (g(64, 130) * torch.exp(g(64, 130))).half()),
        ("d", ties),
        ("e", special),
        ("f", (g(33, 1001) * 0.05).bfloat16()),
        ("g", g(17, 1)),
    ]


def quantizing(exe, tmp):
    ws = {f"model.layers.0.mlp.{k}_proj.weight": w for k, w in cases()}
    src, out = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "q.safetensors")
    save_file(ws, src)
    r = subprocess.run([exe, "quant", src, out, *[f"{n}:int8:0:0" for n in ws]], capture_output=True, text=True)
    check(r.returncode == 0, f"quant4_driver quant int8: {r.stderr.strip()}")
    if r.returncode:
        return
    got = load_file(out)
    nbad = 0
    for name, w in ws.items():
        CB, SCB = bnb_int8(w)
        mine_cb, mine_scb = got[name + ".CB"].view(torch.int8), got[name + ".SCB"]
        ok_scb = same(mine_scb, SCB)
        zero = SCB == 0  # bitsandbytes' codes of a zero row are 0 * inf cast to int8: undefined, never read
        ok_cb = torch.equal(mine_cb[~zero], CB[~zero]) and bool((mine_cb[zero] == 0).all())
        f32 = same(got[f"snug/{name}.f32"], bnb_weight(CB, SCB, torch.float32))
        out16 = same(got[f"snug/{name}.out"], bnb_weight(CB, SCB, w.dtype))
        ok = ok_scb and ok_cb and f32 and out16
        nbad += not ok
        check(ok, f"{name} ({w.dtype}, {tuple(w.shape)}): SCB {ok_scb}, CB {ok_cb}, fp32 weight {f32}, "
                  f"{w.dtype} weight {out16}")
    print(f"  quantizing: {len(ws)} weights (fp32, bf16, fp16; ties, zero rows, outliers, subnormals): codes, scales "
          f"and dequantized weights equal to bitsandbytes': {nbad == 0}")
    big = {"model.layers.0.mlp.x_proj.weight": torch.tensor([[1.0, 70000.0], [0.5, 0.25]])}
    save_file(big, src)
    r = subprocess.run([exe, "quant", src, out, "model.layers.0.mlp.x_proj.weight:int8:0:0"], capture_output=True,
                       text=True)
    check(r.returncode == 3 and "past fp16's range" in r.stderr and "column 1" in r.stderr,
          f"a weight past fp16's range: rc {r.returncode}: {r.stderr.strip()}")


def quantized(base_dir):
    bc = transformers.BitsAndBytesConfig(load_in_8bit=True)
    return transformers.AutoModelForCausalLM.from_pretrained(base_dir, quantization_config=bc, dtype=torch.bfloat16,
                                                             attn_implementation="eager", device_map="cpu")


def with_adapter(model, ad_dir, fp32_rest):
    if fp32_rest:  # the non-quantized tensors widened, as prepare_model_for_kbit_training does
        for p in model.parameters():
            if p.dtype == torch.bfloat16:
                p.data = p.data.float()
    m = peft.PeftModel.from_pretrained(model, ad_dir, is_trainable=True)
    m.train()  # bitsandbytes' CPU training path (MatMul8bitFp)
    return m


def grads_of(m, ids, hf_labels):
    o = m(input_ids=ids, labels=hf_labels)
    o.loss.backward()
    return o.loss.item(), {n.replace(".lora_magnitude_vector.default.weight", ".lora_magnitude_vector")
                           .replace(".default.", "."): p.grad.float() for n, p in m.named_parameters()
                           if p.requires_grad}


def loss_gap(outs):
    return abs(outs["bf16"][0] - outs["fp32"][0]) / abs(outs["fp32"][0])


def compare(tag, got, outs, loss_floor):
    e = abs(got["loss"].item() - outs["fp32"][0]) / abs(outs["fp32"][0])
    check(e <= 4 * loss_floor, f"{tag}: loss relerr {e:.2e}, PEFT bf16's largest {loss_floor:.2e}")
    worst, worst_floor, n = grads_near(tag, got, outs["fp32"][1], outs["bf16"][1])
    check(n > 0, f"{tag}: no gradients compared")
    print(f"  {tag}: loss relerr {e:.1e} (PEFT bf16 up to {loss_floor:.1e}); {n} gradients, worst relerr "
          f"{worst:.1e} (PEFT bf16 worst {worst_floor:.1e})")


def make_adapter(base, ad_dir, dora):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = peft.get_peft_model(copy.deepcopy(base).float(), peft.LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=ALL7, init_lora_weights=False, use_dora=dora))
    torch.manual_seed(2)
    with torch.no_grad():  # s B A about as large as the base's weights: bf16's noise stays small beside the signal
        for n, p in lm.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.copy_((0.1 if "lora_A" in n else 0.02) * torch.randn_like(p))
            elif "lora_magnitude" in n:  # away from the base's row norms, so the gain is not 1
                p.mul_(1 + 0.1 * torch.randn_like(p))
    lm.save_pretrained(ad_dir)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        quantizing(build_driver(tmp), tmp)

    work = tempfile.mkdtemp()
    base_dir, ad_dir, dora_dir = (os.path.join(work, d) for d in ("base", "adapter", "dora"))
    cfg = transformers.LlamaConfig(**LLAMA)
    torch.manual_seed(1)
    base = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    base.save_pretrained(base_dir, safe_serialization=True)

    # transformers' 8-bit model holds snug's bytes
    q = quantized(base_dir)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        src, out = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "q.safetensors")
        sd = {n: p.detach().clone() for n, p in base.named_parameters() if ".layers." in n and p.dim() == 2}
        save_file(sd, src)
        r = subprocess.run([exe, "quant", src, out, *[f"{n}:int8:0:0" for n in sd]], capture_output=True, text=True)
        check(r.returncode == 0, f"quant4_driver quant of the model: {r.stderr.strip()}")
        got = load_file(out) if r.returncode == 0 else {}
        mods = dict(q.named_modules())
        equal = 0
        for n in sd:
            lin = mods[n[:-len(".weight")]]
            ok = isinstance(lin, bnb.nn.Linear8bitLt) and n + ".CB" in got and \
                torch.equal(got[n + ".CB"].view(torch.int8), lin.weight.data) and same(got[n + ".SCB"], lin.weight.SCB)
            equal += ok
            check(ok, f"{n}: transformers' Linear8bitLt differs from snug's quantization")
        print(f"  transformers load_in_8bit: {equal} of {len(sd)} Linear8bitLt weights equal snug's, CB and SCB")

    B, T = 2, 24
    batches = []
    for k in range(6):
        torch.manual_seed(10 + k)
        ids = torch.randint(0, cfg.vocab_size, (B, T))
        hf_labels = ids.clone()
        hf_labels[0, :4] = -100
        batches.append((ids, hf_labels, aligned_labels(hf_labels)))
    outs = {}  # (dora, batch): PEFT's fp32 reference and bf16 run
    for dora, ad in ((False, ad_dir), (True, dora_dir)):
        make_adapter(base, ad, dora)
        for k, (ids, hf_labels, _) in enumerate(batches):
            outs[dora, k] = {"fp32": grads_of(with_adapter(quantized(base_dir), ad, True), ids, hf_labels),
                             "bf16": grads_of(with_adapter(quantized(base_dir), ad, False), ids, hf_labels)}
    loss_floor = max(loss_gap(o) for o in outs.values())
    for dora, ad in ((False, ad_dir), (True, dora_dir)):
        tag = "8-bit DoRA" if dora else "8-bit LoRA"
        gaps = []
        for k, (ids, _, labels) in enumerate(batches[1:], 1):
            ref = outs[dora, k]["fp32"][0]
            gaps.append(abs(snug_parity(base_dir, ids, labels, "--adapter", ad, "--qlora", "int8")["loss"].item()
                            - ref) / abs(ref))
        check(max(gaps) <= 4 * loss_floor, f"{tag}: loss relerr {['%.1e' % g for g in gaps]} on batches 2-6, PEFT "
                                           f"bf16's largest {loss_floor:.1e}")
        print(f"  {tag}: batches 2-6, loss relerr at most {max(gaps):.1e} (PEFT bf16 up to {loss_floor:.1e})")
    ids, hf_labels, labels = batches[0]
    for dora, ad in ((False, ad_dir), (True, dora_dir)):
        tag = "8-bit DoRA" if dora else "8-bit LoRA"
        got = snug_parity(base_dir, ids, labels, "--adapter", ad, "--qlora", "int8")
        compare(tag, got, outs[dora, 0], loss_floor)
        # rows in chunks of 3 run GEMMs over fewer columns (the same floor); the embedding's place changes no bit
        compare(tag + " in row chunks of 3", snug_parity(base_dir, ids, labels, "--adapter", ad, "--qlora", "int8",
                                                        "--q4_chunk", str(3 * LLAMA["hidden_size"])),
                outs[dora, 0], loss_floor)
        r = snug_parity(base_dir, ids, labels, "--adapter", ad, "--qlora", "int8", "--offload_embedding", "1")
        diff = [k for k in got if k.startswith("grad.") and not same(r[k], got[k])]
        check(same(r["loss"], got["loss"]) and not diff, f"{tag} offload_embedding: not bit for bit ({diff[:3]})")
        print(f"  {tag}: offload_embedding bit for bit the run without it: {same(r['loss'], got['loss']) and not diff}")

    # the folder transformers saves: the same bytes, read in place
    pre = os.path.join(work, "prequant")
    quantized(base_dir).save_pretrained(pre, safe_serialization=True)
    a = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--qlora", "int8")
    b = snug_parity(pre, ids, labels, "--adapter", ad_dir, "--qlora", "int8")
    diff = [k for k in a if k.startswith("grad.") and not same(a[k], b[k])]
    check(same(a["loss"], b["loss"]) and not diff, f"transformers' 8-bit folder: not bit for bit ({diff[:3]})")
    print(f"  transformers' saved 8-bit folder: loss and gradients bit for bit those of the 16-bit folder: "
          f"{same(a['loss'], b['loss']) and not diff}")
    bad = {}
    for what, change, expect in (("a negative SCB", lambda t: t.update({S: -t[S]}), "SCB"),
                                 ("a column layout", lambda t: t.update({F: torch.tensor(1, dtype=torch.uint8)}),
                                  "weight_format")):
        S, F = "model.layers.1.mlp.up_proj.SCB", "model.layers.1.mlp.up_proj.weight_format"
        t = load_file(os.path.join(pre, "model.safetensors"))
        change(t)
        d = os.path.join(work, "bad" + str(len(bad)))
        os.makedirs(d)
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        for f in ("config.json",):
            with open(os.path.join(pre, f)) as src, open(os.path.join(d, f), "w") as dst:
                dst.write(src.read())
        try:
            snug_parity(d, ids, labels, "--adapter", ad_dir, "--qlora", "int8")
            bad[what] = "accepted"
        except RuntimeError as err:
            bad[what] = "" if expect in str(err) and "up_proj" in str(err) else str(err)[-200:]
    check(not any(bad.values()), f"corrupt 8-bit folders: {bad}")
    inp = os.path.join(work, "batch.safetensors")
    save_file({"input_ids": ids.to(torch.int32).contiguous(), "labels": labels.to(torch.int32).contiguous()}, inp)
    r = subprocess.run([os.environ.get("SNUG_BIN", "build/snug"), "parity", pre, inp, os.path.join(work, "o")],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "load_in_8bit: true" in r.stderr, f"full fine-tune of the 8-bit folder: rc "
          f"{r.returncode}: {r.stderr.strip()[-200:]}")

    # five AdamW steps
    steps, lr = 5, 5e-3
    curves = {}
    for tag, fp32_rest in (("fp32", True), ("bf16", False)):
        curves[tag] = adamw_curve(with_adapter(quantized(base_dir), ad_dir, fp32_rest), ids, hf_labels, steps, lr)
    got = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--qlora", "int8", "--steps", str(steps), "--lr",
                      str(lr))
    curve_near(f"{steps} AdamW steps", got["loss_history"].tolist(), curves["fp32"], curves["bf16"])
    finish("test_quant8_parity")


if __name__ == "__main__":
    main()
