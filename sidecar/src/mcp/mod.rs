//! The rules of MCP Streamable HTTP the sidecar applies, as pure functions and types: no state,
//! no I/O (`docs/design/architecture.md#layers`).
//!
//! - [`admission`]: the checks every request passes, with [`origin`] (the allowlist and CORS);
//! - [`jsonrpc`]: envelopes, request ids, error codes;
//! - [`modern`]: a 2026-07-28 request's standard headers checked against its body;
//! - [`rejection`]: the catalogue of errors the sidecar answers itself;
//! - [`methods`]: MCP's method names; [`home`]: the pod a session id or a sealed value names;
//! - [`session_id`]: the client session ids the sidecar mints; [`cursor`]: event ids;
//! - [`headers`]: header names and what passes through; [`sse`]: SSE framing; [`sse_limit`]:
//!   the size bound of an upstream SSE event;
//! - [`sealed`]: the server's values a client holds sealed, naming their pod: task ids
//!   ([`tasks`]) and multi round-trip requests' states ([`mrtr`]).

pub(crate) mod admission;
pub(crate) mod cursor;
pub(crate) mod headers;
pub(crate) mod home;
pub(crate) mod jsonrpc;
pub(crate) mod methods;
pub(crate) mod modern;
pub(crate) mod mrtr;
pub(crate) mod origin;
pub(crate) mod principal;
pub(crate) mod rejection;
pub(crate) mod sealed;
pub(crate) mod session_id;
pub(crate) mod sse;
pub(crate) mod sse_limit;
pub(crate) mod tasks;
