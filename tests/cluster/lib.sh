# Shared by the scripts of tests/cluster/ (docs/dev/cluster.md): where things live, logging, and
# the Go settings every build uses. Sourced, not run.

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
# The network namespace every process of the cluster runs in.
CLUSTER_NETNS=${TETHER_CLUSTER_NETNS:-tether-cluster}

log() { printf '%s cluster: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The folder of tool `name` at `version` in the cache.
tool_dir() { echo "$TOOLS_DIR/$1-$2"; }

# The minor version of a Kubernetes release: v1.37.2 -> 37.
kube_minor() { local v=${1#v1.}; echo "${v%%.*}"; }
