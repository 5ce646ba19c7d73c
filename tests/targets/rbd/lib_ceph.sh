# A single-node Ceph cluster for the rbd target's tests and benchmark,
# from Debian's packages (ceph-mon, ceph-osd, ceph-common): one monitor and
# one memstore OSD on 127.0.0.1, replication size 1, no manager, no systemd.
# Everything lives in a directory the caller gives; the daemons' pids are
# recorded there and ceph_stop kills them (call it from an EXIT trap).
#
#   source lib_ceph.sh
#   ceph_missing || skip "$(ceph_missing)"   # prints what is not installed
#   ceph_test_requires [TOOL...]             # the tests' skips (lib_cli.sh's skip)
#   ceph_test_start OSD_MIB                  # the tests' start (sets conf=)
#   ceph_start DIR [OSD_MEMORY_MIB]          # exports CEPH_CONF, CEPH_ADMIN_KEYRING (not CEPH_KEYRING: ceph daemons read that variable and would take the admin key)
#   ceph_stop_osd / ceph_start_osd           # the OSD alone (outage tests)
#   ceph_stop_mon / ceph_start_mon           # the monitor alone (outage tests)
#   ceph_cmd ... / rbd_cmd ...               # ceph / rbd with a time limit
#   ceph_stop                                # kill every daemon, keep DIR
#
# Pitfalls (docs/rbd.md): without a manager `ceph osd df` and `ceph pg`
# hang, so nothing here calls them; a client killed without rbd_close keeps
# the image's exclusive lock for ~30 s, so test images are created with
# `--image-feature layering` only.

ceph_missing() {
  local t
  for t in ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd; do
    command -v "$t" >/dev/null || { echo "$t is not installed (scripts/install-deps.sh)"; return 0; }
  done
  return 1
}

# For the test scripts, after lib_cli.sh (its skip) with $softblk set:
# skips (exit 77) with the reason unless the ceph packages, nbdinfo, fio,
# python3-libnbd, the tools given as arguments and softblk's rbd target
# are there.
ceph_test_requires() {
  local why tool
  if why=$(ceph_missing); then skip "$why"; fi
  for tool in nbdinfo fio /usr/bin/python3 "$@"; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
  done
  /usr/bin/python3 -c 'import nbd' 2>/dev/null || skip "python3-libnbd is not installed"
  "$softblk" features rbd >/dev/null 2>&1 || skip "this softblk was built without the rbd target"
}

# For the test scripts: starts the cluster in $run_dir/ceph with an OSD of
# $1 MiB, its output in $work/ceph-start.txt (shown, and the test failed,
# when it does not come up), and sets conf (conf=CEPH_CONF, the rbd
# target's option).
ceph_test_start() {
  note "single-node Ceph cluster"
  local t0
  t0=$(date +%s)
  ceph_start "$run_dir/ceph" "$1" >"$work/ceph-start.txt" 2>&1 ||
    { cat "$work/ceph-start.txt"; fail "the cluster did not come up"; }
  echo "cluster up in $(($(date +%s) - t0)) s (mon $CEPH_MON_ADDR)"
  conf=conf=$CEPH_CONF
}

# The cluster's own time limit for every `ceph`/`rbd` command.
ceph_cmd() { timeout 60 ceph --conf "$CEPH_CONF" --connect-timeout 20 "$@"; }
rbd_cmd() { timeout 120 rbd --conf "$CEPH_CONF" "$@"; }

_ceph_port() {
  # A free loopback port for the monitor (v1 protocol only: one port).
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

ceph_start() {
  local dir=${1:?ceph_start DIR} osd_mib=${2:-2048}
  CEPH_DIR=$dir
  mkdir -p "$dir/mon" "$dir/osd" "$dir/run" "$dir/log"
  local port fsid
  port=$(_ceph_port)
  fsid=$(python3 -c 'import uuid; print(uuid.uuid4())')
  CEPH_CONF=$dir/ceph.conf
  CEPH_ADMIN_KEYRING=$dir/client.admin.keyring
  CEPH_MON_ADDR=127.0.0.1:$port
  export CEPH_CONF CEPH_ADMIN_KEYRING CEPH_MON_ADDR CEPH_DIR
  cat >"$CEPH_CONF" <<EOF
[global]
fsid = $fsid
mon host = v1:$CEPH_MON_ADDR
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $CEPH_ADMIN_KEYRING
run dir = $dir/run
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
ms bind ipv4 = true
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
[client]
# Clients (librbd in softblk, rbd, qemu) get no admin socket: several of
# them run at once under one name.
admin socket =
# Images without exclusive-lock: a client killed without rbd_close would
# otherwise hold the image's lock for ~30 s (the kill -9 test re-opens it).
rbd default features = 1
[mon]
admin socket = $dir/run/\$name.asok
mon data = $dir/mon
keyring = $dir/mon.keyring
mon data avail warn = 1
mon data avail crit = 0
mon cluster log file = $dir/log/cluster.log
[osd]
admin socket = $dir/run/\$name.asok
osd data = $dir/osd
keyring = $dir/osd/keyring
osd objectstore = memstore
# A clean stop (SIGTERM) saves the memstore to osd data, so a restarted
# OSD has its objects again (fast shutdown would skip the save).
osd fast shutdown = false
memstore device bytes = $((osd_mib << 20))
memstore page set = true
memstore page size = 4096
osd max object name len = 256
osd max object namespace len = 64
EOF
  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$CEPH_ADMIN_KEYRING" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$CEPH_ADMIN_KEYRING" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v1:$CEPH_MON_ADDR]" "$dir/monmap" >/dev/null
  ceph-mon --conf "$CEPH_CONF" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring" ||
    return 1
  ceph-mon --conf "$CEPH_CONF" -i a || return 1
  local osd_uuid osd_key id
  osd_uuid=$(python3 -c 'import uuid; print(uuid.uuid4())')
  osd_key=$(ceph-authtool --gen-print-key)
  id=$(echo "{\"cephx_secret\": \"$osd_key\"}" |
    ceph_cmd osd new "$osd_uuid" -i - -n client.admin) || return 1
  [ "$id" = 0 ] || { echo "ceph_start: osd new gave id '$id'" >&2; return 1; }
  ceph-authtool --create-keyring "$dir/osd/keyring" --name osd.0 --add-key "$osd_key" >/dev/null
  ceph-osd --conf "$CEPH_CONF" -i 0 --no-mon-config --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd-mkfs.txt" 2>&1 ||
    { cat "$dir/log/osd-mkfs.txt" >&2; return 1; }
  ceph_start_osd || return 1
  ceph_cmd osd pool create rbd 8 8 >/dev/null || return 1
  ceph_cmd osd pool set rbd size 1 --yes-i-really-mean-it >/dev/null 2>&1 || true
  ceph_cmd osd pool application enable rbd rbd >/dev/null || return 1
  rbd_cmd pool init rbd || return 1
}

ceph_start_osd() {
  # Right after `ceph osd new` the monitor may refuse the new key's first
  # authentication ("failed to fetch mon config"): try again for a while.
  local try
  for try in $(seq 20); do
    ceph-osd --conf "$CEPH_CONF" -i 0 2>"$CEPH_DIR/log/osd-start.txt" && break
    [ "$try" = 20 ] && { cat "$CEPH_DIR/log/osd-start.txt" >&2; return 1; }
    sleep 0.5
  done
  # Up and in: `ceph osd stat` says "1 up" once the monitor has it.
  local i
  for i in $(seq 300); do
    ceph_cmd osd stat 2>/dev/null | grep -q "1 up" && return 0
    sleep 0.1
  done
  echo "ceph_start_osd: the OSD did not come up (see $CEPH_DIR/log/osd.0.log)" >&2
  return 1
}

_ceph_kill_pidfile() {
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# Stops the OSD with SIGTERM: with `osd fast shutdown = false` it saves its
# memstore to osd data first, so ceph_start_osd brings the objects back
# (SIGKILL would lose them all).
ceph_stop_osd() { _ceph_kill_pidfile "$CEPH_DIR/run/osd.0.pid"; }

ceph_stop_mon() { _ceph_kill_pidfile "$CEPH_DIR/run/mon.a.pid"; }

ceph_start_mon() {
  ceph-mon --conf "$CEPH_CONF" -i a || return 1
  local i
  for i in $(seq 100); do
    ceph_cmd osd stat >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "ceph_start_mon: the monitor does not answer (see $CEPH_DIR/log/mon.a.log)" >&2
  return 1
}

ceph_stop() {
  [ -n "${CEPH_DIR:-}" ] || return 0
  local f
  for f in "$CEPH_DIR"/run/*.pid; do
    [ -e "$f" ] && _ceph_kill_pidfile "$f"
  done
  return 0
}
