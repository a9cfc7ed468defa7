#!/usr/bin/env python3
"""unpack_debs.py DEBS_DIR ROOT: extracts the files of every .deb in DEBS_DIR under ROOT, as dpkg-deb -x would.

For machines without dpkg (scripts/gpu-check.sh on a bare GPU machine): a .deb is an ar archive whose data.tar.*
member holds the files; Python's tarfile reads its gzip, xz or zstd-less compressions. Symbolic links are kept
(they are relative in Debian's library packages)."""
import io
import os
import sys
import tarfile


def members(path):
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise SystemExit(f"unpack_debs: {path}: not a .deb (ar archive)")
        while True:
            head = f.read(60)
            if len(head) < 60:
                return
            name, size = head[:16].decode().strip().rstrip("/"), int(head[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def main():
    debs, root = sys.argv[1], sys.argv[2]
    os.makedirs(root, exist_ok=True)
    n = 0
    for deb in sorted(os.listdir(debs)):
        if not deb.endswith(".deb"):
            continue
        for name, data in members(os.path.join(debs, deb)):
            if name.startswith("data.tar"):
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
                    t.extractall(root, filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(root)
                n += 1
    if n == 0:
        raise SystemExit(f"unpack_debs: no .deb in {debs}")
    print(f"unpack_debs: {n} packages into {root}")


if __name__ == "__main__":
    main()
