//! MCP traffic through the endpoint's client Service `<name>-mcp`, with the harness's client
//! (`tether_tests::client`, `call`, `load`): a test process in the cluster's network reaches the
//! Service at its ClusterIP (kube-proxy picks a pod for each connection, as for an in-cluster
//! client); one outside it, through the API server's service proxy
//! (`/api/v1/namespaces/<ns>/services/<name>-mcp:mcp/proxy/…`), which sends each request to one
//! of the Service's endpoints. Either way every request depends on the Service's selector and
//! ports. The example servers' own count of executions comes from their
//! logs ([`ServerLogs`]). And the Services' EndpointSlices themselves.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt};
use http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams};
use tether_crds::MCP_PORT_NAME;
use tether_tests::call::{self, CallPlan};
use tether_tests::client::{McpClient, result_text};
use tether_tests::load::{self, Executions, LoadConfig};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, EXAMPLE_PODS, Outcome, wait_until};

/// The protocol version the sessions ask for.
const VERSION: &str = "2025-11-25";
/// How long a report that has failures already waits for the servers' execution lines.
const FAILED_RUN_LOG_WAIT: Duration = Duration::from_secs(10);

/// A local plain-HTTP address whose every request goes to a Service port through the API
/// server's service proxy; stops when dropped.
pub(crate) struct ServiceProxy {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Headers of one hop only, not forwarded.
const HOP: [header::HeaderName; 4] = [
    header::CONNECTION,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
];

impl ServiceProxy {
    /// A proxy to port `port` (its name) of Service `service` of `ns`.
    pub async fn start(client: &Client, ns: &str, service: &str, port: &str) -> Outcome<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let prefix = format!("/api/v1/namespaces/{ns}/services/{service}:{port}/proxy");
        let client = client.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (client, prefix) = (client.clone(), prefix.clone());
                let forward = hyper::service::service_fn(move |req| {
                    forward(client.clone(), prefix.clone(), req)
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), forward),
                );
            }
        });
        Ok(Self { url, task })
    }
}

/// Sends `req` to the service proxy path under `prefix`; the answer streams back as it comes
/// (SSE included), and dropping it closes the request upstream.
async fn forward(
    client: Client,
    prefix: String,
    req: Request<Incoming>,
) -> Result<Response<kube::client::Body>, Infallible> {
    let failed = |status: StatusCode, e: String| {
        let mut resp = Response::new(kube::client::Body::from(e.into_bytes()));
        *resp.status_mut() = status;
        Ok(resp)
    };
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return failed(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut upstream = Request::builder()
        .method(parts.method)
        .uri(format!("{prefix}{path}"));
    for (name, value) in parts.headers.iter().filter(|(n, _)| !HOP.contains(n)) {
        upstream = upstream.header(name, value);
    }
    let upstream = match upstream.body(kube::client::Body::from(body)) {
        Ok(r) => r,
        Err(e) => return failed(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match client.send(upstream).await {
        Ok(mut resp) => {
            for name in &HOP {
                resp.headers_mut().remove(name);
            }
            Ok(resp)
        }
        Err(e) => failed(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

/// An MCP client of endpoint `name`'s client Service: at its ClusterIP, through kube-proxy, as
/// an in-cluster client, when the test process runs in the cluster's network
/// (`TETHER_E2E_IN_CLUSTER_NETWORK`); else through the API server's service proxy returned
/// with it (the client works while the proxy is kept).
async fn mcp_client(
    cluster: &Cluster,
    ns: &str,
    name: &str,
) -> Outcome<(Option<ServiceProxy>, McpClient)> {
    let service = format!("{name}-mcp");
    let (proxy, url) = if cluster.settings.in_cluster_network {
        let spec = Api::<Service>::namespaced(cluster.client.clone(), ns)
            .get(&service)
            .await?
            .spec
            .unwrap_or_default();
        let ip = spec
            .cluster_ip
            .ok_or("a client Service without a ClusterIP")?;
        let port = spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(MCP_PORT_NAME))
            .ok_or("a client Service without its mcp port")?
            .port;
        // kube-proxy programs a new Service a moment after it exists.
        let address = format!("{ip}:{port}");
        wait_until(
            &format!("Service {service} at {address}"),
            cluster.settings.timeout,
            async || {
                let connect = tokio::net::TcpStream::connect(&address);
                match tokio::time::timeout(Duration::from_secs(2), connect).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("no answer within 2 s".to_owned()),
                }
            },
        )
        .await?;
        (None, format!("http://{address}"))
    } else {
        let proxy = ServiceProxy::start(&cluster.client, ns, &service, MCP_PORT_NAME).await?;
        let url = proxy.url.clone();
        (Some(proxy), url)
    };
    let client = McpClient::new(format!("{url}/mcp")).honouring_retry_after();
    Ok((proxy, client))
}

/// The example servers' executions of tool calls, counted from the `executed "<call_id>"` lines
/// their `server` containers print (`--log-calls`, which the tests' Deployments pass): the log
/// of every pod of the example Deployment is followed from its container's start, those of
/// pods created later included, until this is dropped. A call executed on two pods (a retry
/// run again after a handoff, say) is counted twice, though both pods are gone by then.
pub(crate) struct ServerLogs {
    executions: Arc<Mutex<Executions>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ServerLogs {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ServerLogs {
    /// Starts following the example pods of `ns`.
    pub fn follow(client: &Client, ns: &str) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let executions = Arc::new(Mutex::new(Executions::default()));
        let counted = Arc::clone(&executions);
        let task = tokio::spawn(async move {
            let mut followed = HashSet::new();
            let mut followers = tokio::task::JoinSet::new();
            loop {
                let listed = pods.list(&ListParams::default().labels(EXAMPLE_PODS)).await;
                for pod in listed.into_iter().flat_map(|l| l.items) {
                    let Some(name) = pod.metadata.name else {
                        continue;
                    };
                    if followed.insert(name.clone()) {
                        followers.spawn(follow(pods.clone(), name, Arc::clone(&counted)));
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { executions, task }
    }

    /// Counts into `report` the calls executed more than once, once the logs hold an execution
    /// for each of its tool calls (a log line arrives after the answer): waits at most
    /// `timeout`, or [`FAILED_RUN_LOG_WAIT`] when the report has failures already (a call
    /// whose request never reached a server is never logged). Logs that were not read cannot
    /// pass for calls executed once: a shortfall is a failure of the report.
    pub async fn count_executions(&self, report: &mut load::Report, timeout: Duration) {
        let counted = || {
            self.executions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        let timeout = if report.failures.is_empty() {
            timeout
        } else {
            FAILED_RUN_LOG_WAIT
        };
        let calls = report.tool_calls;
        let logged = wait_until("an execution logged for every call", timeout, async || {
            let total = counted().total();
            if total >= calls {
                Ok(())
            } else {
                Err(format!("{total} of {calls} calls"))
            }
        })
        .await;
        if let Err(e) = logged {
            report.failures.push(e.to_string());
        }
        report.executed_twice = counted().executed_twice();
    }
}

/// Follows the `server` container's log of pod `name` from its start (waiting until it has
/// one) to its end, recording each execution it prints.
async fn follow(pods: Api<Pod>, name: String, executions: Arc<Mutex<Executions>>) {
    let params = LogParams {
        container: Some("server".to_owned()),
        follow: true,
        ..LogParams::default()
    };
    // Before the container starts the API server answers 400; the pod may go before it does.
    let stream = loop {
        match pods.log_stream(&name, &params).await {
            Ok(stream) => break stream,
            Err(_) if matches!(pods.get_opt(&name).await, Ok(Some(_))) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(_) => return,
        }
    };
    let mut lines = stream.lines();
    while let Some(Ok(line)) = lines.next().await {
        if let Some(call_id) = executed(&line) {
            executions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .record(&call_id);
        }
    }
}

/// The call id of an `executed "<call_id>"` line (the id as Rust's `Debug` quotes it).
fn executed(line: &str) -> Option<String> {
    let quoted = line.strip_prefix("executed ")?;
    serde_json::from_str(quoted).ok()
}

/// MCP sessions calling through an endpoint's client Service in a task of their own, until
/// [`Load::finish`].
pub(crate) struct Load {
    running: tokio::task::JoinHandle<load::Report>,
    stop: CancellationToken,
}

impl Load {
    /// Ends the load (each session finishes its call and deletes itself): what the clients saw.
    pub async fn finish(self) -> Outcome<load::Report> {
        self.stop.cancel();
        Ok(self.running.await?)
    }

    /// Ends the load at once, its report unread.
    pub fn abort(self) {
        self.running.abort();
    }
}

/// Starts sessions (`TETHER_E2E_LOAD_SESSIONS`, 12 by default) calling `slow` through endpoint
/// `name`'s client Service until [`Load::finish`], 3 calls each at least, of 10 progress events
/// 300 ms apart, 30 % of the streams cut and resumed; returns once they run.
pub(crate) async fn load_through(cluster: &Cluster, ns: &str, name: &str) -> Outcome<Load> {
    load_of(cluster, ns, name, |client| client).await
}

/// [`load_through`] with the clients `client` makes of the standard one.
pub(crate) async fn load_of(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    client: impl FnOnce(McpClient) -> McpClient,
) -> Outcome<Load> {
    let (proxy, standard) = mcp_client(cluster, ns, name).await?;
    let client = client(standard);
    let sessions = cluster.settings.load_sessions;
    let cfg = LoadConfig {
        sessions,
        calls_per_session: 3,
        count: 10,
        interval_ms: 300,
        cut_probability: 0.3,
        max_pause_ms: 200,
        concurrency: sessions,
        versions: vec![VERSION.to_owned()],
    };
    let stop = CancellationToken::new();
    let until = stop.clone();
    let running = tokio::spawn(async move {
        let _proxy = proxy;
        load::run_until(&client, &cfg, until).await
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(Load { running, stop })
}

/// How [`roll_under_load`] makes the Deployment controller replace every pod.
pub(crate) enum Rollout<'a> {
    /// A new pod-template annotation, as `kubectl rollout restart` writes.
    Restart,
    /// Another image of the MCP server's container, as `kubectl set image` writes.
    Image(&'a str),
}

/// Rolls Deployment `target` of endpoint `name` as `rollout` says while sessions call `slow`
/// through its client Service (cutting and resuming some streams), until the old pods are gone;
/// returns what the clients saw, with the example servers' executions counted from their logs.
pub(crate) async fn roll_under_load(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    target: &str,
    rollout: Rollout<'_>,
) -> Outcome<load::Report> {
    let logs = ServerLogs::follow(&cluster.client, ns);
    let load = load_through(cluster, ns, name).await?;
    let started = Instant::now();
    match rollout {
        Rollout::Restart => cluster.restart(ns, target).await?,
        Rollout::Image(image) => {
            let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [
                {"name": "server", "image": image}]}}}});
            cluster
                .deployments(ns)
                .patch(target, &PatchParams::default(), &Patch::Strategic(&patch))
                .await?;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.wait_rolled(ns, target).await?;
    let rolled = started.elapsed();
    // The old pods serve until `spec.drain.shutdownDelay` has passed: the load goes on until
    // they are gone.
    cluster.wait_no_terminating_pods(ns).await?;
    let mut report = load.finish().await?;
    logs.count_executions(&mut report, cluster.settings.timeout)
        .await;
    eprintln!(
        "e2e: rollout of {target} in {rolled:?} under load:\n{}",
        report.table()
    );
    Ok(report)
}

/// Fails unless `report` is clean ([`load::Report::is_clean`]): no 404, no event lost,
/// duplicated or of another stream, no tool executed twice, no client error.
pub(crate) fn clean(report: &load::Report, after: &str) -> Outcome {
    if report.sessions == 0 || !report.is_clean() {
        return Err(format!(
            "after {after}:\n{}\nfailures: {:?}",
            report.table(),
            report.failures
        )
        .into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_through_the_client_service_calls_tools_and_resumes_a_cut_stream() {
    crate::scenario(&[], async |cluster, ns| {
        let target = cluster.serve(ns, "weather", serde_json::json!({})).await?;
        let (_proxy, client) = mcp_client(cluster, ns, "weather").await?;
        let session = client.initialize(VERSION).await?;
        let counted = client
            .call(&session, 2, "counter", serde_json::json!({}))
            .await?;
        let text = counted.last().and_then(result_text);
        if text != Some("1") {
            return Err(format!("counter answered {counted:?}").into());
        }
        // Cut twice, resumed each time with GET + Last-Event-ID, through another pod maybe.
        let plan = CallPlan {
            cuts: vec![3, 7],
            pause: Duration::from_millis(500),
            ..CallPlan::steady(10, 200)
        };
        let out = call::slow(&client, &session, 3, "e2e-cut", &plan).await?;
        // Every event once, whatever the number of resumes: a resume that itself loses its
        // connection (a pod's proxy path closing, say) is resumed again, as clients do.
        let whole = out.lost(10) == 0 && out.duplicated == 0 && out.foreign == 0;
        if !whole || out.resumes.len() < 2 || !out.failures.is_empty() {
            return Err(format!("the resumed call of {target}'s endpoint: {out:?}").into());
        }
        eprintln!("e2e: a session called counter and slow, cut twice and resumed");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_of_the_server_shows_clients_no_404() {
    crate::scenario(&[], async |cluster, ns| {
        let target = cluster.serve(ns, "weather", serde_json::json!({})).await?;
        let report = roll_under_load(cluster, ns, "weather", &target, Rollout::Restart).await?;
        clean(&report, "kubectl rollout restart")?;
        // The release a platform team rolls out: a new image of the MCP server.
        let Some(next) = cluster.settings.server_next_image.clone() else {
            eprintln!("e2e: no TETHER_E2E_SERVER_NEXT_IMAGE: the image change is not tried");
            return Ok(());
        };
        let report =
            roll_under_load(cluster, ns, "weather", &target, Rollout::Image(&next)).await?;
        clean(&report, &format!("the image change to {next}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_and_peer_services_have_endpoints_with_ports() {
    crate::scenario(&[], async |cluster, ns| {
        cluster.serve(ns, "weather", serde_json::json!({})).await?;
        let pods = cluster.pods(ns, EXAMPLE_PODS).await?.len();
        let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), ns);
        // Both Services, with the ports the sidecar listens on (spec defaults).
        for (service, ports) in [
            ("weather-mcp", &[8080][..]),
            ("weather-peers", &[9902, 8080]),
        ] {
            let selector = format!("kubernetes.io/service-name={service}");
            let listed = slices
                .list(&ListParams::default().labels(&selector))
                .await?;
            let endpoints: usize = listed.items.iter().map(|s| s.endpoints.len()).sum();
            let mut numbers: Vec<i32> = listed
                .items
                .iter()
                .flat_map(|s| s.ports.iter().flatten())
                .filter_map(|p| p.port)
                .collect();
            numbers.sort_unstable();
            numbers.dedup();
            let mut want = ports.to_vec();
            want.sort_unstable();
            if endpoints < pods || numbers != want {
                return Err(format!(
                    "Service {service}: {endpoints} endpoints for {pods} pods, ports \
                     {numbers:?} (want {want:?}); a named targetPort the EndpointSlice \
                     controller cannot resolve leaves them out"
                )
                .into());
            }
        }
        Ok(())
    })
    .await;
}

/// The proxy on its own, against a stand-in API server: paths and headers reach it, and an SSE
/// answer streams back event by event (runs without a cluster).
#[tokio::test]
async fn the_service_proxy_forwards_requests_and_streams_answers() {
    use bytes::Bytes;
    use futures::channel::{mpsc, oneshot};
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", api.local_addr().unwrap());
    let (go_on, resume) = oneshot::channel::<()>();
    let resume = std::sync::Mutex::new(Some(resume));
    tokio::spawn(async move {
        let (stream, _) = api.accept().await.unwrap();
        let answer = hyper::service::service_fn(move |req: Request<Incoming>| {
            let seen = format!(
                "{} {}",
                req.uri(),
                req.headers()["mcp-session-id"].to_str().unwrap()
            );
            let (tx, rx) = mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
            let resume = resume.lock().unwrap().take().unwrap();
            tokio::spawn(async move {
                let event = |data: &str| Ok(Frame::data(Bytes::from(format!("data: {data}\n\n"))));
                tx.unbounded_send(event(&seen)).unwrap();
                let _ = resume.await;
                tx.unbounded_send(event("second")).unwrap();
            });
            let mut resp = Response::new(StreamBody::new(rx));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
            async { Ok::<_, Infallible>(resp) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), answer)
            .await;
    });
    let config = kube::Config::new(api_url.parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let proxy = ServiceProxy::start(&client, "tools", "weather-mcp", "mcp")
        .await
        .unwrap();
    let http = tether_tests::client::Http::new();
    let resp = http
        .send(
            http::Method::GET,
            &format!("{}/mcp?x=1", proxy.url),
            &[("mcp-session-id", "s-1")],
            None,
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let within = Duration::from_secs(5);
    let first = tokio::time::timeout(within, body.frame())
        .await
        .expect("streamed, not buffered");
    let first = first.unwrap().unwrap().into_data().unwrap();
    assert_eq!(
        first,
        "data: /api/v1/namespaces/tools/services/weather-mcp:mcp/proxy/mcp?x=1 s-1\n\n"
    );
    go_on.send(()).unwrap();
    let second = tokio::time::timeout(within, body.frame()).await.unwrap();
    assert_eq!(
        second.unwrap().unwrap().into_data().unwrap(),
        "data: second\n\n"
    );
}

#[test]
fn execution_lines_name_their_call_ids() {
    assert_eq!(executed("executed \"c-1\""), Some("c-1".to_owned()));
    assert_eq!(
        executed(r#"executed "a \"quoted\" id""#),
        Some("a \"quoted\" id".to_owned())
    );
    assert_eq!(
        executed("tether-example-server listening on http://…"),
        None
    );
    assert_eq!(executed("executed c-1"), None);
}
