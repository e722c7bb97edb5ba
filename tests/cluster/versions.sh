# Pinned versions of the local cluster's tools (docs/dev/cluster.md), sourced by the scripts of
# tests/cluster/. Each is a Go module built from source by tools.sh; nothing fetched is committed.

# The Kubernetes releases of the matrix: the newest the Go module proxy serves, and the oldest
# the chart supports (charts/tether/Chart.yaml kubeVersion). CLUSTER_KUBERNETES picks one.
KUBERNETES_NEWEST=v1.37.2
KUBERNETES_OLDEST=v1.29.15
CLUSTER_KUBERNETES=${CLUSTER_KUBERNETES:-$KUBERNETES_NEWEST}

ETCD_VERSION=v3.7.3
HELM_VERSION=v4.3.2
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
CNI_PLUGINS_VERSION=v1.10.0
