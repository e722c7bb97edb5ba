//! Serving HTTP/1 on hyper, for the workspace's own MCP servers (`tether-example-server`,
//! `tether-bench-origin`): every connection in a task of its own, `TCP_NODELAY` set (small SSE
//! writes must not wait for Nagle's algorithm), until SIGTERM or Ctrl-C — or, for a server
//! inside a test process ([`crate::stand_in`]), until a future of the caller's.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Serves `listener` with `handle` until SIGTERM or Ctrl-C; `name` prefixes the log line of a
/// failed accept (out of file descriptors, say), after which it waits 50 ms and goes on.
///
/// # Errors
/// None so far: the result is the server's exit, `Ok` on a signal.
pub async fn http1<F, Fut, B>(listener: TcpListener, name: &str, handle: F) -> std::io::Result<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    http1_until(listener, name, handle, shutdown_signal()).await
}

/// [`http1`] until `stop` resolves instead of a signal (a server inside a test process, which
/// must leave the process's signals alone).
///
/// # Errors
/// None so far: the result is the server's exit, `Ok` once `stop` resolved.
pub async fn http1_until<F, Fut, B>(
    listener: TcpListener,
    name: &str,
    handle: F,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    tokio::pin!(stop);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("{name}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => return Ok(()),
        };
        let _ = io.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let reply = handle(req);
                async move { Ok::<_, Infallible>(reply.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), service)
                .await;
        });
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
