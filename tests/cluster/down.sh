#!/usr/bin/env bash
# Takes down the cluster up.sh brought up (docs/dev/cluster.md): stops every process of it and
# of its pods, unmounts what the kubelet and containerd mounted, removes the pods' cgroups, the
# network namespace and the state, keeping only the logs (target/cluster/logs). Safe to run when
# nothing is up, and after a half-finished up.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

S=$CLUSTER_STATE

# Stops the processes of the cluster that `pattern` matches in their command lines (each names
# the state folder: a config, a kubeconfig, a socket), TERM first, KILL after 10 s; a pid file
# could miss one left by an earlier run.
stop() {
  local pattern=$1 deadline=$((SECONDS + 10))
  pkill -TERM -f "$pattern" || true
  while pgrep -f "$pattern" >/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  pkill -KILL -f "$pattern" || true
}

# The pods' cgroups (cgroupfs driver: kubepods under the root of every hierarchy), deepest first.
pod_cgroups() {
  find /sys/fs/cgroup -depth -type d -path '*/kubepods*' 2>/dev/null || true
}

# Kills every process of the pods: their cgroups, and the containerd shims of this cluster.
kill_pods() {
  local cg pid
  for cg in $(pod_cgroups); do
    for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $S/containerd/" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# Unmounts everything mounted under the state folder, deepest first.
unmount_all() {
  local mnt
  for mnt in $(awk -v s="$S/" 'index($5, s) == 1 || $5 == substr(s, 1, length(s) - 1) {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$mnt" 2>/dev/null || true
  done
}

if pgrep -f "$S/" >/dev/null; then
  log "stopping the cluster in $S"
  # The node first, so nothing restarts what goes next; then the pods, then everything else.
  stop "(^|/)(kubelet|kube-proxy) .*$S/"
  kill_pods
  stop "$S/"
  kill_pods
fi
unmount_all
for cg in $(pod_cgroups); do rmdir "$cg" 2>/dev/null || true; done
if ip netns list 2>/dev/null | grep -qw "$CLUSTER_NETNS"; then
  ip netns del "$CLUSTER_NETNS"
fi
if [ -d "$S" ]; then
  find "$S" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
fi
# containerd keeps its shims' sockets and some FIFOs under /run/containerd whatever its state
# folder; they are gone with the shims, the empty folders stay unless removed.
rmdir /run/containerd/s /run/containerd/fifo /run/containerd 2>/dev/null || true
log "down"
