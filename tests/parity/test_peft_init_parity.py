"""Adapters PEFT made with settings that change what the adapter means, read as PEFT reads them: PiSSA and OLoRA
adapters saved unconverted (init_lora_weights "pissa"/"olora": the saved A and B sit on the base less the initial
pair, which PEFT derives again from the base at load) and an adapter made with exclude_modules (a list, and a regular
expression), each merged by `snug merge` against PeftModel.from_pretrained(...).merge_and_unload(): every tensor,
and the logits of the merged folder against PEFT's adapted model. Then the keys snug cannot honour are refused by
name (pissa_niter_K, corda, loftq, layer_replication, alora_invocation_tokens, an exclusion that leaves different
modules on different layers). Last, training from a PiSSA adapter (lora_model_dir): its first loss is that of a
full fine-tune of snug's merge, the adapter it saves is PiSSA's still and PEFT merges it as snug does, a run resumed
half-way derives the residual base again (the same losses), and `snug generate --adapter` gives the merged model's
greedy text.

Tolerance: the SVD and QR of snug's LAPACK and torch's differ by rounding; the noise floor is measured here as the
difference between torch's residual in fp32 and in fp64, and each merged tensor must be within 10 times it (at least
1e-6 of the tensor's largest magnitude). Tensors no adapter touches must be bit-identical."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
from common import SNUG, check, finish, rel_max  # noqa: E402

import peft  # noqa: E402

LLAMA = dict(vocab_size=101, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_model(work, vocab_size=LLAMA["vocab_size"], name="base", dtype=torch.float32):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(**{**LLAMA, "vocab_size": vocab_size})
    base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(dtype)
    bdir = os.path.join(work, name)
    base.save_pretrained(bdir, safe_serialization=True)
    return bdir


def load_base(bdir):
    """The base as from_pretrained loads it by default: in the dtype it was saved in."""
    return transformers.AutoModelForCausalLM.from_pretrained(bdir, dtype="auto", attn_implementation="eager")


def make_adapter(bdir, out, lcfg, seed=2):
    """A PEFT adapter made with lcfg on the base, its A and B then moved (as training would), saved unconverted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = peft.get_peft_model(load_base(bdir), peft.LoraConfig(lora_dropout=0.0, **lcfg))
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_" in n:
                p.add_(0.05 * torch.randn_like(p))
    m.save_pretrained(out)
    return out


def pissa_noise(bdir, r, scale):
    """How far torch's fp32 PiSSA residual of each adapted weight is from the same in fp64: the rounding the SVD
    brings, relative to the weight's largest magnitude."""
    worst = 0.0
    for k, w in load_file(os.path.join(bdir, "model.safetensors")).items():
        if not any(m in k for m in ("proj.weight", "c_attn.weight", "c_fc.weight")):
            continue
        res = {}
        for dt in (torch.float32, torch.float64):
            V, S, Uh = torch.linalg.svd(w.to(dt), full_matrices=False)
            Sr = S[:r] / scale
            res[dt] = w.to(dt) - scale * (V[:, :r] @ torch.diag(Sr.sqrt())) @ (torch.diag(Sr.sqrt()) @ Uh[:r])
        worst = max(worst, rel_max(res[torch.float32], res[torch.float64]))
    return worst


def merged_against_peft(tag, bdir, adir, work, floor):
    with open(os.path.join(bdir, "config.json")) as f:
        cfg = json.load(f)
    vocab = cfg["vocab_size"]
    out = os.path.join(work, f"merged-{tag}")
    r = subprocess.run([SNUG, "merge", bdir, adir, out], capture_output=True, text=True)
    check(r.returncode == 0, f"{tag}: snug merge failed: {r.stderr.strip()[-400:]}")
    if r.returncode:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.PeftModel.from_pretrained(load_base(bdir), adir)
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref_logits = pm(input_ids=ids).logits
    ref = {k: v.detach() for k, v in pm.merge_and_unload().state_dict().items()}
    got = load_file(os.path.join(out, "model.safetensors"))
    base = load_file(os.path.join(bdir, "model.safetensors"))
    tol = max(1e-6, 10 * floor)
    bf16 = cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    if bf16:  # the residual rounded to bf16 as PEFT rounds it, then the merge: a value whose residual lies within the
        tol = 2.0 ** -8  # SVD's noise of a rounding boundary rounds the other way (one bf16 step of the residual)
    worst, same, touched = 0.0, 0, 0
    for k, v in ref.items():
        if k not in got:
            check(k == "lm_head.weight" and cfg.get("tie_word_embeddings", True), f"{tag}: merged folder has no {k}")
            continue
        if torch.equal(v, base[k]):  # untouched by PEFT: snug must leave it bit for bit
            check(torch.equal(got[k], v), f"{tag}: {k} is not the base's, and PEFT leaves it as it is")
            same += 1
            continue
        touched += 1
        e = rel_max(got[k], v)
        worst = max(worst, e)
        check(e <= tol, f"{tag}: merged {k} relerr {e:.2e} against merge_and_unload (tolerance {tol:.1e})")
        if bf16:
            n = (got[k] != v).sum().item()
            check(n <= 0.005 * v.numel(), f"{tag}: merged {k} has {n} of {v.numel()} values off PEFT's")
    if bf16:
        print(f"  {tag:<16} {touched} merged tensors within {worst:.1e} (one bf16 step: {tol:.1e}), {same} untouched "
              f"identical")
        return worst
    mm = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        e = rel_max(mm(input_ids=ids).logits, ref_logits)
    check(e <= max(1e-5, 10 * floor), f"{tag}: logits of snug's merge relerr {e:.2e} against PEFT's adapted model")
    print(f"  {tag:<16} {touched} merged tensors within {worst:.1e} (tolerance {tol:.1e}), {same} untouched "
          f"identical; logits relerr {e:.1e}")
    return worst


def refused(tag, bdir, adir, work, *words, flags=()):
    out = os.path.join(work, f"refused-{tag}")
    r = subprocess.run([SNUG, "merge", bdir, adir, out, *flags], capture_output=True, text=True)
    msg = r.stderr.strip()
    check(r.returncode == 2 and all(w in msg for w in words) and "adapter_config.json" in msg,
          f"{tag}: want exit 2 naming {words}, got {r.returncode}: {msg[-300:]}")
    print(f"  {tag:<16} refused: {msg.splitlines()[-1][:150] if msg else '(nothing)'}")


def edit_config(src, dst, **keys):
    """A copy of adapter src with adapter_config.json's keys set (a key PEFT writes for a feature it made)."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
            b.write(a.read())
    p = os.path.join(dst, "adapter_config.json")
    with open(p) as f:
        c = json.load(f)
    c.update(keys)
    with open(p, "w") as f:
        json.dump(c, f)
    return dst


def snug_train(out, *args):
    """snug train on a few fortunes with the test tokenizer, the step losses from metrics.jsonl (and the log)."""
    src = os.environ.get("SNUG_SOURCE_DIR", "..")
    data = os.path.join(os.path.dirname(out), "data.jsonl")
    if not os.path.exists(data):
        with open(os.path.join(src, "data", "fortunes.jsonl")) as f, open(data, "w") as g:
            g.writelines(f.readlines()[:64])
    cmd = [SNUG, "train", "--dataset", data, "--tokenizer", os.path.join(src, "assets", "tokenizer"),
           "--sequence_len", "32", "--micro_batch_size", "2", "--sample_tokens", "0", "--logging_steps", "1",
           "--val_set_size", "0", "--lr_scheduler", "constant", "--learning_rate", "1e-3", "--max_steps", "4",
           "--dataset_prepared_path", out + ".prep", "--output_dir", out, *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return None, r.stdout + r.stderr
    with open(os.path.join(out, "metrics.jsonl")) as f:
        losses = [json.loads(line)["loss"] for line in f if '"loss"' in line]
    return losses, r.stdout


def training_from(work):
    """Training from a PiSSA adapter (lora_model_dir) sees PEFT's model: its first loss is that of a full fine-tune of
    snug's merge (within fp32 rounding); it saves the adapter as PiSSA's still (PEFT reloads it the same); a resumed
    run derives the residual base again (its losses those of the run without a stop); `snug generate --adapter`
    gives the merged model's greedy text."""
    bdir = base_model(work, vocab_size=2048, name="base2k")
    tok = os.path.join(os.environ.get("SNUG_SOURCE_DIR", ".."), "assets", "tokenizer")
    for f in os.listdir(tok):  # the tokenizer beside the base, as a published model has it (merge copies it on)
        shutil.copy(os.path.join(tok, f), bdir)
    pissa = make_adapter(bdir, os.path.join(work, "pissa2k"), dict(r=4, lora_alpha=8, target_modules=ALL7,
                                                                    init_lora_weights="pissa"))
    merged = os.path.join(work, "merged2k")
    r = subprocess.run([SNUG, "merge", bdir, pissa, merged], capture_output=True, text=True)
    check(r.returncode == 0, f"merge2k: {r.stderr[-300:]}")
    lora = ["--base_model", bdir, "--adapter", "lora", "--lora_model_dir", pissa]
    got, log = snug_train(os.path.join(work, "t-lora"), *lora)
    ref, _ = snug_train(os.path.join(work, "t-full"), "--base_model", merged, "--learning_rate", "1e-30")
    if got is None or ref is None:
        check(False, f"train from pissa: {log[-400:]}")
        return
    e = abs(got[0] - ref[0]) / abs(ref[0])
    check(e < 1e-5, f"train from pissa: first loss {got[0]:.6f}, the merged model's {ref[0]:.6f}")
    check("its base less the initial pair of PiSSA" in log, "train from pissa: the header does not say PiSSA")
    with open(os.path.join(work, "t-lora", "adapter_config.json")) as f:
        check(json.load(f).get("init_lora_weights") == "pissa", "train from pissa: saved without init_lora_weights")
    print(f"  train from pissa: first loss {got[0]:.6f}, a full run on snug's merge {ref[0]:.6f} (relerr {e:.1e})")
    # the frozen base in host memory (offload_params) and in bf16: the residual derived there too
    off, log = snug_train(os.path.join(work, "t-off"), *lora, "--offload_params", "true")
    check(off == got, f"train from pissa, offload_params: losses {off} against {got}: {log[-300:]}")
    # in bf16 within a tenth of what the residual changes (the same A and B on the base as it is)
    b16, log = snug_train(os.path.join(work, "t-bf16"), *lora, "--bf16", "true")
    plain = edit_config(pissa, os.path.join(work, "pissa2k-plain"), init_lora_weights=True)
    wrong, _ = snug_train(os.path.join(work, "t-plain"), "--base_model", bdir, "--adapter", "lora", "--lora_model_dir",
                          plain)
    check(b16 is not None and wrong is not None and abs(b16[0] - got[0]) < 0.1 * abs(wrong[0] - got[0]),
          f"train from pissa, bf16: first loss {b16 and b16[0]} against fp32 {got[0]} (on the base as it is: "
          f"{wrong and wrong[0]}): {log[-300:]}")
    print(f"  offload_params: the same losses; bf16: first loss {b16[0] if b16 else 0:.6f} (fp32 {got[0]:.6f}; the "
          f"adapter on the base as it is: {wrong[0] if wrong else 0:.6f})")
    # the trained adapter, as PEFT reads it, against snug's merge of it
    merged_against_peft("pissa-trained", bdir, os.path.join(work, "t-lora"), work, pissa_noise(bdir, 4, 2.0))
    # resumed from step 2: the same losses
    out = os.path.join(work, "t-resume")
    snug_train(out, *lora, "--save_steps", "2")
    for c in os.listdir(out):
        if c.startswith("checkpoint-") and c != "checkpoint-2":
            subprocess.run(["rm", "-rf", os.path.join(out, c)])
    os.remove(os.path.join(out, "adapter_model.safetensors"))
    res, log = snug_train(out, *lora, "--save_steps", "2", "--resume_from_checkpoint", "latest")
    check(res is not None and "resumed from" in log and res[-2:] == got[-2:],
          f"resume from pissa: losses {res} against {got}: {log[-300:] if res is None else ''}")
    print(f"  resumed at step 2: steps 3, 4 losses {res[-2:] if res else None} (without a stop {got[-2:]})")
    # generate: the adapter on the base as the merged model
    gen = [[SNUG, "generate", bdir, "--adapter", pissa], [SNUG, "generate", merged]]
    texts = [subprocess.run(g + ["--prompt", "The", "--max_new_tokens", "8", "--temperature", "0"],
                            capture_output=True, text=True) for g in gen]
    check(texts[0].returncode == 0 and texts[0].stdout == texts[1].stdout,
          f"generate --adapter pissa: {texts[0].stdout!r} {texts[0].stderr[-200:]} against merged {texts[1].stdout!r}")
    print(f"  generate --adapter: {texts[0].stdout.strip()!r}, the merged model's the same")


def main():
    with tempfile.TemporaryDirectory() as work:
        bdir = base_model(work)
        r, alpha = 4, 8
        floor = pissa_noise(bdir, r, alpha / r)
        print(f"  noise floor: torch's fp32 PiSSA residual against fp64, {floor:.1e}")
        # PiSSA and OLoRA, every module, and PiSSA with rsLoRA on a few (another scale)
        pissa = make_adapter(bdir, os.path.join(work, "pissa"), dict(r=r, lora_alpha=alpha, target_modules=ALL7,
                                                                      init_lora_weights="pissa"))
        with open(os.path.join(pissa, "adapter_config.json")) as f:
            check(json.load(f)["init_lora_weights"] == "pissa", "pissa: PEFT saved it converted")
        merged_against_peft("pissa", bdir, pissa, work, floor)
        merged_against_peft("pissa-rslora", bdir, make_adapter(
            bdir, os.path.join(work, "pissa-rs"), dict(r=8, lora_alpha=6, use_rslora=True, init_lora_weights="pissa",
                                                       target_modules=["q_proj", "v_proj", "down_proj"])), work, floor)
        merged_against_peft("olora", bdir, make_adapter(
            bdir, os.path.join(work, "olora"), dict(r=r, lora_alpha=alpha, target_modules=ALL7,
                                                    init_lora_weights="olora")), work, floor)
        # DoRA on a PiSSA base: the magnitudes against the residual's norms; and a bf16 base (the residual in bf16)
        merged_against_peft("pissa-dora", bdir, make_adapter(
            bdir, os.path.join(work, "pissa-dora"), dict(r=r, lora_alpha=alpha, target_modules=ALL7, use_dora=True,
                                                         init_lora_weights="pissa")), work, floor)
        b16 = base_model(work, name="base-bf16", dtype=torch.bfloat16)
        merged_against_peft("pissa-bf16", b16, make_adapter(
            b16, os.path.join(work, "pissa-bf16"), dict(r=r, lora_alpha=alpha, target_modules=ALL7,
                                                        init_lora_weights="pissa")), work, floor)
        # GPT-2's Conv1D modules (PEFT's fan_in_fan_out: the SVD of the transposed weight)
        torch.manual_seed(1)
        gpt2 = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
            vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64), attn_implementation="eager").float()
        g2dir = os.path.join(work, "gpt2")
        gpt2.save_pretrained(g2dir, safe_serialization=True)
        merged_against_peft("gpt2-pissa", g2dir, make_adapter(
            g2dir, os.path.join(work, "g2pissa"), dict(r=r, lora_alpha=alpha, target_modules=["c_attn", "c_proj", "c_fc"],
                                                      init_lora_weights="pissa")), work, pissa_noise(g2dir, r, alpha / r))
        refused("gpt2-olora", g2dir, edit_config(os.path.join(work, "g2pissa"), os.path.join(work, "g2olora"),
                                                 init_lora_weights="olora"), work, "olora", "Conv1D")
        refused("pissa-nf4", bdir, pissa, work, "pissa", "--base_as", flags=("--base_as", "nf4"))
        # plain adapters whatever their init (the base is not changed)
        merged_against_peft("gaussian", bdir, make_adapter(
            bdir, os.path.join(work, "gauss"), dict(r=r, lora_alpha=alpha, target_modules=["q_proj"],
                                                    init_lora_weights="gaussian")), work, 0.0)
        # exclude_modules: a list (PEFT's suffix rule) and a regular expression that leaves out a layer
        merged_against_peft("exclude-list", bdir, make_adapter(
            bdir, os.path.join(work, "excl"), dict(r=r, lora_alpha=alpha, target_modules="all-linear",
                                                   exclude_modules=["k_proj", "mlp.down_proj"])), work, 0.0)
        merged_against_peft("exclude-regex", bdir, make_adapter(
            bdir, os.path.join(work, "exre"), dict(r=r, lora_alpha=alpha, target_modules=ALL7,
                                                   exclude_modules=r"model\.layers\.0\..*")), work, 0.0)
        # what snug cannot honour is refused by name
        uneven = make_adapter(bdir, os.path.join(work, "uneven"), dict(
            r=r, lora_alpha=alpha, target_modules=ALL7, exclude_modules=r".*\.1\.self_attn\.q_proj"))
        refused("exclude-uneven", bdir, uneven, work, "exclude_modules", "layer")
        gauss = os.path.join(work, "gauss")
        for key, val, word in [("init_lora_weights", "pissa_niter_4", "pissa_niter_4"),
                               ("init_lora_weights", "corda", "corda"), ("init_lora_weights", "loftq", "loftq"),
                               ("layer_replication", [[0, 2], [1, 2]], "layer_replication"),
                               ("alora_invocation_tokens", [5, 6], "alora_invocation_tokens"),
                               ("exclude_modules", r"(?=q).*", "exclude_modules")]:
            refused(f"{key[:12]}={val if isinstance(val, str) else 'set'}"[:16], bdir,
                    edit_config(gauss, os.path.join(work, f"bad-{key}-{word}"), **{key: val}), work, key, word)
        training_from(work)
    finish("test_peft_init_parity")


if __name__ == "__main__":
    main()
