#!/usr/bin/env bash
# The real-cluster tests (operator/tests/e2e, docs/dev/e2e.md) on the local cluster: up.sh, then
# `cargo test --workspace --test e2e` inside the cluster's network namespace with the
# settings that name its kubeconfig, images and audit log, then down.sh whatever happened
# (TETHER_CLUSTER_KEEP=1 keeps the cluster). Extra arguments go to the test binary (a test's
# name, --nocapture).
#
#   tests/cluster/e2e.sh [-- <test binary arguments>]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

[ "${1:-}" = "--" ] && shift
kubernetes=$CLUSTER_KUBERNETES
if [ -z "${TETHER_CLUSTER_KEEP:-}" ]; then
  trap '"$here/down.sh"' EXIT
fi
"$here/up.sh" "$kubernetes"
use_tools "$kubernetes"

S=$CLUSTER_STATE
# What a failure needs to be understood, from the cluster itself.
diagnose() {
  log "diagnostics (logs of the cluster's processes: $S/logs)"
  kubectl_admin get nodes,pods -A -o wide || true
  kubectl_admin get mcpendpoints -A || true
  kubectl_admin -n tether-e2e-system logs -l app.kubernetes.io/name=tether --tail 40 --prefix || true
  # Why a pod was evicted or failed, and what the kubelet's eviction manager saw.
  kubectl_admin get pods -A --field-selector=status.phase=Failed \
    -o custom-columns=NAMESPACE:.metadata.namespace,POD:.metadata.name,REASON:.status.reason,MESSAGE:.status.message ||
    true
  grep -i "eviction manager" "$S/logs/kubelet.log" | grep -iv "summary stats\|control loop\|separate container" |
    tail -20 || true
}

log "e2e: Kubernetes $kubernetes, ${E2E_TEST_THREADS:-3} tests at a time"
started=$SECONDS
status=0
in_ns env \
  TETHER_E2E_KUBECONFIG="$S/kubeconfig" \
  TETHER_E2E_OPERATOR_IMAGE=tether-operator:e2e \
  TETHER_E2E_SIDECAR_IMAGE=tether-sidecar:e2e \
  TETHER_E2E_SERVER_IMAGE=tether-example-server:e2e \
  TETHER_E2E_SERVER_NEXT_IMAGE=tether-example-server:e2e-next \
  TETHER_E2E_AUDIT_LOG="$S/logs/audit.log" \
  TETHER_E2E_IN_CLUSTER_NETWORK=1 \
  "${CARGO:-cargo}" test --offline --workspace --test e2e -- --test-threads="${E2E_TEST_THREADS:-3}" "$@" ||
  status=$?
if [ "$status" != 0 ]; then
  diagnose
fi
log "e2e on Kubernetes $kubernetes: $([ "$status" = 0 ] && echo passed || echo FAILED) in $((SECONDS - started)) s"
exit "$status"
