# Shared by the scripts of tests/cluster/ (docs/dev/cluster.md): where things live, logging,
# the Go settings every build uses, and how to reach the cluster. Sourced, not run.

# A failure inside $(…) fails the script too.
shopt -s inherit_errexit

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=versions.sh
. "$here/versions.sh"

# The cache that survives between runs on one machine: Go's module and build caches, the built
# tools (one folder per tool and version) and the wrapper modules they were built from.
CLUSTER_CACHE=${TETHER_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether-cluster}
TOOLS_DIR=$CLUSTER_CACHE/tools
export GOMODCACHE=$CLUSTER_CACHE/go/mod
export GOCACHE=$CLUSTER_CACHE/go/build
# The machine's Go builds everything (no toolchain download); go.sum lines come from the
# checksum database as usual.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -trimpath -buildvcs=false"

# The state of a running cluster (certificates, etcd's tmpfs, containerd's and the kubelet's
# roots, logs, the kubeconfig), removed by down.sh.
CLUSTER_STATE=${TETHER_CLUSTER_STATE:-$repo/target/cluster}
# The network namespace every process of the cluster runs in; also the name of the cgroup
# under which the kubelet puts its pods (so that down.sh finds this cluster's pods only).
CLUSTER_NETNS=${TETHER_CLUSTER_NETNS:-tether-cluster}

log() { printf '%s cluster: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The folder of tool `name` at `version` in the cache.
tool_dir() { echo "$TOOLS_DIR/$1-$2"; }

# The minor version of a Kubernetes release: v1.37.2 -> 37.
kube_minor() { local v=${1#v1.}; echo "${v%%.*}"; }

# Runs a command in the cluster's network namespace (nsenter, not `ip netns exec`, which
# remounts /sys and hides the cgroups: docs/dev/cluster.md).
in_ns() { nsenter --net="/run/netns/$CLUSTER_NETNS" "$@"; }

# Whether the cluster's network namespace exists.
netns_exists() { ip netns list 2>/dev/null | grep -qw "$CLUSTER_NETNS"; }

# kubectl as the cluster's admin, in its namespace.
kubectl_admin() { in_ns kubectl --kubeconfig "$CLUSTER_STATE/kubeconfig" "$@"; }

# Puts the built tools of Kubernetes `version` (default CLUSTER_KUBERNETES) first on PATH.
use_tools() { PATH=$("$here/tools.sh" --print-bin "${1:-$CLUSTER_KUBERNETES}"):$PATH; export PATH; }

# The cgroups of the cluster's pods, deepest first: the kubelet's cgroup root in every
# hierarchy (cgroup v1) or the one (v2).
cluster_cgroups() {
  local root
  for root in /sys/fs/cgroup/*/"$CLUSTER_NETNS" /sys/fs/cgroup/"$CLUSTER_NETNS"; do
    [ -d "$root" ] && find "$root" -depth -type d
  done
  return 0
}
