//! The operator against an in-memory API server that behaves like a Kubernetes one
//! (`tether_fake_kube`, enforcing the operator's RBAC rules through [`support`]), in one test binary: that server itself (`api_server`), who may make the
//! operator write (`admission`), whole reconciles
//! (`reconcile`), what a real cluster does to the operator (`cluster`), Events (`events`),
//! leader election (`leader`), the example manifests with `tether-operator plan`
//! (`examples`), the key ring and its rotation (`keys`), and what a platform team meets over an
//! endpoint's life (`lifecycle`). The real-cluster tests are the gated `e2e` binary.

mod admission;
mod api_server;
mod cluster;
mod events;
mod examples;
mod keys;
mod leader;
mod lifecycle;
mod reconcile;
mod support;
