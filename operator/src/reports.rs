//! Asking the endpoint's sidecars what they loaded of the key ring: `GET /keys` on each pod's
//! admin port, a [`KeyReport`] (`docs/design/peer-trust.md#rotation`). A rotation step waits
//! until every Running pod of the target that carries the sidecar reports the step before; a
//! pod that does not answer in time, answers anything but a report, or has no IP yet has not.
//! [`KeyReports`] is the question, so tests answer it without a network.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use tether_crds::keyring::KeyReport;
use tether_crds::{ADMIN_PORT_NAME, SIDECAR_CONTAINER};

/// How long a sidecar has to answer `GET /keys`.
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest `GET /keys` body read, in bytes.
const MAX_REPORT_BYTES: usize = 64 * 1024;
/// The admin path of the report.
pub const KEYS_PATH: &str = "/keys";

/// What one pod's sidecar reported of the ring it loaded, or why it did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodReport {
    /// The pod's name.
    pub(crate) pod: String,
    /// Its `GET /keys` answer, or why there is none (unreachable, an error status, no report).
    pub(crate) report: Result<KeyReport, String>,
}

/// Asks one sidecar for its key report.
pub trait KeyReports: Send + Sync {
    /// The report of the sidecar whose admin port is at `addr`, or why there is none.
    fn report(&self, addr: SocketAddr) -> BoxFuture<'_, Result<KeyReport, String>>;
}

/// [`KeyReports`] over HTTP/1.1, each answer within a timeout.
#[derive(Clone, Debug)]
pub struct HttpReports {
    timeout: Duration,
}

impl Default for HttpReports {
    fn default() -> Self {
        Self::with_timeout(REPORT_TIMEOUT)
    }
}

impl HttpReports {
    /// Reports that wait at most `timeout` for each answer (connection, head and body).
    pub fn with_timeout(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl KeyReports for HttpReports {
    fn report(&self, addr: SocketAddr) -> BoxFuture<'_, Result<KeyReport, String>> {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, fetch(addr)).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            }
        })
    }
}

/// `GET /keys` from `addr`: the report in a 200's JSON body.
async fn fetch(addr: SocketAddr) -> Result<KeyReport, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("unreachable: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("unreachable: {e}"))?;
    let connection = tokio::spawn(connection);
    let request = http::Request::get(KEYS_PATH)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let answer = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("no answer: {e}"))?;
        let status = response.status();
        if status != http::StatusCode::OK {
            return Err(format!("{KEYS_PATH} answered {}", status.as_u16()));
        }
        let body = Limited::new(response.into_body(), MAX_REPORT_BYTES)
            .collect()
            .await
            .map_err(|e| format!("no whole answer: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("not a key report: {e}"))
    }
    .await;
    connection.abort();
    answer
}

/// The reports of `pods` that count for a rotation — Running, carrying the sidecar — asked of
/// each at once: on the sidecar container's port named `tether-admin`, else `admin_port`.
pub(crate) async fn gather(
    reports: &dyn KeyReports,
    pods: &[Pod],
    admin_port: u16,
) -> Vec<PodReport> {
    let asked = pods.iter().filter_map(|pod| {
        let (name, addr) = counted(pod, admin_port)?;
        Some(async move {
            let report = match addr {
                Ok(addr) => reports.report(addr).await,
                Err(why) => Err(why),
            };
            PodReport { pod: name, report }
        })
    });
    futures::future::join_all(asked).await
}

/// The name and admin address of `pod` when its report counts (Running, with the sidecar), or
/// why it has no address; `None` when it does not count.
fn counted(pod: &Pod, admin_port: u16) -> Option<(String, Result<SocketAddr, String>)> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == SIDECAR_CONTAINER)?;
    let port = sidecar
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(ADMIN_PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(admin_port);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let addr = match status.pod_ip.as_deref().map(str::parse::<IpAddr>) {
        Some(Ok(ip)) => Ok(SocketAddr::new(ip, port)),
        Some(Err(_)) | None => Err("no pod IP yet".to_owned()),
    };
    Some((name, addr))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn pod(name: &str, phase: &str, ip: Option<&str>, sidecar: bool) -> Pod {
        let init = if sidecar {
            json!([{"name": "tether-sidecar", "ports": [{"name": "tether-admin", "containerPort": 9911}]}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"initContainers": init, "containers": [{"name": "server"}]},
            "status": {"phase": phase, "podIP": ip},
        }))
        .unwrap()
    }

    /// Answers from a table of addresses, recording what was asked.
    #[derive(Default)]
    struct Table {
        answers: BTreeMap<SocketAddr, KeyReport>,
        asked: Mutex<Vec<SocketAddr>>,
    }

    impl KeyReports for Table {
        fn report(&self, addr: SocketAddr) -> BoxFuture<'_, Result<KeyReport, String>> {
            self.asked.lock().unwrap().push(addr);
            let answer = self
                .answers
                .get(&addr)
                .cloned()
                .ok_or_else(|| "unreachable".to_owned());
            Box::pin(async move { answer })
        }
    }

    #[tokio::test]
    async fn only_running_pods_with_the_sidecar_count_on_their_admin_port() {
        let report = KeyReport {
            current: "aaaaaaaa".into(),
            ..KeyReport::default()
        };
        let table = Table {
            answers: [("10.0.0.1:9911".parse().unwrap(), report.clone())].into(),
            ..Table::default()
        };
        let pods = [
            pod("a", "Running", Some("10.0.0.1"), true),
            pod("b", "Running", None, true),
            pod("c", "Pending", Some("10.0.0.3"), true),
            pod("d", "Running", Some("10.0.0.4"), false),
            pod("e", "Running", Some("10.0.0.5"), true),
        ];
        let got = gather(&table, &pods, 9901).await;
        let summary: Vec<(String, Result<KeyReport, String>)> =
            got.into_iter().map(|r| (r.pod, r.report)).collect();
        assert_eq!(
            summary,
            [
                ("a".to_owned(), Ok(report)),
                ("b".to_owned(), Err("no pod IP yet".to_owned())),
                ("e".to_owned(), Err("unreachable".to_owned())),
            ]
        );
        let asked: Vec<String> = table
            .asked
            .lock()
            .unwrap()
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(asked, ["10.0.0.1:9911", "10.0.0.5:9911"]);
    }

    /// A server on a loopback port that answers one connection with `response` (or, `None`,
    /// reads the request and never answers); returns its address.
    async fn one_answer(response: Option<&'static str>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 1024];
            let n = stream.read(&mut request).await.unwrap();
            assert!(request[..n].starts_with(b"GET /keys HTTP/1.1\r\n"));
            match response {
                Some(text) => stream.write_all(text.as_bytes()).await.unwrap(),
                None => tokio::time::sleep(Duration::from_secs(5)).await,
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_http_report_is_the_json_of_a_200_and_anything_else_is_not_yet() {
        let body = r#"{"current":"aaaaaaaa","next":"bbbbbbbb","sessions":{"aaaaaaaa":2}}"#;
        let ok: &'static str = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_boxed_str(),
        );
        let http = HttpReports::with_timeout(Duration::from_millis(500));
        let report = http.report(one_answer(Some(ok)).await).await.unwrap();
        assert_eq!(report.next.as_deref(), Some("bbbbbbbb"));
        assert_eq!(report.sessions["aaaaaaaa"], 2);
        let missing = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        let why = http
            .report(one_answer(Some(missing)).await)
            .await
            .unwrap_err();
        assert_eq!(why, "/keys answered 404");
        let junk = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno";
        let why = http.report(one_answer(Some(junk)).await).await.unwrap_err();
        assert!(why.starts_with("not a key report"), "{why}");
        let why = http.report(one_answer(None).await).await.unwrap_err();
        assert!(why.starts_with("no answer within"), "{why}");
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let why = http.report(closed).await.unwrap_err();
        assert!(why.starts_with("unreachable"), "{why}");
    }
}
