"""snug's LoRA against PEFT on transformers models in fp32: logits, loss and the gradient of every lora_A and lora_B
(Llama with GQA on all seven projections, Llama with q_proj and v_proj alone of the fused q/k/v, rsLoRA, GPT-2's
Conv1D modules; DoRA on the same three shapes, and on the middle layer of three alone (layers_to_transform), with
every lora_magnitude_vector's gradient, its norms and magnitude gradients also taken a few rows of a module at a
time; LoRA and DoRA with lora_dropout in training, PEFT's dropout given snug's masks), five AdamW steps (and five
with LoRA+ against create_loraplus_optimizer) of the adapters against torch.optim.AdamW over PEFT's trainable
parameters, an adapter saved by snug loaded by PeftModel.from_pretrained with no missing or unexpected keys and
giving snug's weights, `snug merge` against merge_and_unload (fp32 and bf16 bases), and adapters that do not match
the base refused with a clear error.

Tolerance: the issue's 1e-5 (largest difference relative to the largest magnitude), or ten times PEFT's own fp32
error against the same computation in float64 where that noise floor is higher."""
import copy
import json
import os
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from common import SNUG, aligned_labels, check, finish, relerr, snug_parity  # noqa: E402

try:
    import peft
except ImportError as err:  # scripts/venv.sh installs peft
    print(f"test_lora_parity: cannot import peft ({err}); pip install peft", file=sys.stderr)
    sys.exit(1)

torch.manual_seed(0)
LLAMA = dict(vocab_size=101, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def cases():
    yield "llama-all7", transformers.LlamaConfig(**LLAMA), dict(r=4, lora_alpha=8, target_modules=ALL7)
    yield "llama-qv", transformers.LlamaConfig(**LLAMA), dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    # embed_tokens and lm_head trained in full beside the adapters (PEFT's modules_to_save)
    yield "llama-save", transformers.LlamaConfig(**LLAMA), dict(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"],
                                                                modules_to_save=["embed_tokens", "lm_head"])
    yield "llama-rslora", transformers.LlamaConfig(**{**LLAMA, "tie_word_embeddings": True}), dict(
        r=4, lora_alpha=6, target_modules=["k_proj", "o_proj", "down_proj"], use_rslora=True)
    yield "gpt2", transformers.GPT2Config(vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), dict(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"])
    # DoRA: every projection; q and v alone of the fused q/k/v with rsLoRA; GPT-2's Conv1D modules with their biases
    yield "llama-dora", transformers.LlamaConfig(**LLAMA), dict(r=4, lora_alpha=8, target_modules=ALL7, use_dora=True)
    yield "llama-dora-qv", transformers.LlamaConfig(**LLAMA), dict(
        r=8, lora_alpha=12, target_modules=["q_proj", "v_proj"], use_rslora=True, use_dora=True)
    # DoRA beside embed_tokens and lm_head trained in full
    yield "llama-dora-save", transformers.LlamaConfig(**LLAMA), dict(
        r=4, lora_alpha=8, target_modules=["v_proj", "up_proj"], modules_to_save=["embed_tokens", "lm_head"],
        use_dora=True)
    # adapters on some layers only (PEFT's layers_to_transform), with DoRA
    yield "llama-layer1", transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 3}), dict(
        r=4, lora_alpha=8, target_modules=ALL7, layers_to_transform=[1], use_dora=True)
    yield "gpt2-dora", transformers.GPT2Config(vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), dict(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], use_dora=True)


def peft_model(cfg, lcfg, dtype, base_dir=None):
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(dtype)
    if base_dir:  # the base as transformers saves it, before PEFT wraps its modules
        base.save_pretrained(base_dir, safe_serialization=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-2: "fan_in_fan_out is set to False ... Setting fan_in_fan_out to True"
        # init_lora_weights=False: random A and B (B = 0 would make every gradient of A zero)
        m = peft.get_peft_model(base, peft.LoraConfig(lora_dropout=0.0, init_lora_weights=False, **lcfg))
    torch.manual_seed(2)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_magnitude_vector" in n:  # DoRA: the initial magnitudes (the base's row norms), moved
                p.mul_(1 + 0.3 * torch.randn_like(p))
            elif "lora_" in n:
                p.copy_(0.3 * torch.randn_like(p))
    return m.eval()


def plain(name):
    """PEFT's parameter name as it saves it: a trained module's copy is saved under the module's own name."""
    name = name.replace(".lora_magnitude_vector.default.weight", ".lora_magnitude_vector")  # DoRA's, as saved
    return name.replace(".modules_to_save.default.", ".").replace(".default.", ".")


def check_grads(tag, got, outs, m32, m64):
    """snug's logits, loss and adapter gradients against the fp64 reference, within the issue's 1e-5 or ten times
    PEFT's own fp32 error."""
    ref, ref32 = outs[64], outs[32]
    floor = relerr(ref32.logits.detach(), ref.logits.detach())
    tol = max(1e-5, 10 * floor)
    e = relerr(got["logits"], ref.logits.detach())
    check(e <= tol, f"{tag}: logits relerr {e:.2e} (tolerance {tol:.1e})")
    e = abs(got["loss"].item() - ref.loss.item()) / abs(ref.loss.item())
    check(e <= tol, f"{tag}: loss relerr {e:.2e}")
    p32, p64 = dict(m32.named_parameters()), dict(m64.named_parameters())
    worst, n = 0.0, 0
    for name, p in p64.items():
        if not p.requires_grad:
            continue
        key = "grad." + plain(name)
        if key not in got:
            check(False, f"{tag}: snug has no gradient for {plain(name)}")
            continue
        floor = relerr(p32[name].grad, p.grad)
        tol = max(1e-5, 10 * floor)
        e = relerr(got[key], p.grad)
        worst = max(worst, e)
        n += 1
        check(e <= tol, f"{tag}: grad {plain(name)} relerr {e:.2e} (tolerance {tol:.1e})")
    extra = [k for k in got if k.startswith("grad.") and k[5:] not in {plain(x) for x in p64}]
    check(not extra, f"{tag}: snug has gradients PEFT has not: {extra[:3]}")
    print(f"  {tag:<24} logits and loss match; {n} adapter gradients, worst relerr {worst:.2e}")


MODULES = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "gpt2": ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]}


def snug_mask(layer, module, rows, cols, p, seed=0):
    """snug's dropout mask of module `module` (its number in the architecture) in `layer` for a micro-batch's
    (rows, cols) input: element i kept when the splitmix64 bits of seed ^ layer ^ module's stream at i + 1 are at or
    above p 2^32 (backend.h, lora.c's mask_seed), the seed 0 in `snug parity`."""
    import numpy as np
    with np.errstate(over="ignore"):
        s = np.uint64(seed) ^ np.uint64(((layer + 1) * 0xD6E8FEB86659FD93) % 2**64) ^ np.uint64((module + 1) << 56)
        z = s + (np.arange(rows * cols, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        bits = (z ^ (z >> np.uint64(31))) >> np.uint64(32)
    keep = bits.astype(np.float64) >= float(np.float32(p)) * 4294967296.0
    return torch.from_numpy(keep.reshape(rows, cols))


class MaskDropout(torch.nn.Module):
    """PEFT's lora_dropout with snug's mask: x * keep / (1 - p), the factor rounded to fp32 as snug computes it."""
    def __init__(self, keep, p):
        super().__init__()
        one, p32 = torch.tensor(1.0, dtype=torch.float32), torch.tensor(p, dtype=torch.float32)
        self.keep, self.f = keep, float(one / (1 - p32))

    def forward(self, x):
        return x * self.keep.reshape(x.shape).to(x.dtype) * self.f


def dropout_parity():
    """LoRA and DoRA with lora_dropout in training against PEFT given snug's masks (each module's own, PEFT's
    lora_dropout modules replaced): DoRA's dropout runs the base again on the dropped-out input (PEFT's
    DoraLinearVariant), so its magnitude and input gradients take that path."""
    p = 0.25
    for tag, cfg, lcfg in (("llama-all7 dropout", transformers.LlamaConfig(**LLAMA),
                            dict(r=4, lora_alpha=8, target_modules=ALL7)),
                           ("llama-dora dropout", transformers.LlamaConfig(**LLAMA),
                            dict(r=4, lora_alpha=8, target_modules=ALL7, use_dora=True)),
                           ("gpt2-dora dropout", transformers.GPT2Config(
                               vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0),
                            dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], use_dora=True))):
        work = tempfile.mkdtemp()
        base_dir, ad_dir = os.path.join(work, "base"), os.path.join(work, "adapter")
        m32 = peft_model(cfg, {**lcfg}, torch.float32, base_dir)
        m32.peft_config["default"].lora_dropout = p
        m32.save_pretrained(ad_dir)
        m64 = copy.deepcopy(m32).to(torch.float64)
        B, T = 2, 13
        ids = torch.randint(0, cfg.vocab_size, (B, T))
        hf_labels = ids.clone()
        hf_labels[1, :3] = -100
        arch = "gpt2" if isinstance(cfg, transformers.GPT2Config) else "llama"
        outs = {}
        for dt, m in ((32, m32), (64, m64)):
            for name, mod in m.named_modules():
                if not hasattr(mod, "lora_dropout") or "default" not in mod.lora_dropout:
                    continue
                k = next(i for i, s in enumerate(MODULES[arch]) if name.endswith("." + s))
                layer = int(name.split(".h." if arch == "gpt2" else ".layers.")[1].split(".")[0])
                cols = mod.in_features
                mod.lora_dropout["default"] = MaskDropout(snug_mask(layer, k, B * T, cols, p), p)
            m.train()
            o = m(input_ids=ids, labels=hf_labels)
            o.loss.backward()
            outs[dt] = o
        got = snug_parity(base_dir, ids, aligned_labels(hf_labels), "--adapter", ad_dir)
        check_grads(tag, got, outs, m32, m64)


def loraplus_parity():
    """LoRA+ (snug's loraplus_lr_ratio): five AdamW steps against PEFT's create_loraplus_optimizer, which steps lora_B
    and the 1-D tensors (DoRA's magnitudes) at the ratio times the learning rate, with its loraplus_weight_decay."""
    steps, lr, wd, ratio = 5, 5e-3, 0.05, 4.0
    from peft.optimizers import create_loraplus_optimizer
    for tag, lcfg in (("llama-all7 LoRA+", dict(r=4, lora_alpha=8, target_modules=ALL7)),
                      ("llama-dora LoRA+", dict(r=4, lora_alpha=8, target_modules=ALL7, use_dora=True))):
        work = tempfile.mkdtemp()
        base_dir, ad_dir = os.path.join(work, "base"), os.path.join(work, "adapter")
        m32 = peft_model(transformers.LlamaConfig(**LLAMA), lcfg, torch.float32, base_dir)
        m32.save_pretrained(ad_dir)
        ids = torch.randint(0, LLAMA["vocab_size"], (2, 13))
        trained = {}
        for dt in (torch.float64, torch.float32):
            m = copy.deepcopy(m32).to(dt)
            opt = create_loraplus_optimizer(m, torch.optim.AdamW, lr=lr, loraplus_lr_ratio=ratio,
                                            loraplus_weight_decay=wd, betas=(0.9, 0.999), eps=1e-8)
            for _ in range(steps):
                opt.zero_grad()
                m(input_ids=ids, labels=ids).loss.backward()
                opt.step()
            trained[dt] = {plain(n): p.detach() for n, p in m.named_parameters() if p.requires_grad}
        got = snug_parity(base_dir, ids, aligned_labels(ids), "--adapter", ad_dir, "--steps", str(steps), "--lr",
                          str(lr), "--weight_decay", str(wd), "--loraplus", str(ratio))
        plainrun = snug_parity(base_dir, ids, aligned_labels(ids), "--adapter", ad_dir, "--steps", str(steps), "--lr",
                               str(lr), "--weight_decay", str(wd))
        worst, moved = 0.0, 0
        for name, ref in trained[torch.float64].items():
            e = relerr(got["param." + name], ref)
            floor = relerr(trained[torch.float32][name], ref)
            worst = max(worst, e)
            check(e < max(1e-4, 10 * floor), f"{tag}: {name} after {steps} steps relerr {e:.2e} (fp32: {floor:.2e})")
            moved += "lora_B" in name and not torch.equal(got["param." + name], plainrun["param." + name])
        check(moved > 0, f"{tag}: --loraplus changed no lora_B")
        print(f"  {tag:<20} {steps} AdamW steps against create_loraplus_optimizer: worst relerr {worst:.2e}")


def main():
    for tag, cfg, lcfg in cases():
        work = tempfile.mkdtemp()
        base_dir, ad_dir = os.path.join(work, "base"), os.path.join(work, "adapter")
        m32 = peft_model(cfg, lcfg, torch.float32, base_dir)
        m64 = copy.deepcopy(m32).to(torch.float64)  # the same weights, computed in float64: the reference
        m32.save_pretrained(ad_dir)
        B, T, V = 2, 13, cfg.vocab_size
        ids = torch.randint(0, V, (B, T))
        hf_labels = ids.clone()
        hf_labels[0, 2:5] = -100
        labels = aligned_labels(hf_labels)

        outs = {}
        for dt, m in ((32, m32), (64, m64)):
            o = m(input_ids=ids, labels=hf_labels)
            o.loss.backward()
            outs[dt] = o
        # the plain run, and with a tiled MLP (4 shards of 7 or 6 tokens: fewer GEMM rows, the same bound)
        runs = {"": snug_parity(base_dir, ids, labels, "--adapter", ad_dir),
                " tiled MLP": snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--tiled_mlp", "4")}
        if lcfg.get("use_dora"):  # DoRA's norms and magnitude gradients over a module's rows 512 / 64 = 8 at a time
            runs[" DoRA row chunks"] = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--q4_chunk", "512")
        for how, got in runs.items():
            check_grads(tag + how, got, outs, m32, m64)
        got = runs[""]

        # five AdamW steps of the adapters (weight decay, clipping) against torch.optim.AdamW over PEFT's trainables,
        # in fp64; the same steps in fp32 measure how far fp32 rounding alone moves each tensor (Adam divides by
        # sqrt(v): a gradient component near eps, as a full embedding has, turns rounding into visible steps)
        steps, lr, wd, clip = 5, 1e-2, 0.05, 1.0
        trained = {}
        for dt in (torch.float64, torch.float32):
            m = copy.deepcopy(m32).to(dt)
            m.zero_grad()
            trainable = [p for p in m.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
            for _ in range(steps):
                opt.zero_grad()
                m(input_ids=ids, labels=hf_labels).loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, clip)
                opt.step()
            trained[dt] = {plain(n): p.detach() for n, p in m.named_parameters() if p.requires_grad}
        saved = os.path.join(work, "trained")
        got = snug_parity(base_dir, ids, labels, "--adapter", ad_dir, "--steps", str(steps), "--lr", str(lr),
                          "--weight_decay", str(wd), "--max_grad_norm", str(clip), "--save", saved)
        worst = 0.0
        for name, ref in trained[torch.float64].items():
            e = relerr(got["param." + name], ref)
            floor = relerr(trained[torch.float32][name], ref)
            worst = max(worst, e)
            check(e < max(1e-4, 10 * floor), f"{tag}: {name} after {steps} AdamW steps relerr {e:.2e} (PEFT in fp32: "
                  f"{floor:.2e})")
        print(f"  {tag:<14} {steps} AdamW steps: worst relerr {worst:.2e}")

        # the adapter snug saved: PEFT loads it (no missing or unexpected keys) and holds snug's trained weights
        cfgj = json.load(open(os.path.join(saved, "adapter_config.json")))
        check(cfgj["peft_type"] == "LORA" and cfgj["task_type"] == "CAUSAL_LM" and cfgj["r"] == lcfg["r"],
              f"{tag}: adapter_config.json {cfgj}")
        newer = {"exclude_modules", "lora_bias", "eva_config", "trainable_token_indices", "target_parameters",
                 "peft_version", "corda_config", "use_dora"}
        dora = lcfg.get("use_dora", False)
        check(cfgj.get("use_dora", False) == dora, f"{tag}: adapter_config.json's use_dora is {cfgj.get('use_dora')}")
        newer -= {"use_dora"} if dora else set()
        check(not (newer & set(cfgj)), f"{tag}: adapter_config.json has keys older PEFT refuses: {newer & set(cfgj)}")
        base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager").float()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = peft.PeftModel.from_pretrained(base, saved)
        missing = [str(w.message) for w in caught if "missing" in str(w.message).lower()]
        check(not missing, f"{tag}: PEFT warned about missing keys: {missing[:1]}")
        worst = 0.0
        for name, p in loaded.named_parameters():
            if "lora_" in name or ".modules_to_save." in name:
                worst = max(worst, relerr(p.detach(), got["param." + plain(name)]))
        check(worst == 0.0, f"{tag}: PEFT loaded different adapter weights than snug saved (relerr {worst:.2e})")

        # snug merge against PEFT's merge_and_unload, on the fp32 base and on the base in bf16 (rounded once)
        for dt in (torch.float32, torch.bfloat16):
            bdir = base_dir
            if dt == torch.bfloat16:
                bdir = os.path.join(work, "base16")
                transformers.AutoModelForCausalLM.from_pretrained(base_dir).to(dt).save_pretrained(bdir)
            out = os.path.join(work, f"merged-{dt}".replace("torch.", ""))
            r = subprocess.run([SNUG, "merge", bdir, saved, out], capture_output=True, text=True)
            check(r.returncode == 0, f"{tag}: snug merge failed: {r.stderr.strip()[-300:]}")
            if r.returncode:
                continue
            ref = peft.PeftModel.from_pretrained(
                transformers.AutoModelForCausalLM.from_pretrained(bdir, attn_implementation="eager", dtype=dt),
                saved).merge_and_unload()
            mine = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=dt)
            rs, ms = ref.state_dict(), mine.state_dict()
            worst, off = 0.0, 0
            for k, v in rs.items():
                w = ms[k]
                check(w.dtype == v.dtype, f"{tag}: merged {k} is {w.dtype}, PEFT's {v.dtype}")
                d = (w.double() - v.double()).abs()
                if dt == torch.float32:
                    worst = max(worst, relerr(w, v))
                else:  # one bf16 rounding of the same fp32 sum: equal, or one unit in the last place apart
                    ulp = v.double().abs().clamp(min=1e-30) * 2.0 ** -7
                    off += int((d > 0).sum())
                    worst = max(worst, float((d / ulp).max()))
            if dt == torch.float32:
                check(worst < 1e-6, f"{tag}: fp32 merge relerr {worst:.2e} against merge_and_unload")
                print(f"  {tag:<14} merge (fp32 base): worst relerr {worst:.2e} against merge_and_unload")
            else:
                check(worst <= 1.0, f"{tag}: bf16 merge differs by {worst:.2f} ulp from merge_and_unload")
                print(f"  {tag:<14} merge (bf16 base): {off} values one bf16 ulp apart, the rest equal")

    dropout_parity()
    loraplus_parity()

    # adapters that do not fit the base: one clear error, exit 2 (a vocabulary as large as the tokenizer's)
    cfg = transformers.LlamaConfig(**{**LLAMA, "vocab_size": 2048})
    work = tempfile.mkdtemp()
    base_dir, ad_dir = os.path.join(work, "base"), os.path.join(work, "adapter")
    m = peft_model(cfg, dict(r=4, lora_alpha=8, target_modules=["q_proj"]), torch.float32, base_dir)
    m.save_pretrained(ad_dir)
    other = transformers.LlamaConfig(**{**LLAMA, "vocab_size": 2048, "hidden_size": 32, "intermediate_size": 40})
    other_dir = os.path.join(work, "other")
    transformers.AutoModelForCausalLM.from_config(other).save_pretrained(other_dir, safe_serialization=True)
    data = os.path.join(work, "d.jsonl")
    with open(data, "w") as f:
        f.write('{"text": "hello there"}\n' * 8)

    def train(base, adapter_dir):
        return subprocess.run([SNUG, "train", "--base_model", base, "--dataset", data, "--tokenizer",
                               os.path.join(os.environ.get("SNUG_SOURCE_DIR", "."), "assets/tokenizer"),
                               "--adapter", "lora", "--lora_model_dir", adapter_dir, "--max_steps", "1",
                               "--sequence_len", "16", "--output_dir", os.path.join(work, "o"),
                               "--overwrite_output_dir", "true", "--sample_tokens", "0"],
                              capture_output=True, text=True)

    r = train(other_dir, ad_dir)
    check(r.returncode == 2 and "shape" in r.stderr and "q_proj.lora_A" in r.stderr,
          f"an adapter for another base: rc {r.returncode}: {r.stderr.strip()[-300:]}")
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    j = json.load(open(os.path.join(ad_dir, "adapter_config.json")))
    for k, v, word in (("target_modules", ["query_key_value"], "query_key_value"), ("lora_bias", True, "lora_bias"),
                       ("peft_type", "IA3", "peft_type"), ("layers_to_transform", ["x"], "layers_to_transform"),
                       ("layers_to_transform", [0, 300], "layers_to_transform"),
                       ("layers_to_transform", [0, 9], "layers_to_transform names layer 9"),
                       ("layers_pattern", "blocks", "layers_pattern")):
        json.dump({**j, k: v}, open(os.path.join(bad, "adapter_config.json"), "w"))
        os.system(f"cp {ad_dir}/adapter_model.safetensors {bad}/")
        r = train(base_dir, bad)
        check(r.returncode == 2 and word in r.stderr and "adapter_config.json" in r.stderr,
              f"adapter_config.json with {k}={v}: rc {r.returncode}: {r.stderr.strip()[-300:]}")
    # use_dora on an adapter saved without magnitudes: the missing tensor named; a magnitude of the wrong shape, and
    # magnitudes in an adapter whose config says nothing of DoRA, likewise
    json.dump({**j, "use_dora": True}, open(os.path.join(bad, "adapter_config.json"), "w"))
    r = train(base_dir, bad)
    check(r.returncode == 2 and "lora_magnitude_vector" in r.stderr and "adapter_model.safetensors" in r.stderr,
          f"use_dora without magnitudes: rc {r.returncode}: {r.stderr.strip()[-300:]}")
    from safetensors.torch import load_file, save_file
    sd = load_file(os.path.join(ad_dir, "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"
    for what, extra, cfg_dora, word in (("a magnitude of the wrong shape", torch.ones(5), True, "shape"),
                                        ("magnitudes without use_dora", torch.ones(64), False, "magnitude")):
        save_file({**sd, key: extra, key.replace("layers.0", "layers.1"): torch.ones(64)},
                  os.path.join(bad, "adapter_model.safetensors"), metadata={"format": "pt"})
        json.dump({**j, "use_dora": cfg_dora}, open(os.path.join(bad, "adapter_config.json"), "w"))
        r = train(base_dir, bad)
        check(r.returncode == 2 and "lora_magnitude_vector" in r.stderr and word in r.stderr,
              f"{what}: rc {r.returncode}: {r.stderr.strip()[-300:]}")
    finish("test_lora_parity")


if __name__ == "__main__":
    main()
