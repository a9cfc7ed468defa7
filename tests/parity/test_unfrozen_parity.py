"""unfrozen_parameters against PyTorch, frozen as Axolotl's freeze_layers_except freezes: every tensor a pattern does
not match loses requires_grad (no optimizer state, no update), and a pattern's "[a:b]" range keeps the gradient of
those rows of the tensor's first dimension only (a hook zeroes the rest; the tensor stays in the optimizer, so weight
decay still reaches every row). Small random Llama (untied head) and GPT-2 (tied head, a range over the tied
embedding), 6 AdamW steps with weight decay and clipping: the gradients and parameters against a float64 reference,
within four times the distance of PyTorch's own fp32 run from it; frozen tensors bitwise unchanged, their gradients
and those of the rows outside a range exactly zero."""
import os
import re
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from common import aligned_labels, check, finish, rel_max, snug_parity  # noqa: E402

torch.manual_seed(0)


def axolotl_freeze(model, patterns):
    """requires_grad and row hooks as freeze_layers_except sets them (a pattern: '.' literal, matched at the name's
    start; an optional [a:b] / [a] / [a:] / [:b] at its end)."""
    parsed = []
    for p in patterns:
        m = re.match(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$", p)
        rng = None
        if m:
            p, a, b = m.groups()
            rng = (int(a), int(a) + 1) if b is None and a.isdecimal() else (int(a) if a else 0, int(b) if b else None)
        parsed.append((re.compile(p.replace(".", "\\.")), rng))
    for name, param in model.named_parameters():
        hits = [rng for rx, rng in parsed if rx.match(name)]
        param.requires_grad = bool(hits)
        ranges = [(a, len(param) if b is None else b) for a, b in (r for r in hits if r is not None)]
        if ranges:
            keep = torch.zeros(len(param), dtype=torch.bool)
            for a, b in ranges:
                keep[a:b] = True
            param.register_hook(lambda g, keep=keep: g * keep.view(-1, *([1] * (g.ndim - 1))).to(g.dtype))
    return {n: rngs for n, rngs in ((n, [r for rx, r in parsed if rx.match(n)]) for n, _ in model.named_parameters())}


def train(model, ids, hf_labels, steps, lr, wd, clip, eps):
    """steps AdamW steps (decay on matrices only, as snug and transformers' Trainer), clipped; the first step's
    gradients and the losses."""
    ps = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in ps if p.ndim >= 2], "weight_decay": wd},
                             {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=eps, foreach=False)
    grads0, losses = None, []
    for s in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=hf_labels).loss
        losses.append(loss.item())
        loss.backward()
        if s == 0:
            grads0 = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        torch.nn.utils.clip_grad_norm_(ps, clip)
        opt.step()
    return grads0, losses


def cases():
    llama = transformers.LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     rms_norm_eps=1e-5, tie_word_embeddings=False)
    # q alone of the fused q/k/v, all of one MLP, one norm, rows of the embedding and of the final norm; the head,
    # the other attention and MLP tensors frozen
    yield "llama", llama, ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp", "model.layers.1.input_layernorm",
                           "^model.embed_tokens.weight$[10:40]", "model.norm.weight[5:20]",
                           "model.norm.weight[50:]"]
    gpt2 = transformers.GPT2Config(vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0)
    # the tied embedding's rows (the head's gradient of them too), one block whole, a bias
    yield "gpt2", gpt2, ["transformer.wte.weight[3]", "transformer.wte.weight[60:90]", "transformer.h.1.",
                         "transformer.h.0.mlp.c_fc.bias"]


def main():
    steps, lr, wd, clip, eps = 6, 1e-3, 0.1, 0.5, 1e-6
    for tag, cfg, patterns in cases():
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 1:
                    p.add_(0.1 * torch.randn_like(p))
        model.eval()
        d = tempfile.mkdtemp()
        model.save_pretrained(d, safe_serialization=True)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        B, T = 2, 13
        ids = torch.randint(0, cfg.vocab_size, (B, T))
        hf_labels = ids.clone()
        hf_labels[0, 3:6] = -100
        labels = aligned_labels(hf_labels)

        ref = {}
        for dt in (torch.float64, torch.float32):
            m = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").to(dt)
            m.eval()
            hits = axolotl_freeze(m, patterns)
            g0, losses = train(m, ids, hf_labels, steps, lr, wd, clip, eps)
            ref[dt] = (g0, losses, {n: p.detach().clone() for n, p in m.named_parameters()})
        args = ["--steps", str(steps), "--lr", str(lr), "--weight_decay", str(wd), "--max_grad_norm", str(clip),
                "--adam_epsilon", str(eps)]
        for p in patterns:
            args += ["--unfrozen", p]
        got = snug_parity(d, ids, labels, *args)

        (g64, l64, p64), (g32, l32, p32) = ref[torch.float64], ref[torch.float32]
        worst, worst_floor, nfrozen = 0.0, 0.0, 0
        for name, p0 in init.items():
            if "param." + name not in got:  # a tied head is the embedding
                continue
            mine, mine_g = got["param." + name], got["grad." + name]
            if not hits[name]:  # frozen: bitwise unchanged, no gradient at all
                nfrozen += 1
                check(torch.equal(mine, p0), f"{tag}: frozen {name} changed")
                check(not mine_g.any(), f"{tag}: frozen {name} has a gradient")
                continue
            for what, a, ref64, ref32 in (("grad", mine_g, g64[name], g32[name]), ("param", mine, p64[name],
                                                                                    p32[name])):
                floor, err = rel_max(ref32, ref64), rel_max(a, ref64)
                worst, worst_floor = max(worst, err), max(worst_floor, floor)
                check(err <= max(4 * floor, 1e-5), f"{tag}: {what} {name} relerr {err:.2e}, fp32 torch's {floor:.2e}")
            ranged = [r for r in hits[name] if r is not None]
            if ranged and None not in hits[name]:  # outside the ranges: exactly no gradient
                keep = torch.zeros(len(p0), dtype=torch.bool)
                for a, b in ranged:
                    keep[a:(len(p0) if b is None else b)] = True
                check(not mine_g[~keep].any() and mine_g[keep].any(),
                      f"{tag}: {name}: gradient outside its ranges, or none inside")
        e_hist = max(abs(a - b) / abs(b) for a, b in zip(got["loss_history"][:steps].tolist(), l64))
        floor = max(abs(a - b) / abs(b) for a, b in zip(l32, l64))
        check(e_hist <= max(4 * floor, 1e-6), f"{tag}: loss history relerr {e_hist:.2e}, fp32 torch's {floor:.2e}")
        check(nfrozen > 0, f"{tag}: no tensor was frozen")
        print(f"{tag}: {nfrozen} tensors frozen and bitwise unchanged; trained ones after {steps} steps within "
              f"{worst:.1e} of float64 (fp32 torch {worst_floor:.1e}); loss history {e_hist:.1e}")
    finish("test_unfrozen_parity")


if __name__ == "__main__":
    main()
