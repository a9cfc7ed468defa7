# ids_data.sh: shared by the multi-rank CLI tests (sourced, not a test itself). Needs W (lib.sh).
# Writes $W/ids.jsonl and $W/ids.yaml: pretokenized examples that use each id 1..2047 once in the whole set (prompt
# tokens unsupervised), so every gradient element of an untied model gets one addition per micro-batch and data
# parallel can be the bits of one process (see test_ddp.sh).
python3 - "$W/ids.jsonl" <<'PY'
import json, random, sys
random.seed(3)
ids = random.sample(range(1, 2048), 2047)
with open(sys.argv[1], "w") as f:
    i = 0
    while i + 24 <= len(ids):
        n = random.randint(6, 24)
        ex = ids[i:i + n]
        i += n
        p = random.randint(0, n // 2)
        f.write(json.dumps({"input_ids": ex, "labels": [-100] * p + ex[p:]}) + "\n")
PY
printf 'datasets:\n  - path: %s\n    type: pretokenized\n' "$W/ids.jsonl" > "$W/ids.yaml"
