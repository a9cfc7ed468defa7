#!/usr/bin/env python3
"""test_tensorboard_parity.py: snug's TensorBoard event files (report_to: tensorboard) read by TensorBoard itself.

A short run with a validation set writes events into logging_dir. TensorBoard's own loader (EventAccumulator) must
read them. Every record's length and data CRC-32C must be TensorBoard's masked_crc32c. Each tag must be Hugging Face's
TensorBoardCallback's (train/loss, train/learning_rate, train/grad_norm, train/epoch, eval/loss) and hold, step for
step, the value metrics.jsonl logged (as a float32, to the digits metrics.jsonl prints). An Axolotl-style
use_tensorboard: true writes into output_dir/runs; a logging_dir that cannot be made fails before output_dir is
touched, and a report_to snug has no writer for is refused.
Prints "N passed, M failed" and exits non-zero on any failure.

Run with the venv python: ~/.cache/snug/venv/bin/python tests/parity/test_tensorboard_parity.py
Env: SNUG_BIN (the snug program; default build/snug), SNUG_SOURCE_DIR (repository root; default two folders up).
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, finish  # noqa: E402

ROOT = os.environ.get("SNUG_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNUG = os.path.abspath(os.environ.get("SNUG_BIN", "build/snug"))


def train(work, *args):
    r = subprocess.run([SNUG, "train", "--dataset", os.path.join(work, "data.jsonl"), "--tokenizer",
                        os.path.join(ROOT, "assets", "tokenizer"), "--sequence_len", "32", "--max_steps", "6",
                        "--val_set_size", "8", "--eval_steps", "2", "--sample_tokens", "0", "--learning_rate", "3e-3",
                        "--warmup_steps", "2", "--dataset_prepared_path", os.path.join(work, "prep"), *args],
                       capture_output=True, text=True, cwd=work)
    return r


def records_ok(path):
    """Every TFRecord's length and data CRC-32C, as TensorBoard masks them; the number of records."""
    data = open(path, "rb").read()
    off, n = 0, 0
    while off < len(data):
        if off + 12 > len(data):
            return False, n
        (length,) = struct.unpack("<Q", data[off:off + 8])
        (lcrc,) = struct.unpack("<I", data[off + 8:off + 12])
        body = data[off + 12:off + 12 + length]
        if len(body) != length or off + 16 + length > len(data):
            return False, n
        (dcrc,) = struct.unpack("<I", data[off + 12 + length:off + 16 + length])
        if lcrc != masked_crc32c(data[off:off + 8]) or dcrc != masked_crc32c(body):
            return False, n
        off += 16 + length
        n += 1
    return True, n


def main():
    work = tempfile.mkdtemp(prefix="snug_tensorboard_parity_")
    try:
        with open(os.path.join(work, "data.jsonl"), "w") as f:
            for i in range(60):
                f.write(json.dumps({"text": f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}"}) + "\n")
        logdir = os.path.join(work, "tb")
        r = train(work, "--output_dir", os.path.join(work, "out"), "--report_to", "tensorboard", "--logging_dir",
                  logdir)
        check(r.returncode == 0, f"the run failed: {r.stderr.strip()[-400:]}")
        files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
        check(len(files) == 1, f"{len(files)} event files in logging_dir, not 1")
        if files:
            ok, n = records_ok(files[0])
            check(ok and n == 7, f"records: CRCs {'right' if ok else 'wrong'}, {n} of them (want the version and 6 "
                                 f"steps)")
            ea = EventAccumulator(logdir)
            ea.Reload()
            rows = [json.loads(l) for l in open(os.path.join(work, "out", "metrics.jsonl"))]
            want = {"train/loss": ("loss", 1e-6, 0), "train/learning_rate": ("lr", 1e-6, 0),
                    "train/grad_norm": ("grad_norm", 1e-6, 1e-6), "train/epoch": ("epoch", 0, 1e-4),
                    "eval/loss": ("val_loss", 1e-6, 0)}
            tags = ea.Tags()["scalars"]
            check(sorted(tags) == sorted(want), f"tags {tags}")
            for tag, (key, rel, ab) in want.items():
                got = {e.step: e.value for e in ea.Scalars(tag)} if tag in tags else {}
                ref = {row["step"]: row[key] for row in rows if key in row}
                bad = [s for s in ref if s not in got or abs(got[s] - ref[s]) > rel * abs(ref[s]) + ab]
                check(sorted(got) == sorted(ref) and not bad,
                      f"{tag}: steps {sorted(got)} (want {sorted(ref)}), differing at {bad[:3]}")
                print(f"{tag}: {len(got)} steps, each as metrics.jsonl logged it")
        # Axolotl's spelling, the default folder; a tracker snug does not write for
        r = train(work, "--output_dir", os.path.join(work, "out2"), "--use_tensorboard", "true")
        check(r.returncode == 0 and len(glob.glob(os.path.join(work, "out2", "runs", "events.out.tfevents.*"))) == 1,
              f"use_tensorboard: true did not write output_dir/runs: {r.stderr.strip()[-300:]}")
        # a logging_dir that cannot be made (under a file): one error naming it, as an output_dir would get (an I/O
        # failure, exit 1), and output_dir left as it was
        r = train(work, "--output_dir", os.path.join(work, "out4"), "--report_to", "tensorboard", "--logging_dir",
                  os.path.join(work, "data.jsonl", "tb"))
        check(r.returncode == 1 and r.stderr.count("snug: error:") == 1 and "data.jsonl/tb" in r.stderr
              and not os.path.exists(os.path.join(work, "out4")), f"bad logging_dir: {r.returncode} {r.stderr}")
        r = train(work, "--output_dir", os.path.join(work, "out3"), "--report_to", "wandb")
        check(r.returncode == 2 and "report_to 'wandb' is not supported yet" in r.stderr
              and not os.path.exists(os.path.join(work, "out3")), f"report_to wandb: {r.returncode} {r.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    finish("test_tensorboard_parity")


if __name__ == "__main__":
    main()
