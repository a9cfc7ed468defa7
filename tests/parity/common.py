"""Shared helpers of the parity tests: the snug binary, small random Hugging Face models, comparisons."""
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


def finish(name: str) -> None:
    print(f"{name}: {passes[0]} passed, {len(failures)} failed")
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
