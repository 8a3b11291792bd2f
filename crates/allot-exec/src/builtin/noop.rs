//! `noop`: succeeds at once, its outputs its inputs. For tests and benchmarks.

use std::sync::Arc;

use allot_core::runs::{ExecError, PhaseInfo, Transition};
use async_trait::async_trait;

use crate::context::TaskContext;
use crate::plugin::{Plugin, PluginEntry, PluginProperties};

struct Noop;

pub(super) fn entry() -> PluginEntry {
    PluginEntry::new("noop", &["noop"], false, |_| async { Ok(Arc::new(Noop) as Arc<dyn Plugin>) })
}

#[async_trait]
impl Plugin for Noop {
    fn id(&self) -> &str {
        "noop"
    }

    fn properties(&self) -> PluginProperties {
        PluginProperties { acts_outside: false, ..PluginProperties::default() }
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        ctx.set_outputs(ctx.inputs.clone())?;
        Ok(Transition::ephemeral(PhaseInfo::success("nothing to do")))
    }

    async fn abort(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }

    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }
}
