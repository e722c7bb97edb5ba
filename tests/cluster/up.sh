#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster as local processes in a network namespace of
# its own (docs/dev/cluster.md): etcd on tmpfs, kube-apiserver (TLS, RBAC, ServiceAccount tokens,
# an audit log), kube-controller-manager, kube-scheduler, containerd with runc, the kubelet,
# kube-proxy (nftables) and a CNI bridge, from the tools tools.sh built; then the images of
# images.sh. down.sh removes all of it.
#
#   tests/cluster/up.sh [v1.<minor>.<patch>]     # default: CLUSTER_KUBERNETES (versions.sh)
#
# Prints the environment to use it: KUBECONFIG, and the namespace to run a client in
# (`nsenter --net=/run/netns/tether-cluster kubectl get nodes`); every address is inside it.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

kubernetes=${1:-$CLUSTER_KUBERNETES}
minor=$(kube_minor "$kubernetes")
use_tools "$kubernetes"
cni_bin=$(tool_dir cni-plugins "$CNI_PLUGINS_VERSION")
for tool in kube-apiserver kubelet etcd containerd runc helm; do
  command -v "$tool" >/dev/null || die "$tool is not built: run make cluster-tools first"
done
[ -x "$cni_bin/bridge" ] || die "the CNI plugins are not built: run make cluster-tools first"
[ "$(id -u)" = 0 ] || die "the kubelet, containerd and the network namespace need root"

# Addresses, all inside the namespace (198.18.0.0/15 is reserved for network tests, RFC 2544).
NODE_NAME=tether-node
NODE_IP=198.18.0.1
POD_CIDR=198.18.128.0/24
POD_GATEWAY=198.18.128.1
SERVICE_CIDR=198.19.0.0/24
KUBERNETES_SERVICE_IP=198.19.0.1
API=https://$NODE_IP:6443

S=$CLUSTER_STATE
pki=$S/pki
logs=$S/logs
pids=$S/pids

# Starts `name` (its command follows) in the namespace, in the background, logging to
# logs/<name>.log; pids/<name> holds its PID (nsenter execs the command: the same process).
start() {
  local name=$1
  shift
  nsenter --net="/run/netns/$CLUSTER_NETNS" "$@" >"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$pids/$name"
}

# Waits up to `seconds` for `command` to succeed; on a timeout prints the end of `name`'s log.
wait_for() {
  local what=$1 seconds=$2 name=$3
  shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$(cat "$pids/$name")" 2>/dev/null; then
      tail -n 30 "$logs/$name.log" >&2 || true
      die "$what: not within ${seconds}s (log: $logs/$name.log)"
    fi
    sleep 0.5
  done
}

# --- the network namespace ---------------------------------------------------------------------

network() {
  ip netns add "$CLUSTER_NETNS"
  ip -n "$CLUSTER_NETNS" link set lo up
  ip -n "$CLUSTER_NETNS" addr add "$NODE_IP/32" dev lo
  # The pods' bridge, made here so that the Service range can be routed to it before the first
  # pod (the CNI bridge plugin takes it over as it is).
  ip -n "$CLUSTER_NETNS" link add tether0 type bridge
  ip -n "$CLUSTER_NETNS" addr add "$POD_GATEWAY/24" dev tether0
  ip -n "$CLUSTER_NETNS" link set tether0 up
  ip -n "$CLUSTER_NETNS" route add "$SERVICE_CIDR" dev tether0
  # Per namespace: forwarding between pods and the node, and bridged traffic through netfilter
  # (a pod reaching a Service whose endpoint is a pod on the same bridge).
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] ||
    die "the kernel has no br_netfilter (/proc/sys/net/bridge): modprobe br_netfilter"
  in_ns sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

# --- certificates and kubeconfigs --------------------------------------------------------------

# A key and a certificate signed by the cluster's CA, a server's when it has SANS, else a
# client's: cert NAME SUBJECT [SANS]
cert() {
  local name=$1 subject=$2 sans=${3:-}
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subject" \
    -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  local ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
  if [ -n "$sans" ]; then
    ext+=$'\n'"extendedKeyUsage=serverAuth"$'\n'"subjectAltName=$sans"
  else
    ext+=$'\n'"extendedKeyUsage=clientAuth"
  fi
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 30 -out "$pki/$name.crt" -extfile <(echo "$ext") 2>/dev/null
  rm -f "$pki/$name.csr"
}

# A kubeconfig for the client certificate `name`: kubeconfig NAME FILE
kubeconfig() {
  cat >"$2" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tether-cluster
  cluster: {server: "$API", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: tether-cluster
  context: {cluster: tether-cluster, user: $1}
current-context: tether-cluster
EOF
}

certificates() {
  mkdir -p "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=tether-cluster-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" \
    "IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  # The API server's client of the kubelets (logs, exec, port-forward): allowed everything by
  # the kubelet's webhook authorization, as kubeadm's `apiserver-kubelet-client` is.
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert kubelet "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
  cert node "/O=system:nodes/CN=system:node:$NODE_NAME"
  cert admin "/O=system:masters/CN=tether-cluster-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kube-proxy "/CN=system:kube-proxy"
  # The ServiceAccount token signing key.
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$pki/sa.key" 2>/dev/null
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  kubeconfig admin "$S/kubeconfig"
  local user
  for user in node controller-manager scheduler kube-proxy; do
    kubeconfig "$user" "$S/$user.kubeconfig"
  done
}

# --- the control plane -------------------------------------------------------------------------

etcd_up() {
  mkdir -p "$S/etcd"
  mount -t tmpfs -o size=2g,mode=0700 tmpfs "$S/etcd"
  start etcd etcd --name tether --data-dir "$S/etcd/data" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster tether=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
    --unsafe-no-fsync --log-level warn
  wait_for "etcd" 30 etcd in_ns curl -sf http://127.0.0.1:2381/health
}

apiserver_up() {
  # Who sent which request for what: every write, and every request of a pod's ServiceAccount
  # outside kube-system (the operator's and the sidecars': the e2e tests count the operator's
  # writes and read the User-Agent of both); the bodies of the writes to McpEndpoints (a status
  # patch that changes nothing shows as the same body twice). Other reads are many and say
  # nothing the tests need.
  cat >"$S/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  userGroups: ["system:serviceaccounts:kube-system", "system:nodes"]
  verbs: [get, list, watch]
- level: Request
  resources: [{group: mcp.tether.dev}]
  verbs: [create, update, patch, delete, deletecollection]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
  verbs: [get, list, watch]
- level: Metadata
EOF
  start kube-apiserver kube-apiserver \
    --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port 6443 \
    --etcd-servers http://127.0.0.1:2379 \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$pki/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --audit-policy-file "$S/audit-policy.yaml" --audit-log-path "$logs/audit.log" \
    --audit-log-maxsize 1024 --audit-log-format json \
    --allow-privileged=false --profiling=false
  wait_for "kube-apiserver ready" 90 kube-apiserver kubectl_admin get --raw /readyz
}

controllers_up() {
  start kube-controller-manager kube-controller-manager \
    --kubeconfig "$S/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$S/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$S/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --service-cluster-ip-range "$SERVICE_CIDR" --cluster-name tether-cluster
  start kube-scheduler kube-scheduler \
    --kubeconfig "$S/scheduler.kubeconfig" \
    --authentication-kubeconfig "$S/scheduler.kubeconfig" \
    --authorization-kubeconfig "$S/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
}

# --- the node ----------------------------------------------------------------------------------

containerd_up() {
  local c=$S/containerd
  mkdir -p "$c" "$S/cni/net.d" "$S/cni/ipam"
  cat >"$S/cni/net.d/10-tether.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tether",
  "plugins": [
    {
      "type": "bridge", "bridge": "tether0", "isGateway": true, "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$S/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
  cat >"$c/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"

[grpc]
  address = "$c/containerd.sock"

[ttrpc]
  address = "$c/containerd.sock.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "$c/opt"

# Nothing outside the state folder: no NRI socket in /var/run, no image verifiers of the host.
[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.image-verifier.v1.bindir']
  bin_dir = "$c/image-verifier"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "tether.local/pause:1"

[plugins.'io.containerd.cri.v1.runtime']
  # root here lacks CAP_SYS_RESOURCE: a sandbox may not lower its own OOM score adjustment.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # No device specifications of the host.
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$c/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$cni_bin"]
    conf_dir = "$S/cni/net.d"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
  start containerd containerd --config "$c/config.toml"
  wait_for "containerd" 30 containerd ctr --address "$c/containerd.sock" version
}

# The kubelet's cgroup root, /$CLUSTER_NETNS in every hierarchy: the pods of this cluster are
# found there and nowhere else (down.sh kills and removes them).
cgroup_root() {
  local mnt
  for mnt in $(awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts); do
    mkdir -p "$mnt/$CLUSTER_NETNS"
    # A cpuset cgroup of cgroup v1 starts with no CPU and no memory node: give it its parent's.
    if [ -e "$mnt/cpuset.cpus" ] && [ -e "$mnt/$CLUSTER_NETNS/cpuset.cpus" ]; then
      cat "$mnt/cpuset.cpus" >"$mnt/$CLUSTER_NETNS/cpuset.cpus"
      cat "$mnt/cpuset.mems" >"$mnt/$CLUSTER_NETNS/cpuset.mems"
    fi
  done
}

kubelet_up() {
  local k=$S/kubelet
  mkdir -p "$k"
  cgroup_root
  # cgroup v1 only on these machines: the kubelet refuses it from Kubernetes 1.35 unless told
  # (`failCgroupV1`, a field from 1.31, where it only warns).
  local cgroup_v1=""
  if [ "$minor" -ge 31 ] && [ ! -e /sys/fs/cgroup/cgroup.controllers ]; then
    cgroup_v1="failCgroupV1: false"
  fi
  cat >"$k/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
$cgroup_v1
cgroupDriver: cgroupfs
cgroupRoot: /$CLUSTER_NETNS
containerRuntimeEndpoint: unix://$S/containerd/containerd.sock
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: ""
failSwapOn: false
# The machine is shared with the build, whose page cache and target directory are no pressure a
# test is about: evict no pod for memory or disk ("0%" turns a signal off), and collect no image.
evictionHard: {memory.available: "0%", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  start kubelet kubelet --config "$k/config.yaml" --kubeconfig "$S/node.kubeconfig" \
    --root-dir "$k/root" --cert-dir "$k/pki" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1
  wait_for "node $NODE_NAME Ready" 120 kubelet \
    kubectl_admin wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
}

proxy_up() {
  local gates=""
  # nftables mode is alpha before 1.31 (off by default), beta and then GA after.
  [ "$minor" -lt 31 ] && gates="featureGates: {NFTablesProxyMode: true}"
  cat >"$S/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
$gates
mode: nftables
clientConnection: {kubeconfig: $S/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The conntrack sysctls are read-only here: leave them as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy kube-proxy --config "$S/kube-proxy.yaml"
  wait_for "kube-proxy" 60 kube-proxy in_ns curl -sf http://127.0.0.1:10256/healthz
}

# --- all of it ---------------------------------------------------------------------------------

if netns_exists; then
  log "a cluster is already up (namespace $CLUSTER_NETNS): taking it down first"
  "$here/down.sh"
fi
rm -rf --one-file-system "$S"
mkdir -p "$S" "$logs" "$pids"
# A cluster that did not come up is taken down (its logs stay), unless asked to keep it.
if [ -z "${TETHER_CLUSTER_KEEP:-}" ]; then
  trap 'log "up failed: taking the cluster down (TETHER_CLUSTER_KEEP=1 keeps it)"; "$here/down.sh"' EXIT
fi
echo "$kubernetes" >"$S/version"
started=$SECONDS
log "Kubernetes $kubernetes in network namespace $CLUSTER_NETNS, state in $S"
network
certificates
etcd_up
apiserver_up
controllers_up
containerd_up
CLUSTER_PROFILE=${CLUSTER_PROFILE:-debug} "$here/images.sh"
kubelet_up
proxy_up
# The `default` ServiceAccount of a namespace comes from the controller-manager; a pod created
# before it exists is refused.
wait_for "the default ServiceAccount" 60 kube-controller-manager kubectl_admin get serviceaccount default
log "up in $((SECONDS - started)) s: $(kubectl_admin version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1)"
{
  printf 'export KUBECONFIG=%q\n' "$S/kubeconfig"
  printf 'export PATH=%q\n' "$PATH"
  echo "# a client must run in the cluster's network namespace:"
  echo "#   nsenter --net=/run/netns/$CLUSTER_NETNS kubectl get nodes"
} >"$S/env"
trap - EXIT
log "use it: . $S/env && nsenter --net=/run/netns/$CLUSTER_NETNS kubectl get pods -A"
