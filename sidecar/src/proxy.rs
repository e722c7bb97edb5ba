//! The pingora side of the data plane: a [`ProxyHttp`] whose `request_filter` admits every
//! request and serves sessionful ones through the [`Broker`].
//!
//! - Sessionful requests (2025-03-26 … 2025-11-25) are answered by the sidecar itself: the body
//!   is read (bounded in size and time), the broker produces a [`Reply`], and SSE replies are
//!   written event by event from the stream buffer, each chunk flushed at once.
//! - Stateless requests (2026-07-28) take pingora's proxy path to the upstream unchanged, except
//!   that `Mcp-Session-Id` and `Last-Event-ID` are dropped (spec S-10, R-08). A client
//!   disconnect aborts the upstream exchange, which is the cancellation (spec L-05).
//! - Every response, errors included, carries the CORS headers (field report 16).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use pingora::ErrorType;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};

use crate::admission::{Admission, AdmissionPolicy, Era};
use crate::broker::Broker;
use crate::headers::{LAST_EVENT_ID, MCP_SESSION_ID};
use crate::metrics::{RequestLabels, VersionLabel};
use crate::origin::{OriginCheck, add_response_headers};
use crate::reply::{Rejection, Reply, ReplyBody};
use crate::stream::FeedItem;

/// The MCP endpoint service.
pub struct McpProxy {
    broker: Arc<Broker>,
    policy: AdmissionPolicy,
    upstream_addr: String,
    upstream_path: String,
    body_timeout: Duration,
}

impl McpProxy {
    /// `upstream_addr` is `host:port`, `upstream_path` the MCP path there; `body_timeout` bounds
    /// how long a request body may take to arrive (slow clients get 408).
    pub fn new(
        broker: Arc<Broker>,
        policy: AdmissionPolicy,
        upstream_addr: String,
        upstream_path: String,
        body_timeout: Duration,
    ) -> Self {
        Self {
            broker,
            policy,
            upstream_addr,
            upstream_path,
            body_timeout,
        }
    }

    /// Reads the whole request body, at most `max_body_bytes` within `body_timeout`.
    async fn read_body(&self, session: &mut Session) -> Result<Bytes, Rejection> {
        let limit = self.policy.max_body_bytes;
        let read = async {
            let mut body = BytesMut::new();
            while let Some(chunk) = session
                .read_request_body()
                .await
                .map_err(|_| Rejection::InvalidRequest("the request body broke off".into()))?
            {
                if body.len() + chunk.len() > limit {
                    return Err(Rejection::PayloadTooLarge(limit));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(body.freeze())
        };
        tokio::time::timeout(self.body_timeout, read)
            .await
            .unwrap_or(Err(Rejection::RequestTimeout))
    }
}

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    origin: OriginCheck,
    body_bytes: usize,
    /// The response was already (partly) written by us; errors need no further answer.
    answered: bool,
}

#[async_trait]
impl ProxyHttp for McpProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            origin: OriginCheck::Missing,
            body_bytes: 0,
            answered: false,
        }
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        // Serve HTTP/1.1 pipelined requests in order instead of dropping them (RFC 9112 §9.3.2).
        session.set_pipelining_enabled(true);
        Ok(())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let req = session.req_header();
        let (method, path, headers) = (
            req.method.clone(),
            req.uri.path().to_owned(),
            req.headers.clone(),
        );
        let metrics = self.broker.metrics();
        let admitted = match self.policy.admit(&method, &path, &headers) {
            Err(refused) => {
                if refused.rejection == Rejection::OriginForbidden {
                    metrics.origin_rejections.inc();
                }
                self.broker.count_rejection(&refused.rejection);
                ctx.origin = refused.origin;
                return respond(session, ctx, refused.rejection.into()).await;
            }
            Ok(Admission::Preflight(headers)) => {
                let reply = Reply {
                    status: StatusCode::NO_CONTENT,
                    headers,
                    body: ReplyBody::Empty,
                };
                return respond(session, ctx, reply).await;
            }
            Ok(Admission::Request(admitted)) => admitted,
        };
        ctx.origin = admitted.origin.clone();
        metrics
            .requests
            .get_or_create(&RequestLabels {
                method: method_label(&admitted.method),
                era: admitted.era.label(),
            })
            .inc();
        if admitted.era == Era::Stateless {
            if let Some(v) = admitted.version {
                metrics
                    .protocol_versions
                    .get_or_create(&VersionLabel {
                        version: v.as_str(),
                    })
                    .inc();
            }
            return Ok(false);
        }
        let body = match self.read_body(session).await {
            Ok(body) => body,
            Err(rejection) => {
                self.broker.count_rejection(&rejection);
                session.set_keepalive(None);
                return respond(session, ctx, rejection.into()).await;
            }
        };
        let reply = self.broker.handle(admitted, body).await;
        respond(session, ctx, reply).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream_addr.as_str(),
            false,
            String::new(),
        )))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        _ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        upstream_request.remove_header(&MCP_SESSION_ID);
        upstream_request.remove_header(&LAST_EVENT_ID);
        let path_and_query = match upstream_request.uri.query() {
            Some(q) => format!("{}?{q}", self.upstream_path),
            None => self.upstream_path.clone(),
        };
        let uri = path_and_query
            .parse()
            .map_err(|_| pingora::Error::explain(ErrorType::InvalidHTTPHeader, "upstream path"))?;
        upstream_request.set_uri(uri);
        upstream_request.insert_header(header::HOST, self.upstream_addr.as_str())?;
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        ctx.body_bytes += body.as_ref().map_or(0, Bytes::len);
        if ctx.body_bytes > self.policy.max_body_bytes {
            return Err(pingora::Error::explain(
                ErrorType::HTTPStatus(413),
                "request body too large",
            ));
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        // Stateless traffic never carries a session id (spec S-10); one the upstream opened
        // anyway is ended.
        if let Some(id) = upstream_response
            .headers
            .get(&MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            self.broker.abandon_upstream_session(id.to_owned());
        }
        upstream_response.remove_header(&MCP_SESSION_ID);
        let mut cors = http::HeaderMap::new();
        add_response_headers(&mut cors, &ctx.origin);
        for (name, value) in &cors {
            upstream_response.insert_header(name.clone(), value.clone())?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora::Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if ctx.answered || session.response_written().is_some() {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let rejection = match e.etype() {
            ErrorType::HTTPStatus(413) => Rejection::PayloadTooLarge(self.policy.max_body_bytes),
            ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
                Rejection::UpstreamTimeout
            }
            _ => Rejection::UpstreamUnavailable,
        };
        self.broker.count_rejection(&rejection);
        let code = rejection.status().as_u16();
        let _ = respond(session, ctx, rejection.into()).await;
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(
        &self,
        _session: &Session,
        ctx: &RequestCtx,
        _error: &pingora::Error,
    ) -> bool {
        // Errors after we answered are client disconnects or lost readers, logged at debug.
        ctx.answered
    }
}

fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

/// Writes `reply` with the CORS headers of the request. `Ok(true)` tells pingora the response
/// is complete; an error (the client went away, or a reader fell behind evicted events) drops
/// the connection without a clean end, so the client resumes.
async fn respond(
    session: &mut Session,
    ctx: &mut RequestCtx,
    reply: Reply,
) -> pingora::Result<bool> {
    ctx.answered = true;
    let Reply {
        status,
        mut headers,
        body,
    } = reply;
    add_response_headers(&mut headers, &ctx.origin);
    let mut head = ResponseHeader::build(status, Some(headers.len() + 1))?;
    for (name, value) in &headers {
        head.append_header(name.clone(), value.clone())?;
    }
    match body {
        ReplyBody::Empty => {
            if status != StatusCode::NO_CONTENT && status != StatusCode::NOT_MODIFIED {
                head.insert_header(header::CONTENT_LENGTH, HeaderValue::from_static("0"))?;
            }
            session.write_response_header(Box::new(head), true).await?;
        }
        ReplyBody::Full(bytes) => {
            head.insert_header(header::CONTENT_LENGTH, bytes.len())?;
            session.write_response_header(Box::new(head), false).await?;
            session.write_response_body(Some(bytes), true).await?;
        }
        ReplyBody::Sse(mut feed) => {
            // Chunked, so the connection stays reusable after a clean end.
            head.insert_header(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            )?;
            session.write_response_header(Box::new(head), false).await?;
            loop {
                match feed.next().await {
                    FeedItem::Data(bytes) => {
                        session.write_response_body(Some(bytes), false).await?
                    }
                    FeedItem::End => {
                        session.write_response_body(None, true).await?;
                        break;
                    }
                    FeedItem::Lost => {
                        tracing::debug!(
                            "reader fell behind evicted events; dropping the connection"
                        );
                        return Err(pingora::Error::explain(
                            ErrorType::WriteError,
                            "events for this reader were evicted",
                        ));
                    }
                }
            }
        }
    }
    Ok(true)
}
