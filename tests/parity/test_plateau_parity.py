"""reduce_lr_on_plateau against torch's ReduceLROnPlateau (what transformers' get_scheduler builds for it), bit for bit.

tests/parity/plateau_driver.c, compiled here with gcc, steps snug's plateau state (src/optim/schedule.c) with a
sequence of metrics and prints the learning rate after each; the reference steps torch.optim.lr_scheduler.
ReduceLROnPlateau over an SGD optimizer with the same metrics and settings. Cases: the defaults over a long plateau,
patience and cooldown, abs and rel thresholds with metrics exactly at the threshold, mode max, a min_lr floor that
stops the reductions and an eps that refuses a reduction smaller than it. Each learning rate must be the same double.

End to end, `snug train` with validation every step (eval_steps: 1) and lr_scheduler_kwargs {patience: 0, factor: 0.5,
threshold: 0.02} logs the learning rates torch's scheduler gives when stepped with the logged validation losses (to
the 6 digits metrics.jsonl keeps), changing only after evaluations that do not improve; a resumed run is covered by
tests/cli/test_resume.sh. Without a validation set, or with eval_strategy: no, it is refused (exit 2), as transformers
refuses it."""
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bits, check, finish, tiny_train  # noqa: E402

ROOT = os.environ.get("SNUG_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULTS = dict(mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel", cooldown=0, min_lr=0.0,
                eps=1e-8)


def reference(base, kw, metrics):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **{**DEFAULTS, **kw})
    out = []
    for m in metrics:
        s.step(m)
        out.append(float(opt.param_groups[0]["lr"]))
    return out


def cases():
    down = [2.0 - 0.01 * i for i in range(5)]
    yield "defaults, a long plateau", 1e-3, {}, down + [down[-1]] * 30 + [1.0] + [1.5] * 15
    yield "patience 2, cooldown 3", 3e-4, {"patience": 2, "cooldown": 3, "factor": 0.5}, \
        [1.0, 0.9, 0.95, 0.93, 0.92, 0.91, 0.9, 0.89, 0.95, 0.96, 0.97, 0.98, 0.97, 0.96, 0.5, 0.6, 0.7, 0.8]
    best = 1.0
    yield "rel threshold, metrics at it", 1e-3, {"patience": 0, "threshold": 0.01, "factor": 0.5}, \
        [best, best * (1.0 - 0.01), best * (1.0 - 0.01) * 0.999, 0.5, 0.5 * 0.99, 0.49]
    yield "abs threshold", 1e-3, {"patience": 1, "threshold": 0.05, "threshold_mode": "abs"}, \
        [1.0, 0.95, 0.96, 0.9, 0.849, 0.85, 0.8, 0.79, 0.78, 0.7]
    yield "mode max", 1e-2, {"mode": "max", "patience": 1, "factor": 0.3}, \
        [0.1, 0.2, 0.2, 0.2, 0.25, 0.24, 0.23, 0.3, 0.3001, 0.29]
    yield "min_lr floor, eps", 1e-3, {"patience": 0, "factor": 0.5, "min_lr": 3e-4, "eps": 1e-5}, \
        [1.0] * 8
    yield "eps refuses a small cut", 1e-6, {"patience": 0, "factor": 0.5, "eps": 1e-6}, [1.0] * 4


def driver(tmp):
    exe = os.path.join(tmp, "plateau_driver")
    subprocess.run([os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra",
                    "-I" + os.path.join(ROOT, "src"), os.path.join(ROOT, "tests/parity/plateau_driver.c"),
                    os.path.join(ROOT, "src/optim/schedule.c"), "-lm", "-o", exe], check=True)
    return exe


def train(work, name, text):
    return tiny_train(work, name, "max_steps: 16\n" + text, ROOT)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        exe = driver(tmp)
        n = 0
        for what, base, kw, metrics in cases():
            p = {**DEFAULTS, **kw}
            args = [repr(base), str(int(p["mode"] == "max")), str(int(p["threshold_mode"] == "abs")), repr(p["factor"]),
                    str(p["patience"]), repr(p["threshold"]), str(p["cooldown"]), repr(p["min_lr"]), repr(p["eps"])]
            out = subprocess.run([exe, *args], input="".join(f"{bits(m):016x}\n" for m in metrics),
                                 capture_output=True, text=True)
            mine = [int(x, 16) for x in out.stdout.split()]
            ref = reference(base, kw, metrics)
            want = [bits(x) for x in ref]
            changes = sum(a != b for a, b in zip(ref, ref[1:]))
            check(out.returncode == 0 and mine == want,
                  f"{what}: snug {[hex(x) for x in mine]} torch {[hex(x) for x in want]}")
            check(changes > 0 or what.startswith("eps"), f"{what}: the reference never changes the learning rate")
            n += len(metrics)
        print(f"  {n} evaluations over {len(list(cases()))} cases: snug's learning rates are torch's doubles")

        base = 2e-2  # high enough that the validation loss stops improving within 16 steps
        rc, rows = train(tmp, "plateau", f"learning_rate: {base}\nval_set_size: 16\neval_steps: 1\n"
                         "lr_scheduler: reduce_lr_on_plateau\nwarmup_steps: 5\n"
                         "lr_scheduler_kwargs: {patience: 0, factor: 0.5, threshold: 0.02}\n")
        if rc:
            check(False, f"snug train reduce_lr_on_plateau: exit {rc}: {rows.strip().splitlines()[-1:]}")
        else:
            vals = [r["val_loss"] for r in rows]
            ref = [base] + reference(base, {"patience": 0, "factor": 0.5, "threshold": 0.02}, vals)[:-1]
            lrs = [r["lr"] for r in rows]
            ok = len(lrs) == 16 and all(abs(a - b) <= 5e-7 * b for a, b in zip(lrs, ref))
            check(ok, f"snug train: logged {lrs}, torch with the logged validation losses {ref}")
            check(len(set(lrs)) > 1, f"snug train: the learning rate never dropped ({lrs[0]})")
            print(f"  snug train: 16 learning rates follow torch's ReduceLROnPlateau stepped with the logged "
                  f"validation losses ({len(set(lrs)) - 1} reductions; warmup ignored, as transformers ignores it)")
        for what, text, want in (("no validation set", "val_set_size: 0\n", "has no validation set"),
                                 ("eval_strategy: no", "val_set_size: 16\neval_strategy: 'no'\n",
                                  "does not evaluate")):
            rc, err = train(tmp, "refused", "lr_scheduler: reduce_lr_on_plateau\n" + text)
            check(rc == 2 and want in (err if isinstance(err, str) else ""), f"{what}: exit {rc}, {err}")
        rc, err = train(tmp, "refused", "lr_scheduler: reduce_lr_on_plateau\nval_set_size: 16\n"
                        "lr_scheduler_kwargs: {factor: 1.5}\n")
        check(rc == 2 and "below 1" in (err if isinstance(err, str) else ""), f"factor 1.5: exit {rc}, {err}")
        rc, err = train(tmp, "refused", "lr_scheduler: cosine\nval_set_size: 16\nlr_scheduler_kwargs: {patience: 2}\n")
        check(rc == 2 and "does not take" in (err if isinstance(err, str) else ""), f"patience on cosine: exit {rc}")
    finish("test_plateau_parity")


if __name__ == "__main__":
    main()
