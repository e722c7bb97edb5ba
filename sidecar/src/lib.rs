//! `tether-sidecar`: the per-pod data plane of tether (DESIGN.md §3).
//!
//! A pingora server in front of one MCP server (the upstream) that speaks MCP Streamable HTTP.
//! It admits requests ([`admission`]), mints the client's session ids ([`session_id`]) and maps
//! them to upstream sessions ([`session`]), runs every upstream call in its own task and serves
//! clients from bounded replay buffers ([`stream`], [`buffer`]), so a client that disconnects
//! resumes with `GET` + `Last-Event-ID` ([`cursor`]) and misses nothing.
//!
//! Module map: [`proxy`] (pingora glue) → [`admission`] → [`broker`] (initialize, POST, GET,
//! DELETE, upstream pumps, sweeps) → [`session`] / [`stream`] / [`buffer`]; [`upstream`] is the
//! HTTP client to the MCP server; [`admin`] and [`metrics`] are observability; [`config`] and
//! [`cli`] the start-up, [`reload`] the endpoint file's later changes; [`server`] assembles it
//! all.

pub mod admin;
pub mod admission;
pub mod broker;
pub mod buffer;
pub mod cli;
pub mod config;
pub mod cursor;
pub mod drain;
pub mod handoff;
pub mod headers;
pub mod journal;
pub mod jsonrpc;
pub mod membership;
pub mod metrics;
pub mod origin;
pub mod peer_health;
pub mod proxy;
pub mod reload;
pub mod reply;
pub mod ring;
pub mod routing;
pub mod secret;
pub mod server;
pub mod session;
pub mod session_id;
pub mod shutdown;
pub mod sse;
pub mod stream;
pub mod upstream;
