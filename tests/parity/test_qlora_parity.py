"""snug's QLoRA against PEFT on a bitsandbytes 4-bit model (transformers' BitsAndBytesConfig, on the CPU): a small
random Llama in bf16, NF4 (and FP4) with double quantization, LoRA r=8 on all seven projections.

- The reference computes in fp32 on the same weights: the 4-bit matrices dequantized to bf16 as bitsandbytes does,
  the other tensors bf16 widened (prepare_model_for_kbit_training upcasts them to fp32). snug computes in fp32 and
  saves activations in bf16, so its loss and adapter gradients are held to the distance of PEFT's own bf16 run from
  that fp32 reference, measured here (the noise floor of bf16), times four.
- Five AdamW steps: snug's loss curve stays as close to the fp32 reference's as PEFT's own bf16 run does (times 4).
- snug reading the folder transformers saved (pre-quantized: U8 weights, absmax, quant_state) gives bit for bit the
  loss and gradients of snug quantizing the 16-bit folder itself at load: both hold bitsandbytes' bytes.
- The memory levers (offload_embedding, the 4-bit matrices dequantized in row chunks, a tiled MLP) against the run
  without them: bit for bit where only the place of the data changes, else within the same floor.
- A corrupt quant_state, an unknown quant type and a 4-bit folder without an adapter are refused with one clear
  error.
- DoRA on the 4-bit base (QDoRA): loss and gradients, magnitudes included, within the same floor.
- At ZeRO stage 3 over 2 MPI ranks, the pre-quantized folder (each rank keeping its piece of every layer's 4-bit
  bytes) trains DDP's adapter on the 16-bit folder, byte for byte."""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from common import ALL7, QUANT_LLAMA as LLAMA, SNUG, adamw_curve, aligned_labels, check, finish  # noqa: E402
from common import curve_near, grads_near, rel_max as rel, snug_parity  # noqa: E402

try:
    import bitsandbytes  # noqa: F401
    import peft
except ImportError as err:
    print(f"test_qlora_parity: cannot import peft/bitsandbytes ({err}); run scripts/venv.sh", file=sys.stderr)
    sys.exit(1)

torch.manual_seed(0)


def quantized(base_dir, quant_type, compute):
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute)
    return transformers.AutoModelForCausalLM.from_pretrained(base_dir, quantization_config=bnb, dtype=torch.bfloat16,
                                                             attn_implementation="eager", device_map="cpu")


def with_adapter(model, ad_dir, fp32_rest):
    if fp32_rest:  # the non-4-bit tensors widened, as prepare_model_for_kbit_training does
        for n, p in model.named_parameters():
            if p.dtype == torch.bfloat16:
                p.data = p.data.float()
    return peft.PeftModel.from_pretrained(model, ad_dir, is_trainable=True)


def levers(base_dir, ids, labels, got, outs, loss_floor):
    """The memory levers move data, not the arithmetic: the embedding in host memory (offload_embedding) gives the
    same bits; the 4-bit matrices dequantized in row chunks (gate/up in two, chunk offsets into the packed codes and
    both levels of scales) and a tiled MLP (3 shards of 16 tokens) run GEMMs over fewer columns or rows, so they are
    held to the bf16 floor measured against PEFT above, like the run without them."""
    def same(a, b):
        return a["loss"].item() == b["loss"].item() and all(torch.equal(a[k], b[k]) for k in a if k.startswith("grad."))
    ad = ("--adapter", os.path.join(os.path.dirname(base_dir), "adapter"), "--qlora", "nf4")
    off = snug_parity(base_dir, ids, labels, *ad, "--offload_embedding", "1")
    check(same(off, got), "offload_embedding changed the loss or the gradients")
    for what, extra in (("4-bit matrices in row chunks", ("--q4_chunk", "4096")),
                        ("tiled MLP (3 shards)", ("--tiled_mlp", "3")),
                        ("all three", ("--q4_chunk", "4096", "--tiled_mlp", "3", "--offload_embedding", "1"))):
        r = snug_parity(base_dir, ids, labels, *ad, *extra)
        e = abs(r["loss"].item() - outs["fp32"][0]) / abs(outs["fp32"][0])
        check(e <= max(4 * loss_floor, 1e-4), f"{what}: loss relerr {e:.2e} against PEFT fp32")
        worst = 0.0
        for name, g in outs["fp32"][1].items():
            floor, err = rel(outs["bf16"][1][name], g), rel(r["grad." + name], g)
            worst = max(worst, err)
            check(err <= max(4 * floor, 1e-3), f"{what}: grad {name} relerr {err:.2e}, PEFT bf16's {floor:.2e}")
        print(f"  nf4 {what}: loss relerr {e:.1e}, worst adapter gradient relerr {worst:.1e}")
    print(f"  nf4 offload_embedding: loss and gradients bit for bit those without it: {same(off, got)}")


def qdora(work, base, base_dir, ids, hf_labels, labels):
    """DoRA on the 4-bit base (QDoRA): each module's weight norm over the dequantized matrix. The loss and every
    adapter gradient (magnitudes included) against the fp32 reference within four times PEFT's own bf16 distance,
    and the same with the norms and gradients taken in chunks of rows that start on blocks of codes and scales.

    PEFT's DoRA dequantizes the 4-bit weight at every forward (dequantize_module_weight), but on the CPU
    bitsandbytes 0.50's first forward of a Linear4bit repacks weight.data for its own kernel ((n/2, 1) codes become
    (rows, cols/2)), which dequantize_4bit then misreads (0.13 off on weights of magnitude 0.05, measured here). The
    reference takes each module's dequantized weight before the first forward instead."""
    import bitsandbytes as bnb
    import peft.tuners.lora.dora as pdora
    before, original = {}, pdora.dequantize_module_weight
    pdora.dequantize_module_weight = lambda module: before[id(module)] if id(module) in before else original(module)
    ad_dir = os.path.join(work, "dora")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = peft.get_peft_model(copy.deepcopy(base).float(), peft.LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=ALL7, init_lora_weights=False, use_dora=True))
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_magnitude_vector" in n:
                p.mul_(1 + 0.3 * torch.randn_like(p))
            elif "lora_" in n:
                p.copy_(0.2 * torch.randn_like(p))
    lm.save_pretrained(ad_dir)
    outs = {}
    for tag, compute, fp32_rest in (("fp32", torch.float32, True), ("bf16", torch.bfloat16, False)):
        m = with_adapter(quantized(base_dir, "nf4", compute), ad_dir, fp32_rest)
        for mod in m.modules():
            if type(mod).__name__ == "Linear4bit":
                before[id(mod)] = bnb.functional.dequantize_4bit(mod.weight.data, mod.weight.quant_state)
        o = m(input_ids=ids, labels=hf_labels)
        o.loss.backward()
        outs[tag] = (o.loss.item(), {n.replace(".lora_magnitude_vector.default.weight", ".lora_magnitude_vector")
                                      .replace(".default.", "."): p.grad.float()
                                      for n, p in m.named_parameters() if p.requires_grad})
    loss_floor = abs(outs["bf16"][0] - outs["fp32"][0]) / abs(outs["fp32"][0])
    for how, extra in (("", ()), (" in row chunks", ("--q4_chunk", "4096"))):
        got = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--qlora", "nf4", *extra)
        e = abs(got["loss"].item() - outs["fp32"][0]) / abs(outs["fp32"][0])
        check(e <= max(4 * loss_floor, 1e-4), f"QDoRA{how}: loss relerr {e:.2e}, PEFT bf16's {loss_floor:.2e}")
        worst, n = 0.0, 0
        for name, g in outs["fp32"][1].items():
            if "grad." + name not in got:
                check(False, f"QDoRA{how}: snug has no gradient for {name}")
                continue
            floor, err = rel(outs["bf16"][1][name], g), rel(got["grad." + name], g)
            worst, n = max(worst, err), n + 1
            check(err <= max(4 * floor, 1e-3), f"QDoRA{how}: grad {name} relerr {err:.2e}, PEFT bf16's {floor:.2e}")
        mags = sum("magnitude" in k for k in outs["fp32"][1])
        print(f"  nf4 DoRA{how}: loss relerr {e:.1e} (PEFT bf16 {loss_floor:.1e}); {n} adapter gradients ({mags} "
              f"magnitudes), worst relerr {worst:.1e}")


def stage3(work, base_dir, pre):
    """QLoRA at ZeRO stage 3 over 2 MPI ranks, reading the pre-quantized folder: each rank keeps its piece of every
    layer's 4-bit span (the folder's bytes) and gathers the rest; the adapter trained is, byte for byte, DDP's on the
    16-bit folder quantized at load (ddp_deterministic), with the same logged losses and gradient norms."""
    if not shutil.which("mpirun"):
        print("  stage 3: skipped (no mpirun)")
        return
    data, yml = os.path.join(work, "ids.jsonl"), os.path.join(work, "ids.yaml")
    g = torch.Generator().manual_seed(4)
    with open(data, "w") as f:
        for _ in range(24):
            ex = torch.randint(1, LLAMA["vocab_size"], (int(torch.randint(8, 20, (1,), generator=g)),),
                               generator=g).tolist()
            f.write(json.dumps({"input_ids": ex, "labels": ex}) + "\n")
    with open(yml, "w") as f:
        f.write(f"datasets:\n  - path: {data}\n    type: pretokenized\n")
    mpi = ["mpirun", "--oversubscribe", "-np", "2"] + (["--allow-run-as-root"] if os.getuid() == 0 else [])
    # a byte-level tokenizer of the model's 256 ids (the data is pretokenized; the run checks that the sizes agree)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    t = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    t.pre_tokenizer, t.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok = os.path.join(work, "bytes_tokenizer")
    os.makedirs(tok, exist_ok=True)
    t.save(os.path.join(tok, "tokenizer.json"))
    common = [SNUG, "train", yml, "--tokenizer", tok, "--adapter", "qlora", "--bf16", "true", "--lora_target_linear",
              "true", "--sequence_len", "32", "--micro_batch_size", "2", "--max_steps", "3", "--logging_steps", "1",
              "--learning_rate", "3e-3", "--sample_tokens", "0", "--seed", "5", "--threads", "1",
              "--ddp_deterministic", "true"]
    outs = {}
    for tag, base, extra in (("ddp", base_dir, []), ("zero3", pre, ["--zero_stage", "3", "--dist_debug", "true"])):
        outs[tag] = os.path.join(work, "stage3_" + tag)
        r = subprocess.run(mpi + common + ["--base_model", base, "--output_dir", outs[tag]] + extra,
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if r.returncode != 0 and "built without MPI" in r.stdout + r.stderr:
            print("  stage 3: skipped (snug built without MPI)")
            return
        check(r.returncode == 0, f"stage 3 {tag}: rc {r.returncode}: {(r.stdout + r.stderr).strip()[-400:]}")
        if r.returncode:
            return
    rows = {t: [(j["loss"], j["grad_norm"]) for j in map(json.loads, open(os.path.join(o, "metrics.jsonl")))]
            for t, o in outs.items()}
    adapters = {t: open(os.path.join(o, "adapter_model.safetensors"), "rb").read() for t, o in outs.items()}
    same = rows["ddp"] == rows["zero3"] and len(rows["ddp"]) == 3 and adapters["ddp"] == adapters["zero3"]
    check(same, f"stage 3 from the pre-quantized folder: {rows['zero3']} against DDP's {rows['ddp']}, adapters "
          f"{'equal' if adapters['ddp'] == adapters['zero3'] else 'differ'}")
    print(f"  stage 3 over 2 ranks from the pre-quantized folder: DDP's losses, gradient norms and adapter bytes: "
          f"{same}")


def main():
    work = tempfile.mkdtemp()
    base_dir, ad_dir = os.path.join(work, "base"), os.path.join(work, "adapter")
    cfg = transformers.LlamaConfig(**LLAMA)
    torch.manual_seed(1)
    base = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    base.save_pretrained(base_dir, safe_serialization=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = peft.get_peft_model(copy.deepcopy(base).float(), peft.LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=ALL7, init_lora_weights=False))
    torch.manual_seed(2)
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_" in n:
                p.copy_(0.2 * torch.randn_like(p))
    lm.save_pretrained(ad_dir)

    B, T = 2, 24
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    hf_labels = ids.clone()
    hf_labels[0, :4] = -100
    labels = aligned_labels(hf_labels)

    for qt in ("nf4", "fp4"):
        ref = with_adapter(quantized(base_dir, qt, torch.float32), ad_dir, True)
        r16 = with_adapter(quantized(base_dir, qt, torch.bfloat16), ad_dir, False)
        outs = {}
        for tag, m in (("fp32", ref), ("bf16", r16)):
            o = m(input_ids=ids, labels=hf_labels)
            o.loss.backward()
            outs[tag] = (o.loss.item(), {n.replace(".default.", "."): p.grad.float() for n, p in m.named_parameters()
                                          if p.requires_grad})
        got = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--qlora", qt)
        loss_floor = abs(outs["bf16"][0] - outs["fp32"][0]) / abs(outs["fp32"][0])
        e = abs(got["loss"].item() - outs["fp32"][0]) / abs(outs["fp32"][0])
        tol = max(4 * loss_floor, 1e-4)
        check(e <= tol, f"{qt}: loss relerr {e:.2e}, PEFT bf16's {loss_floor:.2e} (tolerance {tol:.1e})")
        worst, worst_floor, n = grads_near(qt, got, outs["fp32"][1], outs["bf16"][1])
        print(f"  {qt}: loss relerr {e:.1e} (PEFT bf16 {loss_floor:.1e}); {n} adapter gradients, worst relerr "
              f"{worst:.1e} (PEFT bf16 worst {worst_floor:.1e})")
        if qt == "nf4":
            levers(base_dir, ids, labels, got, outs, loss_floor)

        # five AdamW steps: snug's curve stays as close to the fp32 reference's as PEFT's bf16 run does (times 4)
        steps, lr = 5, 5e-3
        curves = {}
        for tag, compute, fp32_rest in (("fp32", torch.float32, True), ("bf16", torch.bfloat16, False)):
            curves[tag] = adamw_curve(with_adapter(quantized(base_dir, qt, compute), ad_dir, fp32_rest), ids,
                                      hf_labels, steps, lr)
        got = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--qlora", qt, "--steps", str(steps), "--lr",
                          str(lr))
        curve_near(f"{qt}: {steps} AdamW steps", got["loss_history"].tolist(), curves["fp32"], curves["bf16"])

    qdora(work, base, base_dir, ids, hf_labels, labels)

    # the folder transformers saves (pre-quantized) reads to the same bits as quantizing the 16-bit folder
    pre = os.path.join(work, "prequant")
    quantized(base_dir, "nf4", torch.bfloat16).save_pretrained(pre, safe_serialization=True)
    a = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--qlora", "nf4")
    b = snug_parity(pre, ids, labels, "--adapter", ad_dir, "--qlora", "nf4")
    same = a["loss"].item() == b["loss"].item() and all(torch.equal(a[k], b[k]) for k in a if k.startswith("grad."))
    check(same, "a pre-quantized bitsandbytes folder gives other numbers than the 16-bit folder quantized at load")
    print(f"  pre-quantized folder: loss and gradients bit for bit those of quantizing at load: {same}")
    stage3(work, base_dir, pre)

    # damaged 4-bit checkpoints: one clear error, exit 2
    from safetensors.torch import load_file, save_file
    sd = load_file(os.path.join(pre, "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4"
    blob = json.loads(bytes(sd[key].tolist()).decode())
    inp = os.path.join(work, "in.safetensors")
    save_file({"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32)}, inp)
    for what, mutate, word in (
            ("a quant_state that is not JSON", lambda d: d.__setitem__(key, torch.tensor(list(b"{nope"), dtype=torch.uint8)),
             "quant_state"),
            ("an unknown quant type", lambda d: d.__setitem__(key, torch.tensor(
                list(json.dumps({**blob, "quant_type": "int3"}).encode()), dtype=torch.uint8)), "int3")):
        bad = os.path.join(work, "bad")
        os.makedirs(bad, exist_ok=True)
        d = dict(sd)
        mutate(d)
        save_file(d, os.path.join(bad, "model.safetensors"))
        os.system(f"cp {pre}/config.json {bad}/")
        r = subprocess.run([SNUG, "parity", bad, inp, os.path.join(work, "o.safetensors"), "--adapter", ad_dir,
                            "--qlora", "nf4"], capture_output=True, text=True)
        check(r.returncode == 2 and word in r.stderr and "q_proj" in r.stderr,
              f"{what}: rc {r.returncode}: {r.stderr.strip()[-300:]}")
    # a 4-bit folder trained in full (no adapter): refused, naming the fix
    r = subprocess.run([SNUG, "parity", pre, inp, os.path.join(work, "o.safetensors")], capture_output=True, text=True)
    check(r.returncode == 2 and "adapter: qlora" in r.stderr, f"full fine-tune of a 4-bit folder: rc {r.returncode}: "
          f"{r.stderr.strip()[-300:]}")
    finish("test_qlora_parity")


if __name__ == "__main__":
    main()
