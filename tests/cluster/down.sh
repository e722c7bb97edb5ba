#!/usr/bin/env bash
# Takes down the cluster up.sh brought up (docs/dev/cluster.md): stops every process of it and
# of its pods, unmounts what the kubelet and containerd mounted, removes the pods' cgroups, the
# network namespace and the state, keeping only the logs (target/cluster/logs). Safe to run when
# nothing is up, and after a half-finished up.sh. Another cluster on the machine (another state
# folder and namespace) is left alone.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

S=$CLUSTER_STATE

# The PIDs of this cluster's processes: a binary of the tools' cache (the control plane,
# containerd and its shims, the kubelet, kube-proxy) whose command line names this state
# folder. `names`: the binaries to match (all when empty).
cluster_pids() {
  local names=" $* " proc exe
  for proc in /proc/[0-9]*; do
    exe=$(readlink "$proc/exe" 2>/dev/null) || continue
    case $exe in "$TOOLS_DIR"/*) ;; *) continue ;; esac
    if [ "$names" != "  " ] && [[ $names != *" ${exe##*/} "* ]]; then
      continue
    fi
    tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -qF -- "$S/" && echo "${proc#/proc/}"
  done
  return 0
}

# Stops the processes `cluster_pids "$@"` names, TERM first, KILL after 10 s.
stop() {
  local pids deadline=$((SECONDS + 10))
  pids=$(cluster_pids "$@")
  [ -n "$pids" ] || return 0
  local pid
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $pids; do
    while [ $SECONDS -lt $deadline ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# Kills every process in the pods' cgroups (the kubelet's cgroup root of this cluster).
kill_pods() {
  local cg pid
  for cg in $(cluster_cgroups); do
    for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
}

# Unmounts everything mounted under the state folder, deepest first.
unmount_all() {
  local mnt
  for mnt in $(awk -v s="$S/" 'index($5, s) == 1 || $5 == substr(s, 1, length(s) - 1) {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$mnt" 2>/dev/null || true
  done
}

if [ -n "$(cluster_pids)" ]; then
  log "stopping the cluster in $S"
  # The node first, so nothing restarts what goes next; then the pods, then everything else.
  stop kubelet kube-proxy
  kill_pods
  stop
  kill_pods
fi
unmount_all
for cg in $(cluster_cgroups); do rmdir "$cg" 2>/dev/null || true; done
if netns_exists; then
  ip netns del "$CLUSTER_NETNS"
fi
if [ -d "$S" ]; then
  find "$S" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
fi
# containerd keeps its shims' sockets under /run/containerd whatever its state folder; they are
# gone with the shims, the empty folders stay unless removed.
rmdir /run/containerd/s /run/containerd/fifo /run/containerd 2>/dev/null || true
log "down"
