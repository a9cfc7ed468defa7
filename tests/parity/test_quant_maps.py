"""The dynamic quantization maps of snug's 8-bit AdamW equal bitsandbytes' create_dynamic_map, element by element.

snug builds the signed map (first moment) and the unsigned map (second moment) on the host (src/core/quant_map.c);
tests/parity/quant_map_driver.c, compiled here with gcc, writes them out. The reference is
bitsandbytes.functional.create_dynamic_map(signed=True/False) from the installed bitsandbytes (pure Python + torch,
importable on a CPU-only machine). Also checks the properties the optimizer relies on: 256 sorted codes, 0 and 1
present, the signed map's most negative code -0.993, and the smallest non-zero magnitudes the paper's tree gives."""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, finish  # noqa: E402

ROOT = os.environ.get("SNUG_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def build_driver(tmp):
    exe = os.path.join(tmp, "quant_map_driver")
    cmd = [os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra",
           "-Wno-unused-parameter", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src"),
           os.path.join(ROOT, "src/core/quant_map.c"), os.path.join(ROOT, "tests/parity/quant_map_driver.c"),
           "-lm", "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def main():
    try:
        from bitsandbytes.functional import create_dynamic_map
    except ImportError as err:  # the venv is made by scripts/venv.sh, which installs bitsandbytes
        print(f"test_quant_maps: cannot import bitsandbytes ({err}); pip install bitsandbytes", file=sys.stderr)
        sys.exit(1)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        out = os.path.join(tmp, "maps.bin")
        subprocess.run([exe, out], check=True)
        maps = np.fromfile(out, dtype="<f4").reshape(2, 256)
    for row, signed in ((0, True), (1, False)):
        name = "signed" if signed else "unsigned"
        ref = create_dynamic_map(signed=signed).numpy().astype(np.float32)
        snug = maps[row]
        diff = np.flatnonzero(snug.view(np.uint32) != ref.view(np.uint32))
        check(diff.size == 0, f"{name} map: {diff.size} of 256 codes differ from bitsandbytes "
                              f"(first at {diff[:1].tolist()}: snug {snug[diff[:1]].tolist()}, "
                              f"bitsandbytes {ref[diff[:1]].tolist()})")
        check(bool(np.all(np.diff(snug) >= 0)), f"{name} map is sorted")
        check(snug[-1] == 1.0 and 0.0 in snug, f"{name} map holds 0 and 1")
        nz = np.abs(snug[snug != 0])
        if signed:
            check(abs(snug[0] + 0.99296875) < 1e-6, f"signed map's most negative code is -0.993 ({snug[0]})")
            check(abs(nz.min() - 5.5e-7) < 1e-12, f"signed map's smallest magnitude is 5.5e-7 ({nz.min()})")
        else:
            check(snug[0] == 0.0, "unsigned map starts at 0")
            check(abs(nz.min() - 3.25e-7) < 1e-12, f"unsigned map's smallest value is 3.25e-7 ({nz.min()})")
        gaps = np.diff(snug.astype(np.float64))
        print(f"{name} map: 256 codes equal to bitsandbytes' bit for bit: {diff.size == 0}; "
              f"largest gap {gaps.max():.6f}, smallest non-zero magnitude {nz.min():.3g}")
    finish("test_quant_maps")


if __name__ == "__main__":
    main()
