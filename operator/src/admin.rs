//! The operator's admin listener: `GET /healthz` (200 while the process runs), `GET /readyz`
//! (200 once the controller runs: the CRD is installed and the API server answered; 503 before),
//! `GET /metrics` (Prometheus text, [`crate::metrics`]); anything else 404.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Default address of the admin listener (`tether-operator run --admin-addr`); the operator
/// image exposes its port.
pub const DEFAULT_ADDR: &str = "0.0.0.0:8080";

/// What the admin listener reports.
#[derive(Debug, Default)]
pub struct AdminState {
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Set once the controller runs.
    pub ready: AtomicBool,
}

/// Serves the admin endpoints on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(answer(&req, &state)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(req: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, content_type: &'static str, body: String| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(content_type),
        );
        resp
    };
    let plain = "text/plain; charset=utf-8";
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, plain, "GET only\n".into());
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, plain, "ok\n".into()),
        "/readyz" if state.ready.load(Ordering::Acquire) => {
            text(StatusCode::OK, plain, "ready\n".into())
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            plain,
            "controller not running yet\n".into(),
        ),
        "/metrics" => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.encode(),
        ),
        _ => text(StatusCode::NOT_FOUND, plain, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::get(path)
            .header(header::HOST, "admin")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(AdminState::default());
        let server = tokio::spawn(serve(listener, Arc::clone(&state)));
        assert_eq!(get(addr, "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get(addr, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.ready.store(true, Ordering::Release);
        assert_eq!(get(addr, "/readyz").await.0, StatusCode::OK);
        state
            .metrics
            .observe(Ok(()), std::time::Duration::from_millis(3));
        state
            .metrics
            .observe(Err("api"), std::time::Duration::from_millis(5));
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("tether_operator_reconciles_total{result=\"ok\"} 1"),
            "{body}"
        );
        assert!(
            body.contains("tether_operator_reconciles_total{result=\"error\"} 1"),
            "{body}"
        );
        assert!(
            body.contains("tether_operator_reconcile_failures_total{reason=\"api\"} 1"),
            "{body}"
        );
        assert!(
            body.contains("tether_operator_reconcile_seconds_count 2"),
            "{body}"
        );
        assert_eq!(get(addr, "/nope").await.0, StatusCode::NOT_FOUND);
        server.abort();
    }
}
