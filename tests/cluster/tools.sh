#!/usr/bin/env bash
# Builds the local cluster's tools from source, at the versions of versions.sh, into the cache
# (docs/dev/cluster.md#tools): Kubernetes (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl), etcd, helm, containerd with its runc shim and
# ctr, runc, and the CNI plugins. A tool already built by the same recipe is not built again.
#
#   tests/cluster/tools.sh                 # the Kubernetes of CLUSTER_KUBERNETES and the rest
#   tests/cluster/tools.sh v1.29.15        # another Kubernetes release (and the rest)
#   tests/cluster/tools.sh --print-bin     # the folders of the built tools, for PATH
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# The go.mod of module@version, downloaded into the module cache; prints its path.
gomod_of() {
  go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p'
}

# Builds packages of module@version into the tool's folder from a wrapper module that requires
# it, so the module's own requirements pin every dependency (its replace directives to local
# folders cannot apply outside its repository: `replaces` adds those the wrapper needs instead).
#   build NAME MODULE VERSION "PACKAGES" [CGO=0|1] [TAGS] [LDFLAGS] [REPLACES]
# PACKAGES is a list of main packages, or one written BINARY=PACKAGE to name its binary.
build() {
  local name=$1 module=$2 version=$3 packages=$4 cgo=${5:-0} tags=${6:-} ldflags=${7:-} replaces=${8:-}
  local out wrapper stamp
  out=$(tool_dir "$name" "$version")
  # The recipe: a tool is built again when any of it changes.
  stamp="$out/.built-$(echo "$*" "$(go env GOVERSION)" | sha256sum | cut -c1-16)"
  if [ -e "$stamp" ]; then
    return
  fi
  wrapper=$CLUSTER_CACHE/src/$name-$version
  log "building $name $version ($module: $packages)"
  rm -rf "$out" "$wrapper"
  mkdir -p "$out" "$wrapper"
  local gomod
  gomod=$(gomod_of "$module" "$version")
  [ -n "$gomod" ] || die "no go.mod for $module@$version from the module proxy"
  {
    echo "module tether.local/cluster-tools/$name"
    echo
    # The module's own Go language version and GODEBUG defaults, as its release binaries have.
    awk '/^go / || /^godebug [^(]/ {print} /^godebug \($/ {block = 1} block {print} block && /^\)/ {block = 0}' "$gomod"
    echo
    echo "require $module $version"
    if [ -n "$replaces" ]; then
      echo
      echo "replace ("
      printf '%s\n' "$replaces"
      echo ")"
    fi
  } >"$wrapper/go.mod"
  local started=$SECONDS
  # A package named NAME=PACKAGE is written as NAME (etcd's main package is go.etcd.io/etcd/server/v3).
  local target=$out/
  case $packages in *=*) target=$out/${packages%%=*}; packages=${packages#*=} ;; esac
  # shellcheck disable=SC2086 # packages is a list
  (cd "$wrapper" && CGO_ENABLED=$cgo go build -tags "$tags" -ldflags "-s -w $ldflags" \
    -o "$target" $packages)
  touch "$stamp"
  log "built $name $version in $((SECONDS - started)) s: $(cd "$out" && echo *)"
}

# Kubernetes: k8s.io/kubernetes replaces its 30-odd staging modules (k8s.io/api, client-go, …)
# with folders of its own repository (`=> ./staging/src/k8s.io/api`); each is published as
# k8s.io/<name> at v0.<minor>.<patch>, which the wrapper names instead. The list comes from the
# release's own go.mod, so it stays right for every release.
build_kubernetes() {
  local version=$1
  local staging=v0${version#v1}
  local gomod replaces
  gomod=$(gomod_of k8s.io/kubernetes "$version")
  replaces=$(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$gomod")
  [ -n "$replaces" ] || die "k8s.io/kubernetes $version: no staging replaces in its go.mod"
  # What `kubectl version` and the API server's /version say (else v0.0.0-master).
  local minor ldflags="" pkg
  minor=$(kube_minor "$version")
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local cmds="" cmd
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    cmds+=" k8s.io/kubernetes/cmd/$cmd"
  done
  build kubernetes k8s.io/kubernetes "$version" "$cmds" 0 "" "$ldflags" "$replaces"
}

build_all() {
  local kubernetes=$1
  # The tools without cgo first; runc last (it needs libseccomp's headers).
  build_kubernetes "$kubernetes"
  build etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "etcd=go.etcd.io/etcd/server/v3"
  build helm helm.sh/helm/v4 "$HELM_VERSION" "helm.sh/helm/v4/cmd/helm"
  build containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr" \
    0 "no_btrfs no_devmapper no_zfs"
  # The pods' network: a bridge, its addresses from host-local, and each pod's loopback.
  build cni-plugins github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/ipam/host-local"
  build runc github.com/opencontainers/runc "$RUNC_VERSION" "github.com/opencontainers/runc" 1 seccomp
}

# The folders holding the built tools' binaries, colon-separated (for PATH).
print_bin() {
  local kubernetes=$1
  local dirs=(
    "$(tool_dir kubernetes "$kubernetes")" "$(tool_dir etcd "$ETCD_VERSION")"
    "$(tool_dir helm "$HELM_VERSION")" "$(tool_dir containerd "$CONTAINERD_VERSION")"
    "$(tool_dir runc "$RUNC_VERSION")"
  )
  (IFS=:; echo "${dirs[*]}")
}

# One build at a time per cache (a second waits).
mkdir -p "$CLUSTER_CACHE"
exec 9>"$CLUSTER_CACHE/.lock"
case "${1:-}" in
  --print-bin) ;;
  *) flock 9 ;;
esac

case "${1:-}" in
  --print-bin) print_bin "${2:-$CLUSTER_KUBERNETES}" ;;
  "") build_all "$CLUSTER_KUBERNETES" ;;
  v1.*) build_all "$1" ;;
  *) die "usage: tools.sh [v1.<minor>.<patch>] | --print-bin [v1.<minor>.<patch>]" ;;
esac
