#!/usr/bin/env bash
# File and zone-file safety against another local user, end to end through
# the daemon (docs/reliability.md, "File and zone-file safety"). Root, with
# `nobody` (uid 65534) as the other user, who plants links where it can:
#   1. zloop: in a base_dir owned by nobody, nobody replaced seq-000003 with
#      a link to a root-owned file: `add zloop` is refused, naming base_dir
#      and its owner, and the file is untouched (before, the add was
#      accepted and `softblk zone reset` truncated the file to 0 bytes);
#      the same with only BASE_DIR/ID nobody's;
#   2. zloop: in root's own directory, a link planted as a zone file is
#      refused (never followed) and its target untouched; new zone files
#      are 0600, conventional ones too;
#   3. zloop: an add whose export is refused removes the zone files it
#      made and leaves the file that was there before;
#   4. zloop id=-1 passes over a directory that another daemon's device
#      holds;
#   5. file: /proc/self/comm is refused as an image; a create=1 image whose
#      export is refused is removed; a new image is 0600;
#   6. file: create=1, then `set size=0`: the device comes back after a
#      SIGKILL and after a clean shutdown; `size=-1` written while powered
#      off is refused then, not at the next power on.
# Usage: file_safety.sh PATH/TO/softblk          (exit 77: skipped)
set -euo pipefail

softblk=${1:?usage: $0 PATH/TO/softblk}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (directories given to another user)"
command -v setpriv >/dev/null || skip "setpriv (util-linux) is not installed"
other=$(id -u nobody 2>/dev/null) || skip "no user nobody"
other_group=$(id -g nobody)
sb() { timeout 60 "$softblk" "$@"; }
as_other() { setpriv --reuid="$other" --regid="$other_group" --clear-groups -- "$@"; }

run_dir=$(mktemp -d /tmp/softblk-filesafety.XXXXXX)
run_dir2=$(mktemp -d /tmp/softblk-filesafety2.XXXXXX)
export SOFTBLK_RUN_DIR=$run_dir
# nobody reaches its directory below ours (the run directory may be 0755).
chmod 0755 "$run_dir"
work=$run_dir/work
mkdir -m 0755 "$work"
source "$(dirname "$0")/../../support/lib_run_dir.sh"
cleanup() {
  set +e
  SOFTBLK_RUN_DIR=$run_dir2 clear_run_dir "$run_dir2"
  clear_run_dir "$run_dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$run_dir/daemon.log" ] && tail -20 "$run_dir/daemon.log" >&2; exit 1; }
note() { echo "== $*"; }
zloop_opts=(capacity_mb=8 zone_size_mb=1 conv_zones=1)
mode_of() { stat -c %a "$1"; }

victim=$work/victim
head -c 8192 /dev/urandom >"$victim"
chmod 0600 "$victim"
victim_sum=$(sha256sum <"$victim")
untouched() { [ "$(sha256sum <"$victim")" = "$victim_sum" ] || fail "$1: the root-owned file changed"; }

# ---------------------------------------------------------------- 1
note "zloop: a base_dir owned by nobody, with a link planted as a zone file"
evil=$work/evil
mkdir -m 0755 "$evil"
chown "$other:$other_group" "$evil"
as_other mkdir "$evil/0"
as_other truncate -s 1M "$evil/0/cnv-000000"
for z in 1 2 4 5 6 7; do as_other truncate -s 0 "$evil/0/seq-00000$z"; done
as_other ln -s "$victim" "$evil/0/seq-000003"
if out=$(sb add zloop base_dir="$evil" id=0 "${zloop_opts[@]}" --export none --name evil 2>&1); then
  # What it did before: the zone's reset truncated the file behind the link.
  sb zone reset evil $((3 * 2048)) >/dev/null 2>&1 || true
  untouched "zone reset on an accepted device"
  fail "a base_dir owned by nobody was accepted"
fi
grep -q "$evil is owned by uid $other" <<<"$out" || fail "the error does not name base_dir and its owner: $out"
untouched "refused add"
chown root:root "$evil"
out=$(sb add zloop base_dir="$evil" id=0 "${zloop_opts[@]}" --export none --name evil 2>&1) &&
  fail "a BASE_DIR/ID owned by nobody was accepted"
grep -q "$evil/0 is owned by uid $other" <<<"$out" || fail "the error does not name BASE_DIR/ID: $out"
untouched "refused add (ID directory)"
echo "ok: another user's directories are refused"

# ---------------------------------------------------------------- 2
note "zloop: links in root's own directory are not followed; zone files are 0600"
zl=$work/zl
mkdir -p -m 0755 "$zl/0"
out=$(sb add zloop base_dir="$zl" id=0 "${zloop_opts[@]}" --export none --name z0 2>&1) || fail "add z0: $out"
for f in cnv-000000 seq-000001 seq-000007; do
  [ "$(mode_of "$zl/0/$f")" = 600 ] || fail "$f has mode $(mode_of "$zl/0/$f"), not 600"
done
sb del z0 >/dev/null || fail "del z0"
for f in seq-000003 cnv-000000; do
  mv "$zl/0/$f" "$zl/0/$f.saved"
  ln -s "$victim" "$zl/0/$f"
  out=$(sb add zloop base_dir="$zl" id=0 "${zloop_opts[@]}" --export none --name z0 2>&1) &&
    fail "a zone file that is a link ($f) was accepted"
  grep -q "$zl/0/$f: a symbolic link" <<<"$out" || fail "the error does not name the link $f: $out"
  untouched "link as $f"
  rm "$zl/0/$f"
  mv "$zl/0/$f.saved" "$zl/0/$f"
done
echo "ok: links refused, modes 0600"

# ---------------------------------------------------------------- 3
note "zloop: an add whose export is refused removes the zone files it made"
mkdir -m 0755 "$zl/1"
: >"$zl/1/seq-000005"  # there before the add: stays
out=$(sb add zloop base_dir="$zl" id=1 "${zloop_opts[@]}" --export nbd --export-opt nosuch=1 \
  --name z1 2>&1) && fail "an export with an unknown option was accepted"
left=$(ls "$zl/1")
[ "$left" = seq-000005 ] || fail "a refused add left [$left] in $zl/1, not only seq-000005 ($out)"
echo "ok: nothing left"

# ---------------------------------------------------------------- 4
note "zloop id=-1 passes over a directory another daemon holds"
out=$(SOFTBLK_RUN_DIR=$run_dir2 sb add zloop base_dir="$zl" id=0 "${zloop_opts[@]}" --export none \
  --name held 2>&1) || fail "the second daemon's add: $out"
out=$(sb add zloop base_dir="$zl" id=-1 "${zloop_opts[@]}" --export none --name auto 2>&1) ||
  fail "id=-1 with BASE/0 held by another daemon: $out"
sb list --json | grep -q "\"dir\": *\"$zl/1\"" || fail "id=-1 did not pick $zl/1: $(sb list --json)"
sb del auto >/dev/null || fail "del auto"
SOFTBLK_RUN_DIR=$run_dir2 clear_run_dir "$run_dir2" || true  # (not under set -e)
echo "ok: id=-1 skips a held directory"

# ---------------------------------------------------------------- 5
note "file: pseudo files refused, a refused export removes a new image, images are 0600"
comm_before=$(cat "/proc/$(cat "$run_dir/daemon.pid")/task/"*/comm | sort | md5sum)
if out=$(sb add file path=/proc/self/comm size=4096 create=1 --export nbd --name comm 2>&1); then
  sb del comm >/dev/null 2>&1 || true
  fail "/proc/self/comm was accepted as an image"
fi
grep -q "a file of proc" <<<"$out" || fail "the error does not say proc: $out"
[ "$(cat "/proc/$(cat "$run_dir/daemon.pid")/task/"*/comm | sort | md5sum)" = "$comm_before" ] ||
  fail "a daemon thread's name changed"
img=$work/new.img
out=$(sb add file path="$img" size=8M create=1 --export nbd --export-opt nosuch=1 --name n 2>&1) &&
  fail "an export with an unknown option was accepted"
[ ! -e "$img" ] || fail "a refused add left the image it created ($out)"
out=$(sb add file path="$img" size=8M create=1 --export none --name f 2>&1) || fail "add f: $out"
[ "$(mode_of "$img")" = 600 ] || fail "a new image has mode $(mode_of "$img"), not 600"
echo "ok: file refusals"

# ---------------------------------------------------------------- 6
note "file: create=1 and size=0 survive restarts; size= is checked while powered off"
truncate -s 12M "$img"
sb set f size=0 >/dev/null || fail "set f size=0"
running_with_12m() {
  local list
  list=$(sb list) || fail "list $1"
  grep -q "^f .* running" <<<"$list" || fail "f did not come back $1: $list"
  sb list --json | grep -q '"capacity_bytes": *12582912' || fail "f is not 12 MiB $1: $(sb list --json)"
}
pid=$(cat "$run_dir/daemon.pid")
kill -KILL "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
sb recover >/dev/null 2>&1 || true
running_with_12m "after SIGKILL"
sb shutdown >/dev/null || fail "shutdown"
for _ in $(seq 100); do kill -0 "$(cat "$run_dir/daemon.pid" 2>/dev/null || echo 0)" 2>/dev/null || break; sleep 0.05; done
sb recover >/dev/null 2>&1 || true
running_with_12m "after a clean shutdown"
sb set f power=0 >/dev/null || fail "set f power=0"
out=$(sb set f size=-1 2>&1) && fail "size=-1 was accepted while powered off"
grep -q "size=-1: not a size" <<<"$out" || fail "the error does not say size=-1 is not a size: $out"
sb set f power=1 >/dev/null || fail "power on after the refused size"
sb del f >/dev/null || fail "del f"
[ -e "$img" ] || fail "del removed the image"
echo PASS
