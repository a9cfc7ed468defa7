"""Shared helpers of the parity tests: the snug binary, small random Hugging Face models, comparisons."""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

SNUG = os.environ.get("SNUG_BIN", "build/snug")
failures = []
passes = [0]


def check(ok: bool, what: str) -> None:
    if ok:
        passes[0] += 1
    else:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


# The small bf16 Llama the quantized-base tests (QLoRA, the 8-bit base) adapt, and every linear module of its blocks
QUANT_LLAMA = dict(vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference over the largest magnitude of the reference b (1e-30 when b is all zero)."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / (b.abs().max() + 1e-30)).item()


def adamw_curve(model, ids: torch.Tensor, hf_labels: torch.Tensor, steps: int, lr: float) -> list:
    """The losses of steps + 1 forwards with an AdamW step (no weight decay) after each but the last, over the
    parameters that require gradients: the reference curve of `snug parity --steps`."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    hist = []
    for _ in range(steps + 1):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=hf_labels).loss
        hist.append(loss.item())
        loss.backward()
        opt.step()
    return hist


def curve_near(tag: str, mine: list, ref32: list, ref16: list) -> None:
    """snug's loss curve learns (falls by 0.05) and stays as close to the fp32 reference's as the peer's 16-bit run
    does, times four (at least 1e-3)."""
    gap = lambda xs: max(abs(a - b) / abs(b) for a, b in zip(xs, ref32))  # noqa: E731
    floor, dev = gap(ref16), gap(mine)
    check(mine[-1] < mine[0] - 0.05 and dev <= max(4 * floor, 1e-3),
          f"{tag}: snug {['%.4f' % x for x in mine]} fp32 reference {['%.4f' % x for x in ref32]} "
          f"16-bit {['%.4f' % x for x in ref16]}")
    print(f"  {tag}: loss {mine[0]:.4f} -> {mine[-1]:.4f} (fp32 reference {ref32[0]:.4f} -> {ref32[-1]:.4f}); "
          f"largest gap to it {dev:.1e}, the 16-bit run's {floor:.1e}")


def grads_near(tag: str, got: dict, ref32: dict, ref16: dict) -> tuple:
    """Each gradient of ref32 (name -> tensor, the fp32 reference) has snug's ("grad." + name in got) within four
    times the distance of ref16's (the peer's 16-bit run) from the reference (at least 1e-3), checked one by one.
    Returns (worst snug distance, worst peer distance, how many were compared)."""
    worst, worst_floor, n = 0.0, 0.0, 0
    for name, g in ref32.items():
        if "grad." + name not in got:
            check(False, f"{tag}: snug has no gradient for {name}")
            continue
        floor, err = rel_max(ref16[name], g), rel_max(got["grad." + name], g)
        worst, worst_floor, n = max(worst, err), max(worst_floor, floor), n + 1
        check(err <= max(4 * floor, 1e-3), f"{tag}: grad {name} relerr {err:.2e}, the 16-bit run's {floor:.2e}")
    return worst, worst_floor, n


def relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest magnitude of the reference b."""
    a, b = a.double(), b.double()
    scale = b.abs().max().item() or 1e-30
    return (a - b).abs().max().item() / scale


def run_snug(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SNUG, *args], capture_output=True, text=True)


def snug_parity(model_dir: str, ids: torch.Tensor, labels: torch.Tensor, *extra: str) -> dict:
    """Runs `snug parity` on a batch. labels are aligned with the inputs (labels[t] is what position t predicts)."""
    work = tempfile.mkdtemp()
    inp, out = os.path.join(work, "in.safetensors"), os.path.join(work, "out.safetensors")
    save_file({"input_ids": ids.to(torch.int32).contiguous(), "labels": labels.to(torch.int32).contiguous()}, inp)
    r = run_snug("parity", model_dir, inp, out, *extra)
    if r.returncode != 0:
        raise RuntimeError(f"snug parity failed ({r.returncode}): {r.stderr}")
    return load_file(out)


def aligned_labels(hf_labels: torch.Tensor) -> torch.Tensor:
    """transformers shifts labels inside the model; snug takes them already aligned with the inputs."""
    out = torch.full_like(hf_labels, -100)
    out[:, :-1] = hf_labels[:, 1:]
    return out


def bits(x: float) -> int:
    """A double's 64 bits, as an unsigned integer."""
    return torch.tensor([x], dtype=torch.float64).view(torch.int64).item() & 0xFFFFFFFFFFFFFFFF


def tiny_train(work: str, name: str, yaml_text: str, root: str) -> tuple:
    """A tiny `snug train` run in work/name: the built-in model on 96 short completion examples, 2 rows of 32 tokens
    per step, every step logged, with yaml_text (max_steps, the schedule, ...) added to its config. (0, the rows of
    its metrics.jsonl), or (its exit status, its stderr)."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    data = os.path.join(work, "data.jsonl")
    if not os.path.exists(data):
        with open(data, "w") as f:
            for i in range(96):
                f.write(json.dumps({"text": f"example {i} " + "words and more words " * (i % 5 + 1)}) + "\n")
    cfg = os.path.join(d, "run.yaml")
    with open(cfg, "w") as f:
        f.write(f"datasets:\n  - path: {data}\n    type: completion\n"
                f"tokenizer: {os.path.join(root, 'assets/tokenizer')}\n"
                "sequence_len: 32\nmicro_batch_size: 2\nlogging_steps: 1\nsample_tokens: 0\n"
                f"output_dir: {os.path.join(d, 'out')}\ndataset_prepared_path: {os.path.join(work, 'prep')}\n" + yaml_text)
    r = run_snug("train", cfg)
    if r.returncode:
        return r.returncode, r.stderr
    return 0, [json.loads(line) for line in open(os.path.join(d, "out", "metrics.jsonl"))]


def finish(name: str) -> None:
    """The summary line and the exit status: 1 when a check failed or when none was made."""
    print(f"{name}: {passes[0]} passed, {len(failures)} failed")
    if not passes[0] and not failures:
        print(f"FAIL: {name} made no checks", file=sys.stderr)
        sys.exit(1)
    sys.exit(1 if failures else 0)


def bnb_generic_cpu() -> str:
    """bitsandbytes' generic CPU arithmetic as the reference for 4-bit dequantization and Linear4bit.

    On CPUs with AVX-512 its native dequantize_4bit kernel is not its own arithmetic (measured on an AMD Zen 4,
    bitsandbytes 0.50.2: at blocksize 128 nearly every value differs from code[q] * absmax and lies up to 4x further
    from the weight; FP4 differs in a fraction of values at blocksize 64), and with AVX512-BF16 Linear4bit repacks its
    weight for a native GEMM at inference, which fails on some shapes. The generic implementation, which bitsandbytes
    itself uses as its fallback and on other CPUs, is the format's definition, so the tests compare against it:
    dequantize_4bit's CPU kernel is re-registered to it and the repacking turned off. Returns a line saying what was
    changed (and how far the native kernel is from it here), or "" when bitsandbytes has no such paths."""
    notes = []
    try:
        import bitsandbytes.functional as F
        from bitsandbytes.backends.default import ops as generic
        from bitsandbytes.backends.utils import _get_4bit_code
        native = torch.ops.bitsandbytes.dequantize_4bit.default
    except (ImportError, AttributeError):
        return ""
    if not hasattr(generic, "_dequantize_4bit_compute"):
        return ""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 576, generator=g)
    q, st = F.quantize_4bit(w, blocksize=128, quant_type="nf4", compress_statistics=False)
    before = native(q, st.absmax, 128, "nf4", w.shape, torch.float32)

    def dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype):
        A = A if A.dtype == torch.uint8 else A.view(torch.uint8)
        code = _get_4bit_code(quant_type, A.device)
        return generic._dequantize_4bit_compute(A.reshape(-1), absmax, code, blocksize, shape, dtype)

    lib = torch.library.Library("bitsandbytes", "IMPL")
    lib.impl("dequantize_4bit", dequantize_4bit, "CPU")
    bnb_generic_cpu.lib = lib  # registered for as long as the process lives
    after = torch.ops.bitsandbytes.dequantize_4bit.default(q, st.absmax, 128, "nf4", w.shape, torch.float32)
    notes.append(f"dequantize_4bit: the generic arithmetic (the native CPU kernel differed in "
                 f"{int((before != after).sum())} of {after.numel()} values at blocksize 128)")
    try:
        import bitsandbytes.nn.modules as modules
        if hasattr(modules, "has_avx512bf16"):
            modules.has_avx512bf16 = lambda: False
            notes.append("Linear4bit: no repacking for the native AVX512-BF16 GEMM")
    except ImportError:
        pass
    return "bitsandbytes' generic CPU path: " + "; ".join(notes)
