//! Writing a [`Reply`] to the client through pingora: status and headers (with CORS), then a
//! full body, an SSE feed or an upstream relay chunk by chunk, each flushed at once. While a relay
//! waits for the MCP server, the client's connection is watched: a client that goes away
//! drops the relay, which cancels its request (spec L-05).

use http::{HeaderValue, StatusCode, header};
use pingora::ErrorType;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use crate::mcp::origin::{OriginCheck, add_response_headers};
use crate::reply::{Relayed, Reply, ReplyBody};
use crate::stream::FeedItem;

/// Writes `reply` with the CORS headers of the request. `Ok(true)` tells pingora the response
/// is complete; an error (the client went away, or a reader fell behind evicted events) drops
/// the connection without a clean end, so the client resumes.
pub(super) async fn write(
    session: &mut Session,
    origin: &OriginCheck,
    reply: Reply,
) -> pingora::Result<bool> {
    let Reply {
        status,
        mut headers,
        body,
    } = reply;
    add_response_headers(&mut headers, origin);
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
            start_chunked(session, head).await?;
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
        ReplyBody::Relay(mut relay) => {
            start_chunked(session, head).await?;
            loop {
                let next = tokio::select! {
                    next = relay.next() => next,
                    // Resolves only when the client closed its connection or stream.
                    left = session.as_downstream_mut().read_body_or_idle(true) => {
                        let reason = left.err().map_or_else(String::new, |e| e.to_string());
                        tracing::debug!(%reason, "the client left; its request is cancelled");
                        return Err(pingora::Error::explain(
                            ErrorType::ConnectionClosed,
                            "the client left before the answer ended",
                        ));
                    }
                };
                match next {
                    Relayed::Data(bytes) => session.write_response_body(Some(bytes), false).await?,
                    Relayed::End => {
                        session.write_response_body(None, true).await?;
                        break;
                    }
                    Relayed::Broken(reason) => {
                        tracing::debug!(%reason, "the MCP server broke its answer off");
                        return Err(pingora::Error::explain(
                            ErrorType::ReadError,
                            "the MCP server broke its answer off",
                        ));
                    }
                }
            }
        }
    }
    Ok(true)
}

/// Writes `head` for a chunked body: the connection stays reusable after a clean end.
async fn start_chunked(session: &mut Session, mut head: ResponseHeader) -> pingora::Result<()> {
    head.insert_header(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    )?;
    session.write_response_header(Box::new(head), false).await
}
