#!/bin/bash
# softblk.service on Debian 12 with systemd, the guest's side of
# tests/vm/service-reboot (run-vm --root-image, the same disk image booted
# twice; argument first-boot or second-boot):
#   first boot:  the package built in this run installs (its postinst enables
#                and starts the service), `systemctl enable --now softblk`
#                is active; a file device and a zloop device declared in
#                /etc/softblk/devices.d come up with `systemctl reload`;
#                ext4 on the file device (its default export) with files
#                written; data written to two sequential zones, the write
#                pointers recorded; a third file added and `systemctl
#                reload` applies it;
#   second boot: the service is active after the boot, both devices are
#                back: fsck clean, files read back, zone write pointers and
#                zone data as recorded; `systemctl stop` leaves no mount,
#                loop or ublk device, or softblk process.
set -euo pipefail
phase=${1:?first-boot or second-boot}
state=/var/lib/softblk-test
conf=/etc/softblk/devices.d
step() { echo "== $*"; }
fail() {
  echo "FAIL: $*"
  systemctl status softblk --no-pager -l 2>&1 | tail -n 20 || true
  journalctl -u softblk --no-pager -n 40 2>&1 || true
  exit 1
}
# device NAME: the kernel disk `softblk list --json` shows for NAME.
device() {
  softblk list --json | jq -r --arg n "$1" \
    '.[] | select(.name == $n) | .export | (.block // .loop // .device // empty)' | head -n1
}
# write_pointers: each zone's start and write pointer from `blkzone report`
# (the condition may differ after a restart: open zones come back closed).
write_pointers() { sed -n 's/.*start: \(0x[0-9a-f]*\),.*wptr \(0x[0-9a-f]*\).*/\1 \2/p'; }
no_leftovers() {
  local what=$1 left
  command -v pgrep >/dev/null || fail "pgrep is missing from the image (procps)"
  left=$(findmnt -rn -t fuse,fuse.softblk -o TARGET || true)
  [ -z "$left" ] || fail "$what: FUSE mounts left: $left"
  left=$(losetup -a || true)
  [ -z "$left" ] || fail "$what: loop devices left: $left"
  left=$(ls /dev/ublkb* /dev/ublkc* 2>/dev/null || true)
  [ -z "$left" ] || fail "$what: ublk devices left: $left"
  left=$(pgrep -a -x softblk || true)
  [ -z "$left" ] || fail "$what: softblk processes left: $left"
}

if [ "$phase" = first-boot ]; then
  step "install the packages built in this run"
  t0=$SECONDS
  dpkg -i /softblk-vm/files/debs/libsoftblk0_*.deb /softblk-vm/files/debs/softblk_*.deb
  echo "dpkg -i: $((SECONDS - t0)) s"
  systemctl is-enabled softblk || fail "the package did not enable softblk.service"
  systemctl enable --now softblk
  systemctl is-active softblk || fail "softblk.service is not active after enable --now"
  systemctl show softblk -p StatusText -p Type -p NotifyAccess

  # `softblk apply` (devices.d) comes from its own branch: until it is in
  # the build, the service's ExecStartPost/ExecReload cannot work.
  # (`softblk apply --help` would print the main help of a softblk without it.)
  softblk --help | grep -cE '^ +apply ' >/dev/null ||
    { echo "SKIP: this softblk has no apply command (devices.d); the rest needs it"; exit 77; }

  step "a file and a zloop device in $conf"
  mkdir -p "$conf" /var/lib/softblk/zloop/0 "$state"
  chmod 0700 /var/lib/softblk/zloop /var/lib/softblk/zloop/0
  printf '%s\n' '# ext4 on it (the default export)' type=file path=/var/lib/softblk/data.img \
    size=64M create=1 >"$conf/data.conf"
  printf '%s\n' type=zloop base_dir=/var/lib/softblk/zloop id=0 capacity_mb=64 zone_size_mb=4 \
    conv_zones=2 >"$conf/zoned.conf"
  systemctl reload softblk || fail "systemctl reload (softblk apply) failed"
  softblk list
  data=$(device data)
  zoned=$(device zoned)
  [ -b "$data" ] || fail "the file device has no kernel disk ($data)"
  [ -b "$zoned" ] || fail "the zloop device has no kernel disk ($zoned)"

  step "ext4 on $data with files"
  mkfs.ext4 -q -F "$data"
  mkdir -p /mnt/data
  mount "$data" /mnt/data
  for i in 1 2 3; do head -c $((i * 300000)) /dev/urandom >"/mnt/data/file$i"; done
  echo "written before the reboot" >/mnt/data/note
  (cd /mnt/data && sha256sum file1 file2 file3 note) >"$state/files.sha256"
  umount /mnt/data

  step "two sequential zones of $zoned written"
  zone_sectors=$((4 * 2048))
  head -c 1M /dev/urandom >"$state/zone2.bin"
  head -c 256K /dev/urandom >"$state/zone3.bin"
  dd if="$state/zone2.bin" of="$zoned" bs=64K seek=$((2 * zone_sectors * 512 / 65536)) oflag=direct status=none
  dd if="$state/zone3.bin" of="$zoned" bs=64K seek=$((3 * zone_sectors * 512 / 65536)) oflag=direct status=none
  blkzone report "$zoned" | tee /tmp/zones.txt
  write_pointers </tmp/zones.txt >"$state/zones.txt"
  grep -qx "0x000004000 0x000800" "$state/zones.txt" || fail "zone 2's write pointer is not 1 MiB in"
  grep -qx "0x000006000 0x000200" "$state/zones.txt" || fail "zone 3's write pointer is not 256 KiB in"

  step "a changed file: systemctl reload applies it"
  printf '%s\n' type=null memory_backed=1 size=16 export=none >"$conf/scratch.conf"
  systemctl reload softblk || fail "systemctl reload after adding scratch.conf failed"
  softblk list --json | jq -e '.[] | select(.name == "scratch")' >/dev/null ||
    fail "systemctl reload did not make the device of scratch.conf"
  sync
  echo PASS first boot
  exit 0
fi

step "after the reboot: the service and its devices"
systemctl is-active softblk || fail "softblk.service is not active after the reboot"
systemctl show softblk -p StatusText
softblk list
data=$(device data)
zoned=$(device zoned)
[ -b "$data" ] || fail "the file device is not back ($data)"
[ -b "$zoned" ] || fail "the zloop device is not back ($zoned)"

step "ext4 on $data: fsck clean, files as written"
fsck.ext4 -fn "$data" || fail "fsck.ext4 found problems on the file device"
mkdir -p /mnt/data
mount "$data" /mnt/data
(cd /mnt/data && sha256sum -c "$state/files.sha256") || fail "the files differ after the reboot"
umount /mnt/data

step "zones of $zoned as recorded"
blkzone report "$zoned" | write_pointers >/tmp/zones.txt
diff "$state/zones.txt" /tmp/zones.txt || fail "the zone write pointers changed across the reboot"
zone_sectors=$((4 * 2048))
cmp <(dd if="$zoned" bs=64K skip=$((2 * zone_sectors * 512 / 65536)) count=16 iflag=direct status=none) \
  "$state/zone2.bin" || fail "zone 2's data differs"
cmp <(dd if="$zoned" bs=64K skip=$((3 * zone_sectors * 512 / 65536)) count=4 iflag=direct status=none) \
  "$state/zone3.bin" || fail "zone 3's data differs"

step "systemctl stop"
systemctl stop softblk
systemctl is-active softblk && fail "softblk.service still active after stop"
result=$(systemctl show softblk -p Result --value)
[ "$result" = success ] || fail "the service stopped with result $result"
no_leftovers "after systemctl stop"
echo PASS second boot
