//! Write-ahead of a request's retry record (`docs/design/replication.md#write-ahead`): a request
//! goes to the MCP server only once its session's replica pod keeps the request's retry record,
//! unless a second dispatch of it is harmless ([`super::rerun`]).
//! A holder lost while the request runs then leaves a record at the pod that promotes the
//! session, which answers a retry of it with an explicit error — never a second dispatch.
//! The wait is installed by the handoff ([`Broker::set_write_ahead`]), so the broker needs no
//! knowledge of the peer protocol.

use std::sync::Arc;

use async_trait::async_trait;

use super::Broker;
use super::rerun::Rerun;
use crate::mcp::jsonrpc::RequestKey;
use crate::session::Session;

/// Waits until the replica pod of a session keeps the retry records of requests about to be
/// dispatched.
#[async_trait]
pub(crate) trait WriteAhead: Send + Sync + std::fmt::Debug {
    /// Resolves once the replica pod of `session` keeps the retry records of `requests`, or
    /// once it is known that it will not (no replica pod, it refused, it did not answer in
    /// time): the request is dispatched then anyway.
    async fn written(&self, session: &Arc<Session>, requests: &[RequestKey]);

    /// Counts `requests` dispatched without waiting: a second dispatch of them is harmless.
    fn spared(&self, requests: &[RequestKey]);
}

impl Broker {
    /// Installs the write-ahead wait.
    pub(crate) fn set_write_ahead(&self, wait: Arc<dyn WriteAhead>) {
        let _ = self.write_ahead.set(wait);
    }

    /// Waits until the replica pod of `session` keeps the records of `requests` (at once
    /// without a write-ahead installed, or when a second dispatch is harmless: `rerun`).
    pub(super) async fn write_ahead(
        &self,
        session: &Arc<Session>,
        requests: &[RequestKey],
        rerun: Rerun,
    ) {
        let Some(wait) = self.write_ahead.get() else {
            return;
        };
        match rerun {
            Rerun::Harmful => wait.written(session, requests).await,
            Rerun::Harmless | Rerun::Lists => wait.spared(requests),
        }
    }
}
