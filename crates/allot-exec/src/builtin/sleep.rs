//! `sleep`: runs for `spec.seconds` (a number, default 1) without holding a thread: the first
//! round notes when it ends (in the plugin state, so a restart does not start it over) and asks
//! to be woken then, on tokio's timer; the round it wakes reads the time again from the task's
//! clock. For tests and benchmarks.

use std::sync::Arc;
use std::time::Duration;

use allot_core::runs::{ExecError, PhaseInfo, Transition};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::context::TaskContext;
use crate::plugin::{Plugin, PluginEntry};

/// The state's schema version.
const STATE_VERSION: u8 = 1;
/// The longest sleep a task may ask for.
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

struct Sleep;

pub(super) fn entry() -> PluginEntry {
    PluginEntry::new("sleep", &["sleep"], false, |_| async { Ok(Arc::new(Sleep) as Arc<dyn Plugin>) })
}

#[derive(Serialize, Deserialize)]
struct State {
    /// When the sleep ends, in ms since the epoch.
    until_ms: u64,
}

#[async_trait]
impl Plugin for Sleep {
    fn id(&self) -> &str {
        "sleep"
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        let now = ctx.clock.wall_ms();
        let until_ms = match ctx.state_json::<State>(STATE_VERSION) {
            Some(state) => state.until_ms,
            None => {
                let seconds = match ctx.spec.get("seconds") {
                    None => 1.0,
                    Some(value) => value.as_f64().filter(|s| (0.0..=MAX_SECONDS).contains(s)).ok_or_else(|| {
                        ExecError::user("bad_spec", format!("`seconds` must be a number from 0 to {MAX_SECONDS}"))
                    })?,
                };
                let until_ms = now + (seconds * 1000.0) as u64;
                ctx.put_state_json(STATE_VERSION, &State { until_ms });
                until_ms
            }
        };
        if now >= until_ms {
            return Ok(Transition::ephemeral(PhaseInfo::success("slept")));
        }
        let (waker, run) = (ctx.waker(), ctx.run.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(until_ms - now)).await;
            waker.wake(&run);
        });
        Ok(Transition::ephemeral(PhaseInfo::running(0, "sleeping")))
    }

    async fn abort(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }

    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }
}
