"""Converts Debian's fortune files (entries separated by lines holding only '%') into JSONL {"text": ...}."""
import json
import os
import sys


def main(src_dir: str, out_path: str) -> None:
    n = 0
    tmp = out_path + ".tmp"
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as out:
        for name in sorted(os.listdir(src_dir)):
            path = os.path.join(src_dir, name)
            if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                entry = []
                for line in f:
                    if line.rstrip("\n") == "%":
                        text = "".join(entry).strip("\n")
                        if text.strip():
                            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                            n += 1
                        entry = []
                    else:
                        entry.append(line)
    os.replace(tmp, out_path)
    print(f"wrote {n} fortunes to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
