"""snug's learning-rate schedules (src/optim/schedule.c) against transformers' get_scheduler, bit for bit.

tests/parity/sched_driver.c, compiled here with gcc, prints snug_lr_at for every step of a run (and two past its
end); the reference is base_lr times the LambdaLR factor of the scheduler transformers builds for the same
lr_scheduler_type, warmup, total and scheduler_specific_kwargs (what Trainer passes from lr_scheduler_kwargs). Every
schedule snug takes: linear, cosine (num_cycles), cosine_with_min_lr (min_lr_rate, min_lr), constant (no warmup,
whatever warmup_steps says), constant_with_warmup, cosine_with_restarts, polynomial (power, lr_end), inverse_sqrt
(timescale, and its defaults with and without warmup), warmup_stable_decay (each warmup and decay shape, a floor,
stable steps given or derived, steps past the decay), cosine_warmup_with_min_lr (min_lr_rate, min_lr, num_cycles,
warmup_lr_rate; one warmup step, none), and Axolotl's rex (with and without a floor; a warmup of 2 or more, whose step 0
Axolotl takes modulo the steps left), cosine with lr_quadratic_warmup and cosine held at its floor from
cosine_constant_lr_ratio on, against the arithmetic of Axolotl's schedulers.py (Axolotl is not installed here). Each
learning rate must be the same double (reduce_lr_on_plateau, stepped by evaluations, has test_plateau_parity.py).

End to end, `snug train` runs of a tiny model log the learning rate of each step (6 significant digits in
metrics.jsonl): polynomial, warmup_stable_decay, cosine_warmup_with_min_lr and constant with warmup_steps set
(ignored, as transformers ignores it) match transformers' to that precision, and a setting the schedule does not
take, warmup_stable_decay without its decay steps, or cosine_warmup_with_min_lr without its floor, is refused with
exit 2."""
import math
import os
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bits, check, finish, tiny_train  # noqa: E402

ROOT = os.environ.get("SNUG_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
KIND = {"constant": 0, "linear": 1, "cosine": 2, "cosine_with_min_lr": 2, "constant_with_warmup": 3,
        "cosine_with_restarts": 4, "polynomial": 5, "inverse_sqrt": 6, "warmup_stable_decay": 7,
        "cosine_warmup_with_min_lr": 9, "rex": 10, "axolotl_quadratic": 2, "axolotl_constant": 2}
SHAPE = {"linear": 0, "cosine": 1, "1-sqrt": 2}

CASES = [  # (type, base lr, warmup, total, kwargs)
    ("linear", 3e-4, 0, 10, {}),
    ("linear", 1e-3, 3, 17, {}),
    ("cosine", 3e-4, 0, 10, {}),
    ("cosine", 2e-4, 4, 20, {}),
    ("cosine", 2e-4, 4, 20, {"num_cycles": 1.5}),
    ("cosine_with_min_lr", 2e-4, 4, 20, {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", 3e-4, 2, 15, {"min_lr": 3e-5}),
    ("constant", 5e-4, 5, 12, {}),
    ("constant_with_warmup", 5e-4, 5, 12, {}),
    ("cosine_with_restarts", 1e-3, 2, 30, {}),
    ("cosine_with_restarts", 1e-3, 2, 30, {"num_cycles": 3}),
    ("polynomial", 1e-3, 3, 20, {}),
    ("polynomial", 1e-3, 3, 20, {"power": 2.0, "lr_end": 1e-5}),
    ("inverse_sqrt", 1e-3, 5, 40, {}),
    ("inverse_sqrt", 1e-3, 0, 40, {}),
    ("inverse_sqrt", 1e-3, 5, 40, {"timescale": 7}),
    ("warmup_stable_decay", 1e-3, 3, 20, {"num_decay_steps": 5}),
    ("warmup_stable_decay", 1e-3, 3, 20, {"num_decay_steps": 5, "num_stable_steps": 6}),
    ("warmup_stable_decay", 1e-3, 4, 24, {"num_decay_steps": 8, "warmup_type": "cosine", "decay_type": "1-sqrt",
                                          "min_lr_ratio": 0.1}),
    ("warmup_stable_decay", 1e-3, 4, 24, {"num_decay_steps": 8, "warmup_type": "1-sqrt", "decay_type": "linear",
                                          "min_lr_ratio": 0.05}),
    ("warmup_stable_decay", 1e-3, 4, 24, {"num_decay_steps": 8, "decay_type": "cosine", "num_cycles": 0.25}),
    ("cosine_warmup_with_min_lr", 2e-4, 4, 20, {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", 3e-4, 5, 18, {"min_lr": 3e-5, "warmup_lr_rate": 0.2, "num_cycles": 0.75}),
    ("cosine_warmup_with_min_lr", 1e-3, 1, 10, {"min_lr_rate": 0.0, "warmup_lr_rate": 0.5}),
    ("cosine_warmup_with_min_lr", 1e-3, 0, 10, {"min_lr_rate": 0.05}),
    # Axolotl's own (axolotl/utils/schedulers.py; Axolotl is not installed here: axolotl_reference below is its code's
    # arithmetic, step for step)
    ("rex", 1e-3, 0, 20, {}),
    ("rex", 1e-3, 1, 20, {"cosine_min_lr_ratio": 0.1}),
    ("rex", 2e-4, 4, 25, {"cosine_min_lr_ratio": 0.05}),
    ("axolotl_quadratic", 1e-3, 5, 20, {}),
    ("axolotl_constant", 1e-3, 3, 20, {"cosine_min_lr_ratio": 0.1, "cosine_constant_lr_ratio": 0.6}),
    ("axolotl_constant", 5e-4, 0, 17, {"cosine_min_lr_ratio": 0.2, "cosine_constant_lr_ratio": 0.33}),
]


def build_driver(tmp):
    exe = os.path.join(tmp, "sched_driver")
    subprocess.run([os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra",
                    "-I" + os.path.join(ROOT, "src"),
                    os.path.join(ROOT, "tests/parity/sched_driver.c"), os.path.join(ROOT, "src/optim/schedule.c"),
                    "-lm", "-o", exe], check=True)
    return exe


def axolotl_reference(kind, base, warmup, total, kw):
    """The learning rates of Axolotl's RexLR (get_lr at last_step = the step), its cosine with quadratic warmup and
    its cosine decaying to a floor held from int(total x cosine_constant_lr_ratio) on (LambdaLR: base_lr x factor)."""
    r = kw.get("cosine_min_lr_ratio", 0.0)
    out = []
    for step in range(total + 2):
        if kind == "rex":
            max_lr, min_lr = base, base * r
            if 1 <= step <= warmup:
                out.append(base * step / warmup)
                continue
            after, rest = step - warmup, total - warmup
            if after >= rest or after == -1 or rest <= 0:
                out.append(min_lr)
                continue
            z = (rest - after % rest) / rest
            out.append(base * (min_lr / max_lr + (1.0 - min_lr / max_lr) * (z / (0.1 + 0.9 * z))))
        elif step < warmup:
            x = float(step) / float(max(1, warmup))
            out.append(base * (x ** 2 if kind == "axolotl_quadratic" else x))
        elif kind == "axolotl_quadratic":
            progress = float(step - warmup) / float(max(1, total - warmup))
            out.append(base * max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))))
        else:
            ncs = int(total * kw["cosine_constant_lr_ratio"])
            s = min(step, ncs)
            progress = float(s - warmup) / float(max(1, ncs - warmup))
            out.append(base * (max(0, (1 - r) * 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))) + r))
    return out


def reference(kind, base, warmup, total, kw):
    """base_lr x the factor of transformers' scheduler, step by step (the steps past total included)."""
    if kind in ("rex", "axolotl_quadratic", "axolotl_constant"):
        return axolotl_reference(kind, base, warmup, total, kw)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    s = transformers.get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total,
                                   scheduler_specific_kwargs=dict(kw))
    return [base * s.lr_lambdas[0](step) for step in range(total + 2)]


def driver_args(kind, base, warmup, total, kw):
    min_ratio = kw.get("min_lr_rate", kw["min_lr"] / base if "min_lr" in kw else kw.get("cosine_min_lr_ratio", 0.0))
    return [str(KIND[kind]), repr(base), str(warmup), str(total), repr(min_ratio), repr(kw.get("num_cycles", -1.0)),
            repr(kw.get("power", 1.0)), repr(kw.get("lr_end", 1e-7)), str(kw.get("timescale", 0)),
            str(kw.get("num_decay_steps", -1)), str(kw.get("num_stable_steps", -1)),
            str(SHAPE[kw.get("warmup_type", "linear")]), str(SHAPE[kw.get("decay_type", "cosine")]),
            repr(kw.get("min_lr_ratio", 0.0)), repr(kw.get("warmup_lr_rate", -1.0)),
            str(int(kind == "axolotl_quadratic")), repr(kw.get("cosine_constant_lr_ratio", 0.0))]


def train_lrs(work, name, yaml_text):
    """The learning rates a tiny 12-step `snug train` run logs, one per step (or its exit status and error)."""
    rc, out = tiny_train(work, name, "max_steps: 12\nval_set_size: 0\n" + yaml_text, ROOT)
    if rc:
        return rc, out.strip().splitlines()[-1] if out.strip() else ""
    return 0, [row["lr"] for row in out]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        nsteps = 0
        for kind, base, warmup, total, kw in CASES:
            ref = reference(kind, base, warmup, total, kw)
            out = subprocess.run([exe, *driver_args(kind, base, warmup, total, kw)], capture_output=True, text=True)
            mine = [int(x, 16) for x in out.stdout.split()]
            want = [bits(x) for x in ref]
            bad = [i for i, (a, b) in enumerate(zip(mine, want)) if a != b]
            nsteps += len(want)
            check(out.returncode == 0 and len(mine) == len(want) and not bad,
                  f"{kind} {kw} warmup {warmup} of {total}: steps {bad[:5]} differ "
                  f"(snug {[hex(mine[i]) for i in bad[:2]]}, transformers {[hex(want[i]) for i in bad[:2]]})")
        print(f"  {len(CASES)} schedules, {nsteps} learning rates: snug's are transformers' (Axolotl's) doubles")

        ends = [("polynomial", 1e-3, "lr_scheduler: polynomial\nwarmup_steps: 3\n"
                 "lr_scheduler_kwargs: {power: 2.0, lr_end: 1.0e-5}\n", {"power": 2.0, "lr_end": 1e-5}, 3),
                ("warmup_stable_decay", 1e-3, "lr_scheduler: warmup_stable_decay\nwarmup_steps: 2\n"
                 "lr_scheduler_kwargs: {num_decay_steps: 4, decay_type: linear, min_lr_ratio: 0.1}\n",
                 {"num_decay_steps": 4, "decay_type": "linear", "min_lr_ratio": 0.1}, 2),
                ("constant", 1e-3, "lr_scheduler: constant\nwarmup_steps: 3\n", {}, 3),
                ("cosine_warmup_with_min_lr", 1e-3, "lr_scheduler: cosine_warmup_with_min_lr\nwarmup_steps: 3\n"
                 "lr_scheduler_kwargs: {min_lr_rate: 0.1, warmup_lr_rate: 0.1}\n",
                 {"min_lr_rate": 0.1, "warmup_lr_rate": 0.1}, 3),
                ("rex", 1e-3, "lr_scheduler: rex\nwarmup_steps: 2\ncosine_min_lr_ratio: 0.1\n",
                 {"cosine_min_lr_ratio": 0.1}, 2),
                ("axolotl_quadratic", 1e-3, "lr_scheduler: cosine\nwarmup_steps: 3\nlr_quadratic_warmup: true\n", {},
                 3),
                ("axolotl_constant", 1e-3, "lr_scheduler: cosine\nwarmup_steps: 2\ncosine_min_lr_ratio: 0.1\n"
                 "cosine_constant_lr_ratio: 0.5\n", {"cosine_min_lr_ratio": 0.1, "cosine_constant_lr_ratio": 0.5}, 2)]
        for kind, base, text, kw, warmup in ends:
            rc, lrs = train_lrs(tmp, kind, f"learning_rate: {base}\n" + text)
            ref = reference(kind, base, 0 if kind == "constant" else warmup, 12, kw)[:12]
            ok = rc == 0 and len(lrs) == 12 and all(abs(a - b) <= 5e-7 * b + 1e-30 for a, b in zip(lrs, ref))
            check(ok, f"snug train {kind}: logged {lrs}, transformers {ref}")
            print(f"  snug train, {kind}: the 12 logged learning rates are the reference's to 6 digits: {ok}")
        for what, text, want in (
                ("a setting the schedule does not take", "lr_scheduler: cosine\nlr_scheduler_kwargs: {power: 2}\n",
                 "lr_scheduler cosine does not take"),
                ("WSD without its decay steps", "lr_scheduler: warmup_stable_decay\n", "needs its decay steps"),
                ("cosine_warmup_with_min_lr without its floor", "lr_scheduler: cosine_warmup_with_min_lr\n",
                 "cosine_warmup_with_min_lr needs its floor"),
                ("lr_quadratic_warmup beside a floor", "lr_quadratic_warmup: true\ncosine_min_lr_ratio: 0.1\n",
                 "Axolotl ignores a floor"),
                ("cosine_constant_lr_ratio without a floor", "cosine_constant_lr_ratio: 0.5\n",
                 "set lr_scheduler: cosine and cosine_min_lr_ratio"),
                ("lr_end above learning_rate", "learning_rate: 1e-4\nlr_scheduler: polynomial\n"
                 "lr_scheduler_kwargs: {lr_end: 1e-3}\n", "not below learning_rate")):
            rc, msg = train_lrs(tmp, "bad", text)
            check(rc == 2 and want in msg, f"{what}: rc {rc}: {msg}")
        print("  refused with exit 2: a setting the schedule does not take, WSD without num_decay_steps, "
              "cosine_warmup_with_min_lr without its floor, lr_end above learning_rate, Axolotl's cosine variants "
              "where Axolotl would ignore them")
    finish("test_sched_parity")


if __name__ == "__main__":
    main()
