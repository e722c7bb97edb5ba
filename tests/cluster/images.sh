#!/usr/bin/env bash
# Makes the local cluster's images from binaries built on this machine, without a registry or a
# container engine (docs/dev/cluster.md#images), and imports them into the cluster's containerd:
#
#   tether-operator:e2e, tether-sidecar:e2e   the workspace's binaries (target/$CLUSTER_PROFILE)
#   tether-example-server:e2e and :e2e-next   the example MCP server, under two tags (a rollout
#                                             that changes the image)
#   tether.local/pause:1                      the pods' sandbox (tests/cluster/pause)
#
# Each image is one layer holding the binary (debug sections stripped), the shared libraries it
# links and their loader, and the distroless `nonroot` user (65532), written in the `docker save`
# layout that `ctr images import` reads. Run by up.sh once containerd runs.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

CLUSTER_PROFILE=${CLUSTER_PROFILE:-debug}
bin_dir=$repo/target/$CLUSTER_PROFILE
out=$CLUSTER_STATE/images
sock=$CLUSTER_STATE/containerd/containerd.sock
use_tools

# Copies `binary` and what it links into root/ (the libraries at the paths the loader looks in).
install_binary() {
  local binary=$1 root=$2
  mkdir -p "$root/usr/local/bin"
  objcopy --strip-debug "$binary" "$root/usr/local/bin/$(basename "$binary")"
  local lib
  # ldd: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and "/lib64/ld-linux-x86-64.so.2 (0x…)";
  # a static binary has none ("not a dynamic executable").
  for lib in $(ldd "$binary" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    cp -L --parents "$lib" "$root/"
  done
}

# Writes image `ref` (name:tag) whose entrypoint is `binary` as a `docker save` archive; prints
# its path.
write_image() {
  local ref=$1 binary=$2
  local work root layer_sha config config_sha archive
  work=$(mktemp -d)
  root=$work/root
  install_binary "$binary" "$root"
  mkdir -p "$root/etc" "$root/tmp"
  echo "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >"$root/etc/passwd"
  echo "nonroot:x:65532:" >"$root/etc/group"
  chmod 1777 "$root/tmp"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$work/layer.tar" .
  layer_sha=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir -p "$work/archive/$layer_sha"
  mv "$work/layer.tar" "$work/archive/$layer_sha/layer.tar"
  config=$(printf '{"architecture":"%s","os":"linux","config":{"User":"65532:65532","Entrypoint":["/usr/local/bin/%s"],"Env":["PATH=/usr/local/bin:/usr/bin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"tests/cluster/images.sh"}]}' \
    "$(go env GOARCH)" "$(basename "$binary")" "$layer_sha")
  config_sha=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  printf '%s' "$config" >"$work/archive/$config_sha.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
    "$config_sha" "$ref" "$layer_sha" >"$work/archive/manifest.json"
  archive=$out/$(echo "$ref" | tr '/:' '__').tar
  tar -C "$work/archive" -cf "$archive" .
  rm -rf "$work"
  echo "$archive"
}

mkdir -p "$out"
for binary in tether-operator tether-sidecar tether-example-server; do
  [ -x "$bin_dir/$binary" ] || die "$bin_dir/$binary is missing: cargo build --bins${CLUSTER_PROFILE:+ (profile $CLUSTER_PROFILE)} first"
done
(cd "$here/pause" && CGO_ENABLED=0 GOFLAGS= go build -trimpath -ldflags "-s -w" -o "$out/pause" .)

archives=()
for image in tether.local/pause:1=$out/pause tether-operator:e2e=$bin_dir/tether-operator \
  tether-sidecar:e2e=$bin_dir/tether-sidecar \
  tether-example-server:e2e=$bin_dir/tether-example-server \
  tether-example-server:e2e-next=$bin_dir/tether-example-server; do
  # A failed step of write_image fails the script (errexit reaches into $(…), lib.sh).
  archives+=("$(write_image "${image%%=*}" "${image#*=}")")
done
# ctr warns about cgroup v1 on every call: its output goes to a log.
ctr_log=$CLUSTER_STATE/logs/ctr.log
for archive in "${archives[@]}"; do
  ctr --address "$sock" -n k8s.io images import --local "$archive" >>"$ctr_log" 2>&1 ||
    die "ctr images import $archive failed (see $ctr_log)"
done
log "images imported: $(ctr --address "$sock" -n k8s.io images list -q 2>>"$ctr_log" | grep -v '^sha256:' | tr '\n' ' ')"
