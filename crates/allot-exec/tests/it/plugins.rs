//! Plugins, their registry and their resource manager, on a real embedded store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, TaskId};
use allot_core::clock::ManualClock;
use allot_core::runs::{ExecError, Phase, PhaseInfo, StateWrite, Transition};
use allot_core::{NamespaceName, Refusal};
use allot_exec::{
    builtin, Plugin, PluginEntry, Registry, RegistryError, ResolveError, RunKey, Secrets, SetupContext, TaskContext,
    TokenStatus, TokenWaits, Tokens, Waker,
};
use allot_store::{EmbeddedConfig, EmbeddedStore, PageRequest, Store};

use crate::support::until;
use async_trait::async_trait;

struct Named(&'static str);

#[async_trait]
impl Plugin for Named {
    fn id(&self) -> &str {
        self.0
    }
    async fn handle(&self, _: &mut TaskContext) -> Result<Transition, ExecError> {
        Ok(Transition::ephemeral(PhaseInfo::success(self.0)))
    }
    async fn abort(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }
    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }
}

fn entry(id: &'static str, types: &[&str], default: bool) -> PluginEntry {
    PluginEntry::new(id, types, default, move |_| async move { Ok(Arc::new(Named(id)) as Arc<dyn Plugin>) })
}

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&EmbeddedConfig::new(dir.path().join("data"))).unwrap();
    (dir, Arc::new(store))
}

fn no_wake() -> Waker {
    Waker::new(|_| {})
}

async fn load(
    store: &Arc<dyn Store>,
    entries: Vec<PluginEntry>,
    choices: &[(&str, &str)],
) -> Result<Registry, RegistryError> {
    let choices: BTreeMap<String, String> = choices.iter().map(|(t, p)| ((*t).into(), (*p).into())).collect();
    Registry::load(entries, &choices, |id| SetupContext::new(id, store.clone(), Secrets::default(), no_wake())).await
}

#[tokio::test]
async fn a_task_gets_its_named_plugin_then_the_configured_one_then_the_only_one_then_the_default() {
    let (_dir, store) = store();
    let entries =
        vec![entry("a", &["batch"], false), entry("b", &["batch", "web"], false), entry("fallback", &[], true)];
    let registry = load(&store, entries, &[("batch", "b")]).await.unwrap();
    assert_eq!(registry.resolve("batch", Some("a")).unwrap().id(), "a", "the task's own choice first");
    assert_eq!(registry.resolve("batch", None).unwrap().id(), "b", "then the configured one");
    assert_eq!(registry.resolve("web", None).unwrap().id(), "b", "then the only one for the type");
    assert_eq!(registry.resolve("other", None).unwrap().id(), "fallback", "then the default");
    assert_eq!(registry.resolve("x", Some("nope")).err(), Some(ResolveError::UnknownPlugin("nope".into())));
    let registry = load(&store, vec![entry("a", &["batch"], false)], &[]).await.unwrap();
    assert_eq!(registry.resolve("other", None).err(), Some(ResolveError::NoPlugin("other".into())));
}

#[tokio::test]
async fn a_second_default_or_an_unresolved_type_or_a_failing_loader_stops_the_start() {
    let (_dir, store) = store();
    let two = load(&store, vec![entry("a", &["x"], true), entry("b", &["y"], true)], &[]).await.unwrap_err();
    assert_eq!(two, RegistryError::TwoDefaults { first: "a".into(), second: "b".into() });
    let ambiguous = load(&store, vec![entry("a", &["x"], false), entry("b", &["x"], false)], &[]).await.unwrap_err();
    assert!(matches!(&ambiguous, RegistryError::Ambiguous { task_type, .. } if task_type == "x"), "{ambiguous}");
    assert!(ambiguous.to_string().contains("[plugins.task_types]"), "the error says how to choose: {ambiguous}");
    let unknown = load(&store, vec![entry("a", &["x"], false)], &[("x", "b")]).await.unwrap_err();
    assert_eq!(unknown, RegistryError::UnknownChoice { task_type: "x".into(), plugin: "b".into() });
    let loads = Arc::new(Mutex::new(0));
    let counted = loads.clone();
    let failing = PluginEntry::new("broken", &["z"], false, move |_| {
        *counted.lock().unwrap() += 1;
        async { Err::<Arc<dyn Plugin>, String>("no credentials".into()) }
    });
    let failed = load(&store, vec![failing], &[]).await.unwrap_err();
    assert_eq!(failed, RegistryError::LoadFailed { id: "broken".into(), error: "no credentials".into() });
    assert_eq!(*loads.lock().unwrap(), 1, "a loader runs once");
    assert_eq!(
        load(&store, vec![entry("a", &[], false)], &[]).await.unwrap_err(),
        RegistryError::NoTaskTypes("a".into())
    );
}

fn run(task: &str) -> RunKey {
    RunKey { app: AppId::new("app").unwrap(), task: TaskId::new(task).unwrap() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_a_token_is_woken_by_the_release_not_by_polling() {
    let (_dir, store) = store();
    let setup = SetupContext::new("web", store.clone(), Secrets::default(), no_wake());
    let namespace = setup.register_quota("api", 1).await.unwrap();
    assert_eq!(namespace, NamespaceName::new("web:api").unwrap(), "named under the plugin, as in Flyte");
    let woken: Arc<Mutex<Vec<RunKey>>> = Arc::default();
    let waker = {
        let woken = woken.clone();
        Waker::new(move |run| woken.lock().unwrap().push(run.clone()))
    };
    let waits = TokenWaits::default();
    let mut first = Tokens::new(store.clone(), "web", run("t1"), 1, waits.clone(), waker.clone(), Vec::new());
    let mut second = Tokens::new(store.clone(), "web", run("t2"), 1, waits.clone(), waker.clone(), Vec::new());
    assert_eq!(first.take("api", 1).await.unwrap(), TokenStatus::Granted);
    assert_eq!(second.take("api", 1).await.unwrap(), TokenStatus::Waiting(Refusal::Exhausted));
    assert_eq!(
        second.take("api", 1).await.unwrap(),
        TokenStatus::Waiting(Refusal::Exhausted),
        "asking again keeps its place"
    );
    // The second's ask waits in the store's queue: nothing woke it while the token is held.
    until("the second's ask waits in the store", async || {
        store.waiters(namespace.clone(), PageRequest::new(None, 10)).await.unwrap().items.len() == 1
    })
    .await;
    assert!(woken.lock().unwrap().is_empty(), "no wake while the token is held");
    first.release("api").await.unwrap();
    until("the waiting task is woken", async || !woken.lock().unwrap().is_empty()).await;
    assert_eq!(*woken.lock().unwrap(), [run("t2")]);
    assert_eq!(second.take("api", 1).await.unwrap(), TokenStatus::Granted);
    assert_eq!(second.taken().len(), 1);
    assert_eq!(store.namespace(namespace.clone()).await.unwrap().granted_units, 1);
    second.release("api").await.unwrap();
    assert_eq!(store.namespace(namespace).await.unwrap().granted_units, 0);
}

#[tokio::test]
async fn the_sleep_plugin_keeps_its_end_in_its_state_and_succeeds_after_it() {
    let (_dir, store) = store();
    let registry = load(&store, builtin::entries(), &[]).await.unwrap();
    let sleep = registry.resolve("sleep", None).unwrap();
    let tokens = || Tokens::new(store.clone(), "sleep", run("s"), 1, TokenWaits::default(), no_wake(), Vec::new());
    let clock = ManualClock::new();
    let mut ctx = TaskContext::new(run("s"), 1, "sleep", tokens(), None, no_wake());
    ctx.clock = Arc::new(clock.clone());
    ctx.spec = serde_json::json!({ "seconds": 0.2 });
    let first = sleep.handle(&mut ctx).await.unwrap();
    assert_eq!(first.info.phase, Phase::Running);
    let out = ctx.finish();
    let StateWrite::Put(state) = out.write else { panic!("the first round notes its end: {:?}", out.write) };
    // A later round (after a restart, say) reads the state: it does not start over.
    clock.advance(Duration::from_millis(250));
    let mut ctx = TaskContext::new(run("s"), 1, "sleep", tokens(), Some(state), no_wake());
    ctx.clock = Arc::new(clock.clone());
    ctx.spec = serde_json::json!({ "seconds": 3600 });
    assert_eq!(sleep.handle(&mut ctx).await.unwrap().info.phase, Phase::Success);
    let mut ctx = TaskContext::new(run("s"), 1, "sleep", tokens(), None, no_wake());
    ctx.spec = serde_json::json!({ "seconds": "soon" });
    let refused = sleep.handle(&mut ctx).await.unwrap_err();
    assert_eq!(refused.code, "bad_spec");
    let noop = registry.resolve("noop", None).unwrap();
    let mut ctx = TaskContext::new(run("n"), 1, "noop", tokens(), None, no_wake());
    ctx.inputs = serde_json::json!({ "x": 1 });
    assert_eq!(noop.handle(&mut ctx).await.unwrap().info.phase, Phase::Success);
    assert_eq!(ctx.finish().outputs, Some(serde_json::json!({ "x": 1 })));
}

/// A plugin's quota is the daemon's configuration: registered again with another value (the
/// daemon restarted with another file), the quota takes it, whatever the store had.
#[tokio::test]
async fn a_plugins_quota_takes_the_configured_value_at_every_registration() {
    let (_dir, store) = store();
    let setup = SetupContext::new("web", store.clone(), Secrets::default(), no_wake());
    let namespace = setup.register_quota("api", 2).await.unwrap();
    assert_eq!(store.namespace(namespace.clone()).await.unwrap().quota, 2);
    setup.register_quota("api", 5).await.unwrap();
    assert_eq!(store.namespace(namespace.clone()).await.unwrap().quota, 5, "the new configuration holds");
    store.put_namespace(namespace.clone(), 7).await.unwrap();
    setup.register_quota("api", 5).await.unwrap();
    assert_eq!(store.namespace(namespace).await.unwrap().quota, 5, "a change at runtime lasts until the next start");
}

/// Flyte's `Catalog()` for a plugin: the first task keeps an entry, the next one with the same
/// inputs finds it (with who kept it), other inputs are another entry, and a name out of bounds
/// fails the task as the plugin's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_keeps_and_finds_its_own_catalog_entries() {
    let s = crate::support::setup().await;
    let store = &*s.store;
    let memo = |text: &str| serde_json::json!({ "type": "probe", "mode": "memo", "inputs": { "text": text } });
    let outputs = async |app: &AppId, task: &str| {
        let run = store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap().unwrap();
        serde_json::from_str::<serde_json::Value>(run.outputs.as_deref().unwrap()).unwrap()
    };
    let first = crate::support::submit(store, "memo-1", &[("t", memo("a b"))]).await;
    until("the first task completes", async || crate::support::state(store, &first, "t").await == TaskState::Completed)
        .await;
    assert_eq!(outputs(&first, "t").await, serde_json::json!({ "created": true, "queue": "root.q" }));
    let second = crate::support::submit(store, "memo-2", &[("t", memo("a b")), ("u", memo("c"))]).await;
    for task in ["t", "u"] {
        until(task, async || crate::support::state(store, &second, task).await == TaskState::Completed).await;
    }
    assert_eq!(outputs(&second, "t").await, serde_json::json!({ "from": "memo-1/t", "kept": { "n": 1 } }));
    assert_eq!(outputs(&second, "u").await["created"], true, "other inputs are another entry");
    let long = serde_json::json!({ "type": "probe", "mode": "memo", "entry": "x".repeat(300), "inputs": {} });
    let bad = crate::support::submit(store, "memo-3", &[("t", long)]).await;
    until("the bad name fails the task", async || crate::support::state(store, &bad, "t").await == TaskState::Failed)
        .await;
    let run = store.run(bad, TaskId::new("t").unwrap()).await.unwrap().unwrap();
    let error = run.events.iter().find_map(|e| e.error.clone()).unwrap();
    assert_eq!((error.code.as_str(), error.kind), ("bad_catalog_entry", allot_core::runs::ErrorKind::User));
    s.stop.send_replace(true);
}
