#!/usr/bin/env bash
# Real clients against softblk's NBD server: nbdinfo (list, size, block
# sizes, contexts, --map), nbdcopy with several connections, qemu-img
# convert/compare/map, qemu-io, and fio's nbd engine with verify.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need nbdinfo nbdcopy qemu-img qemu-io python3

start_server s -o threads=2 d0 null memory_backed=1 size=64 submit_queues=2 , \
  d1 null memory_backed=1 size=16 bs=4096 submit_queues=2
U=$(uri_of s d0)
U1=$(uri_of s d1)
sock="$work/nbd.sock"
[ "$U" = "nbd+unix:///d0?socket=$sock" ] || fail "unexpected URI $U"

# ---- nbdinfo
nbdinfo --list "nbd+unix:///?socket=$sock" >"$work/list"
grep -q 'export="d0"' "$work/list" && grep -q 'export="d1"' "$work/list" || fail "list: $(cat "$work/list")"
[ "$(nbdinfo --size "$U")" = $((64 << 20)) ] || fail "size of d0"
[ "$(nbdinfo --size "$U1")" = $((16 << 20)) ] || fail "size of d1"
nbdinfo "$U1" >"$work/info1"
grep -q 'block_size_minimum: 4096' "$work/info1" || fail "d1 minimum block size: $(cat "$work/info1")"
grep -q 'block_size_preferred: 4096' "$work/info1" || fail "preferred block size"
grep -q 'can_multi_conn: true' "$work/info1" || fail "multi-conn"
nbdinfo "$U" | grep -A2 'contexts:' | grep -q 'base:allocation' || fail "base:allocation context"
nbdinfo --can fua "$U" || fail "can fua"
nbdinfo --is read-only "$U" && fail "d0 is not read-only"
[ "$(nbdinfo --map "$U" | awk '{print $1, $2, $4}')" = "0 67108864 hole,zero" ] || fail "map of an empty device"

# ---- qemu-img convert to softblk, compare, map
head -c $((8 << 20)) /dev/urandom >"$work/a.img"
truncate -s $((24 << 20)) "$work/a.img"          # 16 MiB hole after the data
dd if=/dev/urandom of="$work/a.img" bs=1M seek=24 count=4 conv=notrunc status=none
truncate -s $((64 << 20)) "$work/a.img"
# The device is new (all holes): qemu-img may skip the zero areas.
qemu-img convert -n --target-is-zero -f raw -O raw "$work/a.img" "$U"
qemu-img compare -f raw -F raw "$work/a.img" "$U" || fail "qemu-img compare after convert"
qemu-img map --output=json -f raw "$U" >"$work/map.json"
python3 - "$work/map.json" <<'PY' || fail "qemu-img map: $(cat "$work/map.json")"
import json, sys
m = json.load(open(sys.argv[1]))
data = [(e["start"], e["length"]) for e in m if e["data"]]
# qemu-img convert skips zero areas: data at 0..8M and 24..28M only.
assert data == [(0, 8 << 20), (24 << 20, 4 << 20)], data
PY
nbdinfo --map "$U" >"$work/nmap"
grep -q '^ *0  *8388608  *0  *data' "$work/nmap" || fail "nbdinfo --map: $(cat "$work/nmap")"
# ...and back from softblk
qemu-img convert -f raw -O raw "$U" "$work/b.img"
cmp "$work/a.img" "$work/b.img" || fail "qemu-img convert from softblk"

# ---- nbdcopy with 4 connections, both directions
head -c $((16 << 20)) /dev/urandom >"$work/c.img"
nbdcopy -C 4 --requests=16 "$work/c.img" "$U1"
nbdcopy -C 4 "$U1" "$work/d.img"
cmp "$work/c.img" "$work/d.img" || fail "nbdcopy round trip"

# ---- qemu-io: pattern writes and reads, write zeroes, discard not advertised on null without discard=1
qemu-io -f raw "$U" -c 'write -P 0x5a 1M 64k' -c 'read -P 0x5a 1M 64k' -c 'write -z 1M 4k' \
  -c 'read -P 0 1M 4k' -c 'read -P 0x5a 1028k 60k' -c 'flush' -c 'write -f -P 0x11 0 512' \
  -c 'read -P 0x11 0 512' -c 'read -P 0x11 0 512' >"$work/qio" 2>&1 || fail "qemu-io: $(cat "$work/qio")"
grep -q 'Pattern verification failed' "$work/qio" && fail "qemu-io pattern: $(cat "$work/qio")"

# ---- fio's nbd engine with verify
if fio --enghelp 2>/dev/null | grep -qw nbd; then
  fio --name=verify --ioengine=nbd --uri="$U" --rw=randwrite --bs=4k --iodepth=16 --size=32M \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --output="$work/fio.txt" || fail "fio: $(cat "$work/fio.txt")"
  fio --name=verify-big --ioengine=nbd --uri="$U1" --rw=write --bsrange=4k-1m --iodepth=8 --size=16M \
    --verify=md5 --do_verify=1 --verify_fatal=1 --output="$work/fio2.txt" || fail "fio: $(cat "$work/fio2.txt")"
else
  echo "note: this fio has no nbd engine; fio part not run"
fi
server_alive "$SERVER_PID" || fail "server died"
echo "PASS"
