# Shared by the host tests that run the CLI's daemon in a run directory of
# their own (sourced). Needs `sb` (the CLI with a time limit).

# clear_run_dir DIR: stops the daemon of DIR by its pid (del --all and
# shutdown first, SIGKILL if it does not go within 5 s), then removes what
# it may have left under DIR: mounts, loop devices, the directory itself.
# For an EXIT trap: it must not fail, whatever state the test died in.
clear_run_dir() {
  local dir=$1 pid= m loop
  [ -s "$dir/daemon.pid" ] && pid=$(cat "$dir/daemon.pid")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    sb del --all >/dev/null 2>&1
    sb shutdown --force >/dev/null 2>&1
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  fi
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m"; done
  for loop in $(losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v d="$dir/" 'index($2, d) == 1 {print $1}'); do
    losetup -d "$loop"
  done
  rm -rf "$dir"
}
