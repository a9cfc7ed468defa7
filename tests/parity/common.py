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
