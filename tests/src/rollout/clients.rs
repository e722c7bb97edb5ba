//! The load of a rollout: one task per MCP client, running from before the rollout until one
//! call after it.
//!
//! A client initializes a session, then loops rounds: a `counter` call (some clients), a
//! `notify` call whose log notifications arrive on its standalone GET stream (some clients),
//! then a `slow` call checked event by event ([`crate::call`]). Once the rollout is done and the
//! client made at least [`RolloutConfig::calls`] `slow` calls, it finishes its round, waits for
//! its GET stream's notifications, deletes the session and ends. A 404 ends the session; the
//! client then initializes a new one and goes on, as the spec tells clients to (S-05).
//!
//! With auth, each client is user `user-<index>` with its own [`Tokens`]; after a `slow` call,
//! now and then user `mallory` (a valid token of the same issuer) sends a `ping` in the
//! client's session: it must get 404.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::RolloutConfig;
use super::standalone::Standalone;
use crate::auth::{Issuer, Refresh, Tokens};
use crate::call::{self, CallPlan};
use crate::client::{McpClient, Session, result_text};
use crate::follow::{self, Follow};
use crate::incident::{Incident, IncidentKind};
use crate::{HarnessError, load};

/// The `iss` of every token of a rollout.
pub(super) const ISSUER: &str = "https://idp.example";
/// How long a finishing session waits for the notifications of its GET stream.
const NOTIFY_WAIT: Duration = Duration::from_secs(5);
/// Pause after a failed exchange (an `initialize`, a round) before the next try.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What the clients experienced.
#[derive(Debug, Default)]
pub(super) struct Figures {
    /// Counts, latencies and failures.
    pub report: load::Report,
    /// `slow` calls made (over all the sessions of a client).
    pub slow_calls: u64,
    /// Sessions that saw their `counter` go back (restart) within the session.
    pub counter_restarts: u64,
    /// Sessions lost (answered 404), after which the client started a new one.
    pub sessions_lost: u64,
    /// When a client first got a 404.
    pub first_not_found: Option<Instant>,
    /// Token refreshes: (before expiry, after a 401).
    pub refreshes: (u64, u64),
    /// Another user's requests in a client's session.
    pub probes: u64,
    /// Of those, answered 404.
    pub probes_refused: u64,
}

impl Figures {
    /// Adds `other`'s figures.
    pub fn add(&mut self, other: Figures) {
        self.report.add(other.report);
        self.slow_calls += other.slow_calls;
        self.counter_restarts += other.counter_restarts;
        self.sessions_lost += other.sessions_lost;
        self.saw_not_found_at(other.first_not_found);
        self.refreshes.0 += other.refreshes.0;
        self.refreshes.1 += other.refreshes.1;
        self.probes += other.probes;
        self.probes_refused += other.probes_refused;
    }

    /// Notes a 404 at `at` (the earliest is kept).
    pub fn saw_not_found_at(&mut self, at: Option<Instant>) {
        self.first_not_found = match (self.first_not_found, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// State shared by the harness and every client.
struct Shared {
    /// Set when the rollout is done.
    done: AtomicBool,
    /// One permit per client whose first session is initialized (or failed to).
    initialized: Semaphore,
    /// The session each client holds now and the pod that created it, by client.
    held: Mutex<HashMap<usize, (String, String)>>,
}

/// The running clients.
pub(super) struct Load {
    tasks: JoinSet<Figures>,
    shared: Arc<Shared>,
    sessions: usize,
}

impl Load {
    /// Starts `cfg.sessions` clients of `client`'s endpoint, each with its own tokens of
    /// `issuer` when `cfg.auth` is set.
    pub fn start(client: &McpClient, cfg: &RolloutConfig, issuer: Option<Arc<Issuer>>) -> Self {
        let shared = Arc::new(Shared {
            done: AtomicBool::new(false),
            initialized: Semaphore::new(0),
            held: Mutex::default(),
        });
        let cfg = Arc::new(cfg.clone());
        let user = |sub: &str, refresh| match (&cfg.auth, &issuer) {
            (Some(auth), Some(issuer)) => {
                let tokens = Tokens::new(Arc::clone(issuer), ISSUER, sub, auth.token_ttl, refresh);
                Some(tokens)
            }
            _ => None,
        };
        let intruder =
            user("mallory", Refresh::BeforeExpiry).map(|tokens| client.clone().with_tokens(tokens));
        let sources = load::client_pods(client, cfg.sessions);
        let mut tasks = JoinSet::new();
        for index in 0..cfg.sessions {
            let client = &sources[index / load::SESSIONS_PER_SOURCE];
            let lazy = cfg
                .auth
                .as_ref()
                .is_some_and(|a| rand::random_bool(a.lazy_fraction.clamp(0.0, 1.0)));
            let refresh = if lazy {
                Refresh::AfterRefusal
            } else {
                Refresh::BeforeExpiry
            };
            let tokens = user(&format!("user-{index}"), refresh);
            let client = Client {
                index,
                client: match &tokens {
                    Some(tokens) => client.clone().with_tokens(Arc::clone(tokens)),
                    None => client.clone(),
                },
                tokens,
                intruder: intruder.clone(),
                standalone: rand::random_bool(cfg.standalone_fraction.clamp(0.0, 1.0)),
                counter: rand::random_bool(cfg.counter_fraction.clamp(0.0, 1.0)),
                cfg: Arc::clone(&cfg),
                shared: Arc::clone(&shared),
                figures: Figures::default(),
            };
            tasks.spawn(client.run());
        }
        Self {
            tasks,
            shared,
            sessions: cfg.sessions,
        }
    }

    /// Waits (at most `within`) until every client initialized its first session; returns
    /// whether they all did.
    pub async fn initialized(&self, within: Duration) -> bool {
        let all = u32::try_from(self.sessions).unwrap_or(u32::MAX);
        tokio::time::timeout(within, self.shared.initialized.acquire_many(all))
            .await
            .is_ok_and(|permits| permits.is_ok())
    }

    /// The sessions the clients hold now that pod `host` (its address) created.
    pub fn held_on(&self, host: &str) -> HashSet<String> {
        let held = self
            .shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.values()
            .filter(|(_, pod)| pod == host)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Tells the clients the rollout is done and waits (at most `within`) for them to finish.
    pub async fn finish(mut self, within: Duration) -> Figures {
        self.shared.done.store(true, Ordering::Release);
        let mut figures = Figures::default();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(Ok(f))) => figures.add(f),
                Ok(Some(Err(e))) => figures
                    .report
                    .failures
                    .push(format!("harness: client task failed: {e}")),
                Ok(None) => break,
                Err(_) => {
                    figures.report.failures.push(format!(
                        "harness: {} clients still running {within:?} after the rollout",
                        self.tasks.len()
                    ));
                    self.tasks.abort_all();
                    break;
                }
            }
        }
        figures
    }
}

/// How a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// The client is done with it (and deleted it).
    Done,
    /// It was answered 404.
    Lost,
}

/// One client.
struct Client {
    index: usize,
    client: McpClient,
    /// Whether it keeps a standalone GET stream open and calls `notify`.
    standalone: bool,
    /// Whether it calls `counter`.
    counter: bool,
    /// Its tokens (with auth).
    tokens: Option<Arc<Tokens>>,
    /// Another user of the same endpoint (with auth).
    intruder: Option<McpClient>,
    cfg: Arc<RolloutConfig>,
    shared: Arc<Shared>,
    figures: Figures,
}

impl Client {
    /// Runs sessions until one ends done (a session lost to a 404, or one that could not be
    /// initialized, is replaced by a new one).
    async fn run(mut self) -> Figures {
        let version = self.cfg.versions[self.index % self.cfg.versions.len()].clone();
        // A session can be lost once per replaced pod at most (the new pods stay); the rest
        // leaves room for failed initializations.
        let most = 2 * self.cfg.pods + 2;
        let mut announced = false;
        let ramp_up = u64::try_from(self.cfg.ramp_up.as_millis()).unwrap_or(u64::MAX);
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..=ramp_up))).await;
        for life in 0.. {
            if life == most {
                self.fail(format!(
                    "client {}: gave up after {most} sessions lost or not initialized",
                    self.index
                ));
                break;
            }
            let session = self.client.initialize_placed(&version).await;
            if !announced {
                self.shared.initialized.add_permits(1);
                announced = true;
            }
            match session {
                Ok((session, pod)) => {
                    self.figures.report.sessions += 1;
                    self.hold(&session, pod);
                    if self.session(&session).await == Ended::Done {
                        break;
                    }
                    self.figures.sessions_lost += 1;
                }
                Err(e) => {
                    self.record_error(&format!("client {}: initialize", self.index), e);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
        if let Some(tokens) = &self.tokens {
            self.figures.refreshes = tokens.refreshes();
        }
        self.figures
    }

    /// Notes `session`, created by pod `pod`, as the one this client holds now.
    fn hold(&self, session: &Session, pod: String) {
        let mut held = self
            .shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.insert(self.index, (session.id.clone(), pod));
    }

    /// With auth, now and then: another user's `ping` in `session`, which must get 404 (the
    /// session is bound to its user, `spec.auth.binding`).
    async fn probe(&mut self, tag: &str, session: &Session, id: u64) {
        let Some(intruder) = &self.intruder else {
            return;
        };
        let p = self.cfg.auth.as_ref().map_or(0.0, |a| a.probe_probability);
        if !rand::random_bool(p.clamp(0.0, 1.0)) {
            return;
        }
        self.figures.probes += 1;
        let ping = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        match intruder.post(Some(session), &ping, &[]).await {
            Ok(resp) if resp.status() == StatusCode::NOT_FOUND => self.figures.probes_refused += 1,
            Ok(resp) => {
                let status = resp.status();
                self.fail(format!(
                    "{tag}: another user's ping in the session answered {status}"
                ));
            }
            Err(e) => self.fail(format!("{tag}: another user's ping: {e}")),
        }
    }

    /// One session's rounds, until the client is done or the session is lost; what went wrong
    /// in it is recorded as incidents of the session.
    async fn session(&mut self, session: &Session) -> Ended {
        let report = &self.figures.report;
        let (failures, incidents) = (report.failures.len(), report.incidents.len());
        let ended = self.rounds(session).await;
        let report = &mut self.figures.report;
        for incident in &mut report.incidents[incidents..] {
            incident.session.get_or_insert_with(|| session.id.clone());
        }
        let failed: Vec<Incident> = report.failures[failures..]
            .iter()
            .map(|f| Incident::new(IncidentKind::of_failure(f), f.clone()).in_session(&session.id))
            .collect();
        report.incidents.extend(failed);
        ended
    }

    /// [`Client::session`]'s rounds.
    async fn rounds(&mut self, session: &Session) -> Ended {
        let tag = format!("r{}-{:08x}", self.index, rand::random::<u32>());
        let mut standalone = None;
        if self.standalone {
            match Standalone::open(&self.client, session, self.max_pause()).await {
                Ok(s) => standalone = Some(s),
                Err(e) => {
                    if self.record_error(&format!("{tag}: standalone GET"), e) {
                        return Ended::Lost;
                    }
                }
            }
        }
        let mut next_id = 2u64; // 1 was `initialize`
        let mut id = || {
            next_id += 1;
            next_id - 1
        };
        // `counter` and `notify` are followed to their answer like `slow` calls.
        let follow = Follow::default();
        let mut counter = 0u64;
        let mut restarted = false;
        let mut round = 0u64;
        let ended = loop {
            let last = self.shared.done.load(Ordering::Acquire)
                && self.figures.slow_calls >= self.cfg.calls as u64;
            let failures = self.figures.report.failures.len();
            if self.counter {
                self.figures.report.tool_calls += 1;
                let called = follow::call_to_answer(
                    &self.client,
                    session,
                    id(),
                    "counter",
                    json!({}),
                    &follow,
                )
                .await;
                match called {
                    Ok(messages) => {
                        let value = messages
                            .iter()
                            .find_map(result_text)
                            .and_then(|t| t.parse::<u64>().ok());
                        match value {
                            Some(v) if v <= counter => restarted = true,
                            Some(v) if v > counter + 1 => {
                                self.fail(format!("{tag}: counter jumped from {counter} to {v}"));
                            }
                            Some(_) => {}
                            None => self.fail(format!("{tag}: counter answered {messages:?}")),
                        }
                        counter = value.unwrap_or(counter);
                    }
                    Err(e) => {
                        if self.record_error(&format!("{tag}: counter"), e) {
                            break Ended::Lost;
                        }
                    }
                }
            }
            if let Some(stream) = &standalone {
                let text = format!("{tag}-n{round}");
                stream.expect(&text, self.cfg.notify_count);
                self.figures.report.tool_calls += 1;
                let args = json!({"text": text, "count": self.cfg.notify_count});
                let called =
                    follow::call_to_answer(&self.client, session, id(), "notify", args, &follow)
                        .await;
                if let Err(e) = called {
                    stream.forget(&text);
                    if self.record_error(&format!("{tag}: notify"), e) {
                        break Ended::Lost;
                    }
                }
                if rand::random_bool(self.cfg.cut_probability.clamp(0.0, 1.0)) {
                    stream.cut();
                }
            }
            let call_id = format!("{tag}-c{round}");
            let plan = CallPlan::random(
                self.cfg.count,
                self.cfg.interval_ms,
                self.cfg.cut_probability,
                self.cfg.max_pause_ms,
            );
            let result = call::slow(&self.client, session, id(), &call_id, &plan).await;
            let before = self.figures.report.not_found;
            self.figures
                .report
                .record_call(&call_id, self.cfg.count, result);
            self.figures.slow_calls += 1;
            round += 1;
            if self.not_found_since(before) {
                break Ended::Lost;
            }
            self.probe(&tag, session, id()).await;
            if last {
                break Ended::Done;
            }
            if self.figures.report.failures.len() > failures {
                // An error answer (a 502, a 503 "retry"): back off before the next round.
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        };
        if restarted {
            self.figures.counter_restarts += 1;
        }
        if let Some(stream) = standalone {
            let wait = if ended == Ended::Done {
                NOTIFY_WAIT
            } else {
                Duration::ZERO
            };
            self.figures.add(stream.finish(wait).await);
        }
        if ended == Ended::Done {
            let before = self.figures.report.not_found;
            let deleted = self.client.delete(session).await;
            self.figures.report.record_delete(&tag, deleted);
            self.not_found_since(before);
        }
        ended
    }

    /// Records a failed exchange `what`: a 404 (returns `true`: the session is lost) or a
    /// failure (returns `false`).
    fn record_error(&mut self, what: &str, e: HarnessError) -> bool {
        if e.is_not_found() {
            self.figures.report.not_found += 1;
            self.figures.saw_not_found_at(Some(Instant::now()));
            true
        } else {
            self.fail(format!("{what}: {e}"));
            false
        }
    }

    /// Whether a 404 was recorded since the count of 404s was `before` (its time is noted).
    fn not_found_since(&mut self, before: u64) -> bool {
        let seen = self.figures.report.not_found > before;
        if seen {
            self.figures.saw_not_found_at(Some(Instant::now()));
        }
        seen
    }

    fn fail(&mut self, failure: String) {
        self.figures.report.failures.push(failure);
    }

    fn max_pause(&self) -> Duration {
        Duration::from_millis(self.cfg.max_pause_ms)
    }
}
