//! What a plugin is given [Flyte `SetupContext` and `TaskExecutionContext`]: at start, a
//! registrar of its token quotas, its secrets and a waker; for each round, the task, its state,
//! the resource manager (allot's own token quotas) and the rest.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_core::apps::{AppId, TaskId};
use allot_core::clock::{SystemTime, TimeSource};
use allot_core::runs::{ExecError, PluginState, StateWrite, TakenToken};
use allot_core::{AllocateRequest, CapLevel, Constraints, LeaseRequest, NamespaceName, Refusal, Scope, Token};
use allot_store::{Allocation, Store, StoreError};

/// A task's run, as the executor names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    pub app: AppId,
    pub task: TaskId,
}

impl std::fmt::Display for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.app, self.task)
    }
}

/// Wakes a task's run: its next round comes at once, not after the executor's pause.
#[derive(Clone)]
pub struct Waker(Arc<dyn Fn(&RunKey) + Send + Sync>);

impl Waker {
    pub fn new(wake: impl Fn(&RunKey) + Send + Sync + 'static) -> Waker {
        Waker(Arc::new(wake))
    }

    pub fn wake(&self, run: &RunKey) {
        (self.0)(run)
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Waker")
    }
}

/// Secrets by name, from the daemon's configuration; a plugin reads only its own.
#[derive(Debug, Clone, Default)]
pub struct Secrets(Arc<BTreeMap<String, String>>);

impl Secrets {
    pub fn new(secrets: BTreeMap<String, String>) -> Secrets {
        Secrets(Arc::new(secrets))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// The namespace of a plugin's quota `name`: `<plugin>:<name>`, as Flyte names them.
pub fn quota_namespace(plugin: &str, name: &str) -> Result<NamespaceName, ExecError> {
    NamespaceName::new(&format!("{plugin}:{name}"))
        .map_err(|e| ExecError::system("bad_quota_name", format!("quota `{name}` of plugin `{plugin}`: {e}")))
}

fn store_error(err: StoreError) -> ExecError {
    ExecError::system("store", err.to_string())
}

/// A request the ledger refuses as it is (a cap out of range, a token asked for again with
/// other units or caps) is the plugin's doing, a user failure; the rest are the store's.
fn ledger_error(err: StoreError) -> ExecError {
    match err {
        StoreError::Quotas(err) => ExecError::user("token_refused", err.to_string()),
        err => store_error(err),
    }
}

/// Counters plugins keep, by plugin and name; the daemon exports them at /metrics
/// (`allot_runs_plugin_counter_total{plugin, counter}`).
#[derive(Debug, Clone, Default)]
pub struct PluginCounters(Arc<Mutex<BTreeMap<(String, String), u64>>>);

impl PluginCounters {
    /// Every counter: (plugin, name) and its value.
    pub fn snapshot(&self) -> Vec<((String, String), u64)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// A plugin's metrics scope [Flyte `MetricsScope`]: counters named under the plugin.
#[derive(Debug, Clone)]
pub struct MetricsScope {
    plugin: String,
    counters: PluginCounters,
}

impl MetricsScope {
    /// Adds `n` to the plugin's counter `name`.
    pub fn add(&self, name: &str, n: u64) {
        let mut counters = self.counters.0.lock().unwrap_or_else(|p| p.into_inner());
        *counters.entry((self.plugin.clone(), name.to_owned())).or_default() += n;
    }

    pub fn inc(&self, name: &str) {
        self.add(name, 1);
    }
}

/// What a plugin gets at start [Flyte `SetupContext`].
#[derive(Clone)]
pub struct SetupContext {
    pub(crate) plugin: String,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) secrets: Secrets,
    pub(crate) waker: Waker,
    pub(crate) counters: PluginCounters,
}

impl SetupContext {
    pub fn new(plugin: &str, store: Arc<dyn Store>, secrets: Secrets, waker: Waker) -> SetupContext {
        SetupContext { plugin: plugin.to_owned(), store, secrets, waker, counters: PluginCounters::default() }
    }

    /// The same, its metrics kept in `counters` (shared with the daemon's /metrics).
    #[must_use]
    pub fn with_counters(self, counters: PluginCounters) -> SetupContext {
        SetupContext { counters, ..self }
    }

    /// The plugin's metrics scope.
    pub fn metrics(&self) -> MetricsScope {
        MetricsScope { plugin: self.plugin.clone(), counters: self.counters.clone() }
    }

    /// Registers a token quota of this plugin [Flyte `ResourceRegistrar`]: the namespace
    /// `<plugin>:<name>` gets `quota`, created if it does not exist. A plugin's quota is the
    /// daemon's configuration (as in Flyte, where it is read from the configuration at every
    /// start): a quota the store has from before, changed by the file or at runtime, takes
    /// `quota` again, and the change is logged with both values.
    pub async fn register_quota(&self, name: &str, quota: u64) -> Result<NamespaceName, ExecError> {
        let namespace = quota_namespace(&self.plugin, name)?;
        let (created, view) = self.store.seed_namespace(namespace.clone(), quota).await.map_err(store_error)?;
        if created {
            tracing::info!(namespace = %namespace, quota, "plugin quota registered");
        } else if view.quota != quota {
            self.store.put_namespace(namespace.clone(), quota).await.map_err(store_error)?;
            tracing::info!(
                namespace = %namespace,
                was = view.quota,
                quota,
                "plugin quota changed to the configured value (a plugin's quota is the daemon's configuration)"
            );
        }
        Ok(namespace)
    }

    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// Wakes a task when an outside event arrives (a callback, a message).
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    pub fn plugin(&self) -> &str {
        &self.plugin
    }
}

/// Where a token a task asked for stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenStatus {
    Granted,
    /// In the namespace's queue: the task is woken when it is granted (no polling). What held it
    /// back when it was first asked for: the quota (`Exhausted`) or a cap of its scope
    /// (`CapExceeded`, Flyte's `NamespaceQuotaExceeded`).
    Waiting(Refusal),
}

impl TokenStatus {
    /// Why a waiting token waits, in words (for a WaitingForResources phase).
    pub fn why(&self, namespace: &str) -> String {
        match self {
            TokenStatus::Granted => format!("granted a token of `{namespace}`"),
            TokenStatus::Waiting(Refusal::Exhausted) => {
                format!("waiting for a token of `{namespace}`: its quota is full")
            }
            TokenStatus::Waiting(Refusal::CapExceeded { level, cap, held }) => {
                let scope = match level {
                    CapLevel::Project => "its project",
                    CapLevel::Namespace => "its project's namespace scope",
                };
                format!("waiting for a token of `{namespace}`: {scope} holds {held} of its cap of {cap}")
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Ask {
    Waiting(Refusal),
    Granted,
    Failed(ExecError),
}

/// The waits for tokens of every run on this daemon. A wait is one allocate call that waits in
/// the namespace's queue (renewed until granted: the token keeps its place); when it is granted
/// the run is woken. A token known granted stays noted until it is released, so that asking for
/// it again each round costs no call to the store.
#[derive(Clone, Default)]
pub struct TokenWaits {
    asks: Arc<Mutex<HashMap<(NamespaceName, Token), Ask>>>,
}

impl TokenWaits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(NamespaceName, Token), Ask>> {
        self.asks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `request` is granted; the first call for it starts its wait.
    async fn take(
        &self,
        store: &Arc<dyn Store>,
        request: AllocateRequest,
        run: RunKey,
        waker: Waker,
    ) -> Result<TokenStatus, ExecError> {
        let key = (request.namespace.clone(), request.token.clone());
        let ask = self.lock().get(&key).cloned();
        match ask {
            Some(Ask::Granted) => return Ok(TokenStatus::Granted),
            Some(Ask::Waiting(refusal)) => return Ok(TokenStatus::Waiting(refusal)),
            Some(Ask::Failed(err)) => {
                self.lock().remove(&key);
                return Err(err);
            }
            None => {}
        }
        // Without waiting first: granted at once if there is room and no one waits ahead.
        let refusal = match store.allocate_held(request.clone(), Duration::ZERO).await.map_err(ledger_error)? {
            Allocation::Granted { .. } => {
                self.lock().insert(key, Ask::Granted);
                return Ok(TokenStatus::Granted);
            }
            Allocation::Refused { refusal, .. } => refusal,
        };
        self.lock().insert(key.clone(), Ask::Waiting(refusal));
        let (asks, store) = (self.clone(), store.clone());
        tokio::spawn(async move {
            let answer = loop {
                match store.allocate_held(request.clone(), allot_store::MAX_WAIT).await {
                    Ok(Allocation::Granted { .. }) => break Ask::Granted,
                    // The wait ended without a grant: wait again (the token keeps its place).
                    Ok(Allocation::Refused { .. }) => {}
                    Err(
                        StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_) | StoreError::NotEnoughReplicas(_),
                    ) => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(err) => break Ask::Failed(store_error(err)),
                }
                if !asks.lock().contains_key(&key) {
                    return;
                }
            };
            let granted = matches!(answer, Ask::Granted);
            let forgotten = {
                let mut map = asks.lock();
                let forgotten = !map.contains_key(&key);
                if !forgotten {
                    map.insert(key.clone(), answer);
                }
                forgotten
            };
            if !forgotten {
                waker.wake(&run);
            } else if granted {
                // Its run ended while it waited: nobody holds it.
                let _ = store.release_held(key.0, key.1).await;
            }
        });
        Ok(TokenStatus::Waiting(refusal))
    }

    /// Forgets a token (released, or its run ended); a grant that comes later is released by the
    /// wait itself.
    fn forget(&self, namespace: &NamespaceName, token: &Token) {
        self.lock().remove(&(namespace.clone(), token.clone()));
    }
}

/// The resource manager a task's rounds use [Flyte `ResourceManager`]: the plugin's token quotas,
/// in allot's own store. Every token taken is noted on the run and released when its attempt
/// ends, whatever the path.
pub struct Tokens {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) plugin: String,
    pub(crate) run: RunKey,
    pub(crate) attempt: u32,
    /// Who holds the tokens: the scope from the task's execution metadata ([`scope_of`]), or
    /// why its application's tags name none that is valid.
    pub(crate) scope: Result<Option<Scope>, String>,
    pub(crate) waits: TokenWaits,
    pub(crate) waker: Waker,
    /// Taken in this attempt (the run's list, given back to it after the round).
    pub(crate) taken: Vec<TakenToken>,
}

impl Tokens {
    /// The resource manager of `run`'s attempt, for `plugin`, holding `taken` already.
    pub fn new(
        store: Arc<dyn Store>,
        plugin: &str,
        run: RunKey,
        attempt: u32,
        waits: TokenWaits,
        waker: Waker,
        taken: Vec<TakenToken>,
    ) -> Tokens {
        Tokens { store, plugin: plugin.to_owned(), run, attempt, scope: Ok(None), waits, waker, taken }
    }

    /// The same, its tokens held by `scope` (see [`scope_of`]).
    #[must_use]
    pub fn with_scope(self, scope: Result<Option<Scope>, String>) -> Tokens {
        Tokens { scope, ..self }
    }

    /// The scope its tokens are held by, if any.
    pub fn scope(&self) -> Option<&Scope> {
        self.scope.as_ref().ok().and_then(Option::as_ref)
    }

    /// What this attempt holds or waits for.
    pub fn taken(&self) -> &[TakenToken] {
        &self.taken
    }

    /// The token this task's attempt holds in a namespace.
    fn token(&self) -> Result<Token, ExecError> {
        attempt_token(&self.run, self.attempt)
    }

    /// Asks for `units` of the plugin's quota `name`: granted now, or waiting in its queue (the
    /// round answers WaitingForResources, and the task is woken when it is granted). The token
    /// is held by the task's scope (its application's `project` and `domain` tags), if any.
    pub async fn take(&mut self, name: &str, units: u64) -> Result<TokenStatus, ExecError> {
        self.take_capped(name, units, Constraints::default()).await
    }

    /// As [`Tokens::take`], within `caps` [Flyte `ResourceConstraintsSpec`]: the units the task's
    /// project, and its project's namespace scope, may hold of the quota at once (a request over
    /// a cap waits, [`TokenStatus::Waiting`] with `CapExceeded`, while it holds back no one
    /// else). A task whose application names no project is in no scope: caps do not apply to it.
    pub async fn take_capped(&mut self, name: &str, units: u64, caps: Constraints) -> Result<TokenStatus, ExecError> {
        let namespace = quota_namespace(&self.plugin, name)?;
        let token = self.token()?;
        let taken = TakenToken { namespace: namespace.clone(), token: token.clone() };
        let scope = self.scope.clone().map_err(|why| ExecError::user("bad_scope", why))?;
        let constraints = if scope.is_some() { caps } else { Constraints::default() };
        let request = AllocateRequest { namespace, token, units, scope, constraints, lease: LeaseRequest::None };
        // Noted before it is asked for: an attempt that ends then releases it, whether the grant
        // came before the end (released here) or after (released by the wait itself), and also
        // when the ask failed with its outcome unknown (a failed sync whose write reached the
        // disk after all: the grant exists, and nothing else would ever release it).
        if !self.taken.contains(&taken) {
            self.taken.push(taken);
        }
        // Asked again every round: answered from what this daemon knows, else from the store (an
        // allocate of a token already held is granted as it is), so after a restart a wait that
        // was in flight is found again.
        self.waits.take(&self.store, request, self.run.clone(), self.waker.clone()).await
    }

    /// Releases what this attempt holds of quota `name` (idempotent).
    pub async fn release(&mut self, name: &str) -> Result<(), ExecError> {
        let namespace = quota_namespace(&self.plugin, name)?;
        let token = self.token()?;
        release(&self.store, &self.waits, &namespace, &token).await?;
        self.taken.retain(|t| !(t.namespace == namespace && t.token == token));
        Ok(())
    }
}

/// The token attempt `attempt` of `run` holds in each of its plugin's namespaces.
pub(crate) fn attempt_token(run: &RunKey, attempt: u32) -> Result<Token, ExecError> {
    Token::of_run(run.app.as_str(), run.task.as_str(), attempt)
        .map_err(|e| ExecError::system("bad_token", e.to_string()))
}

/// Releases a token, and forgets its wait if it had one.
pub(crate) async fn release(
    store: &Arc<dyn Store>,
    waits: &TokenWaits,
    namespace: &NamespaceName,
    token: &Token,
) -> Result<(), ExecError> {
    waits.forget(namespace, token);
    match store.release_held(namespace.clone(), token.clone()).await {
        Ok(_) => Ok(()),
        Err(StoreError::Quotas(allot_core::LedgerError::NamespaceNotFound(_))) => Ok(()),
        Err(err) => Err(store_error(err)),
    }
}

/// The application tag that names a task's project [Flyte's execution project].
pub const PROJECT_TAG: &str = "project";
/// The application tag that names a task's domain within its project, its namespace scope
/// [Flyte's execution domain]; `default` when the application names a project but no domain.
pub const DOMAIN_TAG: &str = "domain";
/// The same in allot's word (the namespace scope); either tag may be given, or both alike.
pub const NAMESPACE_TAG: &str = "namespace";
/// The domain of a task whose application names a project but no domain.
pub const DEFAULT_DOMAIN: &str = "default";

/// The scope a task's tokens are held by, from its application's tags: `project`, and
/// `namespace` (or Flyte's `domain`) as the namespace scope (`default` when absent); none without
/// a `project` tag. A tag that is not a valid name, or two different namespace scopes, is an
/// error that names them.
pub fn scope_of(tags: &BTreeMap<String, String>) -> Result<Option<Scope>, String> {
    let Some(project) = tags.get(PROJECT_TAG) else { return Ok(None) };
    let domain = match (tags.get(NAMESPACE_TAG), tags.get(DOMAIN_TAG)) {
        (Some(namespace), Some(domain)) if namespace != domain => {
            return Err(format!(
                "the application's `{NAMESPACE_TAG}` ({namespace}) and `{DOMAIN_TAG}` ({domain}) tags name two \
                 namespace scopes; give one"
            ))
        }
        (Some(scope), _) | (None, Some(scope)) => scope.as_str(),
        (None, None) => DEFAULT_DOMAIN,
    };
    Scope::new(project, domain)
        .map(Some)
        .map_err(|err| format!("the application's `{PROJECT_TAG}` and `{DOMAIN_TAG}` tags are not a scope: {err}"))
}

/// What the executor knows of a task when a round runs [Flyte `TaskExecutionMetadata`].
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub queue: String,
    pub user: String,
    /// The application's tags.
    pub labels: BTreeMap<String, String>,
    /// The task's `annotations` (its spec's): notes for plugins and tools.
    pub annotations: BTreeMap<String, String>,
    /// The task's `overrides` (its spec's): settings a plugin takes over its defaults.
    pub overrides: serde_json::Value,
    /// Where it was placed: `pool/alloc`, and the alloc's resources.
    pub alloc: String,
    pub resources: String,
    /// The task may be stopped at any time (and retried elsewhere) without it being a failure.
    pub interruptible: bool,
    /// The daemon that runs it, by its URL (where an outside job calls back: its wake-up, the
    /// catalog).
    pub node: String,
}

/// What a plugin gets for a round [Flyte `TaskExecutionContext`].
pub struct TaskContext {
    pub run: RunKey,
    pub attempt: u32,
    pub task_type: String,
    /// The task's spec for its plugin (its JSON `spec`).
    pub spec: serde_json::Value,
    pub inputs: serde_json::Value,
    pub metadata: Metadata,
    /// The task's own directory (logs, scratch, outputs), kept across attempts.
    pub dir: PathBuf,
    pub max_output_bytes: usize,
    pub secrets: Secrets,
    pub tokens: Tokens,
    /// The plugin's own entries of the catalog, in the task's queue [Flyte `Catalog()`].
    pub catalog: crate::catalog::Catalog,
    /// Where the plugin reads the time: the executor's clock.
    pub clock: Arc<dyn TimeSource>,
    pub(crate) state: Option<PluginState>,
    pub(crate) write: StateWrite,
    pub(crate) outputs: Option<serde_json::Value>,
    pub(crate) waker: Waker,
    pub(crate) events: Vec<String>,
}

/// What a round leaves for the executor to store.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundOutput {
    pub write: StateWrite,
    pub outputs: Option<serde_json::Value>,
    pub taken: Vec<TakenToken>,
    /// Events the plugin recorded, in order.
    pub events: Vec<String>,
}

impl TaskContext {
    /// A round's context: `state` as the last round left it; the rest is set through the pub
    /// fields.
    pub fn new(
        run: RunKey,
        attempt: u32,
        task_type: &str,
        tokens: Tokens,
        state: Option<PluginState>,
        waker: Waker,
    ) -> TaskContext {
        let catalog = crate::catalog::Catalog::detached((run.app.clone(), run.task.clone()));
        TaskContext {
            run,
            attempt,
            task_type: task_type.to_owned(),
            spec: serde_json::Value::Null,
            inputs: serde_json::Value::Null,
            metadata: Metadata::default(),
            dir: PathBuf::new(),
            max_output_bytes: 1 << 20,
            secrets: Secrets::default(),
            tokens,
            catalog,
            clock: Arc::new(SystemTime),
            state,
            write: StateWrite::Unchanged,
            outputs: None,
            waker,
            events: Vec::new(),
        }
    }

    /// Ends the round: what it wrote of the state, its outputs, and the tokens the attempt holds.
    pub fn finish(self) -> RoundOutput {
        RoundOutput { write: self.write, outputs: self.outputs, taken: self.tokens.taken, events: self.events }
    }

    /// The plugin's state as the last round left it, if any [Flyte `PluginStateReader`].
    pub fn state(&self) -> Option<&PluginState> {
        match &self.write {
            StateWrite::Put(state) => Some(state),
            StateWrite::Reset => None,
            StateWrite::Unchanged => self.state.as_ref(),
        }
    }

    /// The state as JSON of the plugin's schema `version`: `None` if there is none or it was
    /// written by another version.
    pub fn state_json<T: serde::de::DeserializeOwned>(&self, version: u8) -> Option<T> {
        self.state().filter(|s| s.version == version).and_then(|s| serde_json::from_slice(&s.bytes).ok())
    }

    /// Keeps `bytes` as the plugin's state, whatever the phase the round answers
    /// [Flyte `PluginStateWriter.Put`, without flyte#5195].
    pub fn put_state(&mut self, version: u8, bytes: Vec<u8>) {
        self.write = StateWrite::Put(PluginState { version, bytes });
    }

    pub fn put_state_json<T: serde::Serialize>(&mut self, version: u8, value: &T) {
        self.put_state(version, serde_json::to_vec(value).expect("plugin state encodes"));
    }

    /// Clears the plugin's state.
    pub fn reset_state(&mut self) {
        self.write = StateWrite::Reset;
    }

    /// Records the task's outputs (JSON), at most `max_output_bytes` encoded.
    pub fn set_outputs(&mut self, outputs: serde_json::Value) -> Result<(), ExecError> {
        let size = serde_json::to_vec(&outputs).map_or(usize::MAX, |b| b.len());
        if size > self.max_output_bytes {
            return Err(ExecError::user(
                "outputs_too_large",
                format!("the outputs take {size} bytes, more than the {} allowed", self.max_output_bytes),
            ));
        }
        self.outputs = Some(outputs);
        Ok(())
    }

    /// Records an event in the task's timeline (progress, something the plugin saw), under the
    /// phase the round answers [Flyte `EventsRecorder`].
    pub fn record_event(&mut self, reason: impl Into<String>) {
        self.events.push(reason.into());
    }

    /// Wakes this task's run later, from outside the round (a callback arrived).
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }
}

#[cfg(test)]
mod scope_tests {
    use std::collections::BTreeMap;

    use super::scope_of;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_scope_comes_from_the_project_and_namespace_or_domain_tags() {
        let scope = |pairs: &[(&str, &str)]| {
            scope_of(&tags(pairs)).map(|s| s.map(|s| (s.project.to_string(), s.namespace.to_string())))
        };
        assert_eq!(scope(&[]), Ok(None), "no project, no scope");
        assert_eq!(scope(&[("project", "p")]), Ok(Some(("p".into(), "default".into()))));
        assert_eq!(scope(&[("project", "p"), ("domain", "dev")]), Ok(Some(("p".into(), "dev".into()))));
        assert_eq!(scope(&[("project", "p"), ("namespace", "dev")]), Ok(Some(("p".into(), "dev".into()))));
        let both = [("project", "p"), ("namespace", "dev"), ("domain", "dev")];
        assert_eq!(scope(&both), Ok(Some(("p".into(), "dev".into()))), "both alike");
        let err = scope(&[("project", "p"), ("namespace", "dev"), ("domain", "prod")]).unwrap_err();
        assert!(err.contains("two namespace scopes"), "{err}");
    }
}
