#!/usr/bin/env bash
# mkfs.ext4 on the loop device, mount, write files, unmount, fsck -fn clean,
# mount again and read the files back.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host mkfs.ext4 fsck.ext4 losetup
start_daemon

loop=$(sb_add d0 size=256 memory_backed=1 blocksize=4096 discard=1)
mkfs.ext4 -q -F "$loop"
mkdir "$RUN_DIR/mnt"
mount "$loop" "$RUN_DIR/mnt"
for i in $(seq 1 20); do
    head -c $((i * 37 * 1024 + i)) /dev/urandom >"$RUN_DIR/mnt/file$i"
done
mkdir -p "$RUN_DIR/mnt/dir/sub"
cp "$RUN_DIR/mnt/file7" "$RUN_DIR/mnt/dir/sub/copy"
(cd "$RUN_DIR/mnt" && sha256sum file* dir/sub/copy) >"$RUN_DIR/sums"
umount "$RUN_DIR/mnt"
fsck.ext4 -fn "$loop" >"$RUN_DIR/fsck.log" 2>&1 || { cat "$RUN_DIR/fsck.log"; fail "fsck -fn found problems"; }
mount "$loop" "$RUN_DIR/mnt"
(cd "$RUN_DIR/mnt" && sha256sum -c --quiet "$RUN_DIR/sums") || fail "files changed across unmount"
umount "$RUN_DIR/mnt"

sb del d0
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
