"""snug against PyTorch/transformers in fp32: logits, loss and every parameter gradient of small random models
(Llama with GQA, tied and untied; Llama-3 rope scaling; Qwen2 biases; GPT-2; Mistral's and Qwen2's sliding
windows), 10 AdamW steps with clipping and
weight decay against torch.optim.AdamW, and a model saved by snug loaded back by transformers."""
import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from common import aligned_labels, check, finish, relerr, snug_parity  # noqa: E402

torch.manual_seed(0)
TOL = 1e-4


def models():
    base = dict(vocab_size=101, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
    yield "llama-gqa-untied", transformers.LlamaConfig(**base, tie_word_embeddings=False)
    yield "llama-gqa-tied", transformers.LlamaConfig(**base, tie_word_embeddings=True)
    yield "llama3-rope", transformers.LlamaConfig(
        **{**base, "num_key_value_heads": 1}, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})
    yield "qwen2-bias", transformers.Qwen2Config(**base, tie_word_embeddings=False)
    # sliding windows shorter than the 13 tokens: Mistral's on every layer, Qwen2's on the layers from
    # max_window_layers on (transformers' mask keeps key s for query t when t - s < sliding_window)
    yield "mistral-swa", transformers.MistralConfig(**base, sliding_window=5, tie_word_embeddings=False)
    yield "qwen2-swa", transformers.Qwen2Config(**{**base, "num_hidden_layers": 3}, use_sliding_window=True,
                                                sliding_window=4, max_window_layers=1, tie_word_embeddings=True)
    yield "gpt2", transformers.GPT2Config(vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def build(cfg):
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so their gradients are tested for real
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    return model


def hf_name(model, name):
    return name


def main():
    for tag, cfg in models():
        model = build(cfg)
        d = tempfile.mkdtemp()
        model.save_pretrained(d, safe_serialization=True)
        B, T = 2, 13
        V = cfg.vocab_size
        ids = torch.randint(0, V, (B, T))
        hf_labels = ids.clone()
        hf_labels[0, 3:6] = -100  # some unsupervised positions
        labels = aligned_labels(hf_labels)

        out = model(input_ids=ids, labels=hf_labels)
        out.loss.backward()
        got = snug_parity(d, ids, labels)
        e_logits = relerr(got["logits"], out.logits.detach())
        e_loss = abs(got["loss"].item() - out.loss.item()) / abs(out.loss.item())
        check(e_logits < TOL, f"{tag}: logits relerr {e_logits:.2e}")
        check(e_loss < TOL, f"{tag}: loss relerr {e_loss:.2e}")
        worst, worst_name = 0.0, ""
        sd = dict(model.named_parameters())
        nchecked = 0
        for name, p in sd.items():
            key = "grad." + name
            if key not in got:
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue
                check(False, f"{tag}: snug has no gradient for {name}")
                continue
            e = relerr(got[key], p.grad)
            nchecked += 1
            if e > worst:
                worst, worst_name = e, name
            check(e < TOL, f"{tag}: grad {name} relerr {e:.2e}")
        print(f"{tag}: logits {e_logits:.1e}, loss {e_loss:.1e}, worst grad {worst:.1e} ({worst_name}), "
              f"{nchecked} gradients")

        # 10 AdamW steps on the same batch: clipping (the norm is far above 0.5) and decoupled weight decay on
        # matrices only, as snug does (norms, biases and other 1-D tensors get none). Adam turns any gradient
        # element far above eps into a step of about lr whatever its size, so elements whose gradient is at the
        # level of fp32 rounding (1e-7 of the largest) would step in a direction set by rounding; eps = 1e-6 keeps
        # those steps proportional to the gradient, which makes the comparison a test of snug and not of rounding.
        steps, lr, wd, clip, eps = 10, 1e-3, 0.1, 0.5, 1e-6
        model.zero_grad()
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=lr, betas=(0.9, 0.999), eps=eps, foreach=False)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = model(input_ids=ids, labels=hf_labels).loss
            losses.append(loss.item())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        save_dir = tempfile.mkdtemp()
        got = snug_parity(d, ids, labels, "--steps", str(steps), "--lr", str(lr), "--weight_decay", str(wd),
                          "--max_grad_norm", str(clip), "--adam_epsilon", str(eps), "--save", save_dir)
        worst = 0.0
        for name, p in model.named_parameters():
            key = "param." + name
            if key not in got:
                continue
            e = relerr(got[key], p.detach())
            worst = max(worst, e)
            check(e < TOL, f"{tag}: after {steps} AdamW steps, {name} relerr {e:.2e}")
        hist = got["loss_history"][:steps]
        e_hist = max(abs(a - b) / abs(b) for a, b in zip(hist.tolist(), losses))
        check(e_hist < TOL, f"{tag}: loss history relerr {e_hist:.2e}")
        print(f"{tag}: after {steps} AdamW steps worst param relerr {worst:.1e}, loss history {e_hist:.1e}")

        # the folder snug wrote loads in transformers unchanged and gives the same logits
        loaded = transformers.AutoModelForCausalLM.from_pretrained(save_dir, attn_implementation="eager").float()
        loaded.eval()
        with torch.no_grad():
            ref = model(input_ids=ids).logits
            mine = loaded(input_ids=ids).logits
        e_saved = relerr(mine, ref)
        check(e_saved < TOL, f"{tag}: model saved by snug, logits in transformers relerr {e_saved:.2e}")
        print(f"{tag}: saved by snug and reloaded by transformers: logits relerr {e_saved:.1e}")
    finish("test_model_parity")


if __name__ == "__main__":
    main()
