#!/usr/bin/env python3
"""Seeds for the FAT fuzzer: small FAT12 images whose directories form
cycles, the damage that made `ls -R` run away. Each has /A/B/C and
/D/X.TXT (made with mkfs.fat and mtools), then one entry is pointed back:
  cycle-parent.img  /A/B -> /A
  cycle-root.img    /A/B -> the root (cluster 0)
  cycle-long.img    /A/B/C -> /A
Usage: make_cycle_seeds.py CORPUS_DIR (needs mkfs.fat, mmd, mcopy)."""
import os
import struct
import subprocess
import sys
import tempfile


def layout(img):
    bps, spc, reserved, fats, root_entries = struct.unpack_from("<HBHBH", img, 11)
    fat_size = struct.unpack_from("<H", img, 22)[0]
    root = (reserved + fats * fat_size) * bps
    data = root + (root_entries * 32 + bps - 1) // bps * bps
    return bps * spc, root, root_entries, data


def entry_offset(img, dir_offset, count, name):
    for i in range(count):
        off = dir_offset + i * 32
        if img[off:off + 11] == name:
            return off
    raise SystemExit(f"make_cycle_seeds: no entry {name!r}")


def make(path, kind):
    if os.path.exists(path):
        os.remove(path)
    subprocess.run(["mkfs.fat", "-C", "-F", "12", path, "160"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["mmd", "-i", path, "::/A", "::/A/B", "::/A/B/C", "::/D"], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("outside the cycle\n")
        f.flush()
        subprocess.run(["mcopy", "-i", path, f.name, "::/D/X.TXT"], check=True)
    with open(path, "rb") as f:
        img = bytearray(f.read())
    cluster_bytes, root, root_entries, data = layout(img)

    def cluster_of(off):
        return struct.unpack_from("<H", img, off + 26)[0]

    def dir_at(cluster):
        return data + (cluster - 2) * cluster_bytes

    per_cluster = cluster_bytes // 32
    a = cluster_of(entry_offset(img, root, root_entries, b"A          "))
    b_entry = entry_offset(img, dir_at(a), per_cluster, b"B          ")
    if kind == "parent":
        struct.pack_into("<H", img, b_entry + 26, a)
    elif kind == "root":
        struct.pack_into("<H", img, b_entry + 26, 0)
    else:
        b = cluster_of(b_entry)
        c_entry = entry_offset(img, dir_at(b), per_cluster, b"C          ")
        struct.pack_into("<H", img, c_entry + 26, a)
    with open(path, "wb") as f:
        f.write(img)


def main():
    corpus = sys.argv[1]
    os.makedirs(corpus, exist_ok=True)
    for kind in ("parent", "root", "long"):
        make(os.path.join(corpus, f"cycle-{kind}.img"), kind)


if __name__ == "__main__":
    main()
