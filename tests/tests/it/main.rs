//! The multi-process integration tests of tether, in one binary: real `tether-sidecar` and
//! `tether-example-server` processes (or the Python SDK fixture, in `python_sdk`) on
//! 127.0.0.0/8 driven by the `tether-tests` harness, plus the check that needs the sidecar's own
//! types (the operator ↔ sidecar contract). One module per area; `docs/dev/testing.md` says how
//! to run one of them.

mod admission;
mod auth;
mod backpressure;
mod bad_input;
mod bench_proxy;
mod conformance;
mod contract;
mod deletion;
mod drain;
mod faults;
mod handoff;
mod leaked_id;
mod membership;
mod mrtr;
mod peer_trust;
mod python_sdk;
mod real_client;
mod replication;
mod request_ids;
mod retention;
mod rollout;
mod routing;
mod sessions;
mod shares;
mod stateless;
mod streams;
mod tasks;
mod upstream_loss;
