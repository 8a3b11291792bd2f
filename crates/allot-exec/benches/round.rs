//! The executor's overhead per round, in process: what `Executor::round` does around the
//! plugin's `handle`, the durable write of the run excluded (the store's commit is measured by
//! the store's own benchmarks, and end to end by `allot bench apps --run`). One round: the task's
//! spec parsed, its plugin resolved, the round's context made (resource manager, state, inputs,
//! metadata), `handle` called, the context finished and the run updated (`Run::after_round`:
//! state kept, event recorded once per phase and version).
//!
//! Two plugins: `noop` (succeeds: its outputs are its inputs) and `poll`, which reports Running
//! with its state updated each round, as a plugin polling an outside job does. Target: at most
//! 20 µs per round (Dask documents about 200 µs of overhead per task).
//!
//! Run: `cargo bench -p allot-exec --bench round -- --warm-up-time 1 --measurement-time 5`

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_core::apps::{AppId, TaskId};
use allot_core::runs::{ExecError, PhaseInfo, RetryPolicy, Run, Transition};
use allot_exec::{
    builtin, Plugin, PluginEntry, Registry, RunKey, Secrets, SetupContext, TaskContext, TokenWaits, Tokens, Waker,
};
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use async_trait::async_trait;
use criterion::{criterion_group, criterion_main, Criterion};

/// Reports Running, its state a counter it raises each round.
struct Poll;

#[async_trait]
impl Plugin for Poll {
    fn id(&self) -> &str {
        "poll"
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        let polls: u64 = ctx.state_json(1).unwrap_or(0);
        ctx.put_state_json(1, &(polls + 1));
        Ok(Transition::ephemeral(PhaseInfo::running(0, "the job runs")))
    }

    async fn abort(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }

    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }
}

/// One round, as the executor makes it, on `run`.
async fn round(
    registry: &Registry,
    store: &Arc<dyn Store>,
    waits: &TokenWaits,
    key: &RunKey,
    spec: &str,
    run: &mut Run,
) {
    let spec: serde_json::Value = serde_json::from_str(spec).unwrap();
    let task_type = spec["type"].as_str().unwrap();
    let plugin = registry.resolve(task_type, None).unwrap();
    let waker = Waker::new(|_| {});
    let tokens = Tokens::new(
        store.clone(),
        plugin.id(),
        key.clone(),
        run.attempt,
        waits.clone(),
        waker.clone(),
        run.tokens.clone(),
    );
    let mut ctx = TaskContext::new(key.clone(), run.attempt, task_type, tokens, run.state.clone(), waker);
    ctx.inputs = spec.get("inputs").cloned().unwrap_or_default();
    ctx.spec = spec;
    ctx.dir = std::path::PathBuf::from("/tmp/allot-bench/app/task");
    let answer = plugin.handle(&mut ctx).await;
    let out = ctx.finish();
    run.tokens = out.taken;
    if let Some(outputs) = &out.outputs {
        run.outputs = Some(outputs.to_string());
    }
    run.after_round(answer.map(|t| (t, out.write)), RetryPolicy::default(), 1_000);
}

fn rounds(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = runtime.block_on(async {
        Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().join("data"))).unwrap()) as Arc<dyn Store>
    });
    let mut entries = builtin::entries();
    entries.push(PluginEntry::new("poll", &["poll"], false, |_| async { Ok(Arc::new(Poll) as Arc<dyn Plugin>) }));
    let registry = runtime
        .block_on(Registry::load(entries, &BTreeMap::new(), |id| {
            SetupContext::new(id, store.clone(), Secrets::default(), Waker::new(|_| {}))
        }))
        .unwrap();
    let waits = TokenWaits::default();
    let key = RunKey { app: AppId::new("bench").unwrap(), task: TaskId::new("t").unwrap() };
    let noop = r#"{"type": "noop", "inputs": {"rows": 3, "day": "2026-11-23"}}"#;
    let poll = r#"{"type": "poll", "url": "http://jobs.example/run", "inputs": {"rows": 3}}"#;
    let mut group = c.benchmark_group("executor round");
    group.bench_function("noop (succeeds)", |b| {
        b.iter(|| {
            let mut run = Run::new(0);
            runtime.block_on(round(&registry, &store, &waits, &key, noop, &mut run));
            run
        })
    });
    let mut run = Run::new(0);
    group.bench_function("poll (Running, state written)", |b| {
        b.iter(|| runtime.block_on(round(&registry, &store, &waits, &key, poll, &mut run)))
    });
    group.finish();
}

criterion_group!(benches, rounds);
criterion_main!(benches);
