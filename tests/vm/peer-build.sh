# Sourced by run-vm: builds a test peer for the booted kernel once (the
# kernel's zloop.ko, kublk), and remembers a failure so that later runs
# skip with its reason instead of building again.
#
#   peer_build NAME SCRIPT STEPS INSTALL BUILT
#
# NAME: the state folder ($cache_dir/NAME: $kver.log, $kver.failed) and
# the prefix of the build's step lines ("NAME: STEP"; the last one names
# the step that failed). SCRIPT: the file that defines the build, whose
# hash a remembered failure carries (a changed script builds again).
# STEPS: a function run as STEPS WORK in a bash of its own with errexit
# and pipefail, its output in the log. INSTALL: run as INSTALL WORK after it succeeds.
# BUILT: a command that succeeds when the peer is already in place.
# Returns 0 when built or already there; 1 with peer_failure set to one
# line. Uses run-vm's globals (kver, cache_dir, lock_fd) and log().
peer_build() {
  local name=$1 script=$2 steps=$3 install=$4 built=$5
  local state=$cache_dir/$name self_hash
  peer_failure=
  self_hash=$(sha256sum "$script" | cut -c1-16)
  mkdir -p "$state"
  if [[ -s $state/$kver.failed && $(head -n1 "$state/$kver.failed") == "$self_hash" ]]; then
    peer_failure="$(tail -n1 "$state/$kver.failed") (cached; log: $state/$kver.log)"
    return 1
  fi
  flock "$lock_fd"
  if $built; then flock -u "$lock_fd"; return 0; fi
  log "building $name for $kver (once; log in $state/$kver.log)"
  local work rc=0
  work=$(mktemp -d "$state/.build.XXXXXX")
  # The steps run in a bash of their own, with run-vm's functions and the
  # globals they read: in a subshell, errexit would be ignored whenever
  # the caller tests the result (`build || skip`), and a failed step would
  # go on to the next.
  local v vars=()
  for v in kver cache_dir mirror modules_root k_self_dir backports_apt_opts; do
    [[ -z ${!v+x} ]] || vars+=("$v")
  done
  bash -c "$(declare -p "${vars[@]}"); $(declare -f); set -euo pipefail; \"\$@\"" \
    peer-build "$steps" "$work" >"$state/$kver.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    "$install" "$work"
    rm -f "$state/$kver.failed"
  else
    peer_failure=$(grep "^$name: " "$state/$kver.log" | tail -n1 | sed "s/^$name: //")
    [[ -n $peer_failure ]] || peer_failure="build failed"
    peer_failure="$peer_failure: $(grep -v "^$name: " "$state/$kver.log" | grep -m1 -iE '^E: |error|not found|No such' | cut -c1-200)"
    printf '%s\n%s\n' "$self_hash" "cannot build $name for $kver: $peer_failure" >"$state/$kver.failed"
    peer_failure=$(tail -n1 "$state/$kver.failed")
  fi
  rm -rf "$work"
  flock -u "$lock_fd"
  return $((rc != 0))
}
