//! `shell`: runs `spec.command` with `sh -c` in the attempt's directory, the alloc's resources in
//! its environment; stdout and stderr go to `stdout.log` and `stderr.log` there.
//!
//! The command runs in a session of its own, under a wrapper that writes its pid first and its
//! exit status last (`pid`, `exit`), so it outlives the daemon: a daemon that comes back reads
//! the files and goes on (the command is not started twice: a `started` marker is made before
//! it is spawned, and an attempt that finds the marker adopts what it started). Exit status 0 is
//! success; 126 and 127 (not executable, not found) a permanent user failure; any other status a
//! retryable user failure; a command that vanished without an exit status (killed with the
//! machine) a retryable system failure. A command that writes JSON to `$ALLOT_OUTPUTS` gives the
//! task its outputs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use allot_core::runs::{ExecError, LogLink, PhaseInfo, Transition};
use async_trait::async_trait;

use super::ShellConfig;
use crate::context::TaskContext;
use crate::plugin::{Plugin, PluginEntry};

struct Shell {
    config: ShellConfig,
}

pub(super) fn entry(config: ShellConfig) -> PluginEntry {
    PluginEntry::new("shell", &["shell"], false, move |_| {
        let config = config.clone();
        async move { Ok(Arc::new(Shell { config }) as Arc<dyn Plugin>) }
    })
}

/// How long an attempt that finds the `started` marker but no pid waits for the wrapper to write
/// it, before it takes the start as failed.
const PID_GRACE: Duration = Duration::from_secs(5);

/// The attempt's directory, absolute (the command runs in it, and is given paths into it).
fn attempt_dir(ctx: &TaskContext) -> PathBuf {
    let dir = ctx.dir.join(format!("attempt-{}", ctx.attempt));
    std::path::absolute(&dir).unwrap_or(dir)
}

fn system(code: &str, err: impl std::fmt::Display) -> ExecError {
    ExecError::system(code, err.to_string())
}

fn read_number(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok().and_then(|text| text.trim().parse().ok())
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn alive(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

fn logs(dir: &Path) -> Vec<LogLink> {
    ["stdout", "stderr"]
        .iter()
        .map(|name| LogLink {
            name: (*name).to_owned(),
            uri: format!("file://{}", dir.join(format!("{name}.log")).display()),
        })
        .collect()
}

/// The daemon's environment variables a command is given (when set): where programs are, whose
/// home, the locale and time zone. Everything else is cleared.
const PASSED_ON: [&str; 9] = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"];

/// Starts the command under its wrapper, in a session of its own; a task waits for it and wakes
/// the run when it ends.
fn spawn(ctx: &TaskContext, dir: &Path, command: &str, config: &ShellConfig) -> Result<(), ExecError> {
    // The wrapper writes its pid, runs the command, then writes the exit status atomically.
    let wrapper = "echo $$ > pid; sh -c \"$ALLOT_COMMAND\" > stdout.log 2> stderr.log < /dev/null; \
                   echo $? > exit.tmp && mv exit.tmp exit";
    let mut cmd = tokio::process::Command::new("sh");
    // Nothing of the daemon's environment but what locates programs and sets the locale: the
    // daemon's tokens, its store's URL and its secrets' variables are not the task's.
    cmd.env_clear();
    for name in PASSED_ON {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.arg("-c").arg(wrapper).current_dir(dir).env("ALLOT_COMMAND", command);
    cmd.env("ALLOT_TASK_DIR", dir).env("ALLOT_OUTPUTS", dir.join("outputs.json"));
    cmd.env("ALLOT_APP", ctx.run.app.as_str()).env("ALLOT_TASK", ctx.run.task.as_str());
    cmd.env("ALLOT_ATTEMPT", ctx.attempt.to_string());
    cmd.env("ALLOT_ALLOC", &ctx.metadata.alloc).env("ALLOT_RESOURCES", &ctx.metadata.resources);
    if let Some(env) = ctx.spec.get("env").and_then(|e| e.as_object()) {
        for (name, value) in env {
            let value = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
            cmd.env(name, value);
        }
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    cmd.process_group(0).kill_on_drop(false);
    if let Some(user) = &config.run_as {
        // Its own attempt directory, and nothing else of the daemon's (supplementary groups
        // dropped: the standard library does so when it changes the user id).
        nix::unistd::chown(dir, Some(user.uid.into()), Some(user.gid.into())).map_err(|e| system("task_dir", e))?;
        cmd.uid(user.uid).gid(user.gid).env("HOME", dir).env("USER", &user.name);
    }
    let mut child = cmd.spawn().map_err(|e| system("spawn_failed", e))?;
    let (waker, run) = (ctx.waker(), ctx.run.clone());
    tokio::spawn(async move {
        let _ = child.wait().await;
        waker.wake(&run);
    });
    Ok(())
}

/// The process group of `pid`, from `/proc/<pid>/stat`.
fn group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (in parentheses): state, parent pid, process group.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Sends `signal` to the command's process group, whose leader is its wrapper (`pid`). Nothing
/// is sent unless `pid` leads a group of its own that is not this daemon's.
fn signal(pid: i64, signal: libc::c_int) {
    let Ok(pid) = i32::try_from(pid) else { return };
    let own = group_of(std::process::id() as i32);
    if pid <= 1 || group_of(pid) != Some(pid) || own == Some(pid) {
        return;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of this process.
    unsafe {
        libc::kill(-pid, signal);
    }
}

#[async_trait]
impl Plugin for Shell {
    fn id(&self) -> &str {
        "shell"
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        let command = match ctx.spec.get("command") {
            Some(serde_json::Value::String(command)) if !command.trim().is_empty() => command.clone(),
            _ => {
                let error = ExecError::user("bad_spec", "a shell task needs a `command` (a non-empty string)");
                return Ok(Transition::ephemeral(PhaseInfo::permanent(error)));
            }
        };
        let dir = attempt_dir(ctx);
        let marker = dir.join("started");
        if !marker.exists() {
            if self.config.refuse_root && self.config.uid() == 0 {
                let error = ExecError::user("refused_as_root", self.config.describe());
                return Ok(Transition::ephemeral(PhaseInfo::permanent(error)));
            }
            std::fs::create_dir_all(&dir).map_err(|e| system("task_dir", e))?;
            // Made before the spawn: whoever finds it knows a start may have happened.
            std::fs::write(&marker, b"").map_err(|e| system("task_dir", e))?;
            spawn(ctx, &dir, &command, &self.config)?;
            let info = PhaseInfo::running(0, "started").with_logs(logs(&dir));
            return Ok(Transition::ephemeral(info));
        }
        if let Some(code) = read_number(&dir.join("exit")) {
            return Ok(Transition::ephemeral(match code {
                0 => {
                    if let Ok(text) = std::fs::read_to_string(dir.join("outputs.json")) {
                        let outputs = serde_json::from_str(&text)
                            .map_err(|e| ExecError::user("bad_outputs", format!("outputs.json is not JSON: {e}")))?;
                        ctx.set_outputs(outputs)?;
                    }
                    PhaseInfo::success("exit status 0").with_logs(logs(&dir))
                }
                126 | 127 => PhaseInfo::permanent(ExecError::user(
                    &format!("exit_{code}"),
                    format!(
                        "the command could not be run (exit status {code}); its stderr: `allot task logs {} {} \
                         --stream stderr`",
                        ctx.run.app, ctx.run.task
                    ),
                )),
                code => PhaseInfo::retryable(ExecError::user(&format!("exit_{code}"), format!("exit status {code}"))),
            }));
        }
        match read_number(&dir.join("pid")) {
            Some(pid) if alive(pid) => {
                Ok(Transition::ephemeral(PhaseInfo::running(0, "started").with_logs(logs(&dir))))
            }
            // The wrapper is gone without an exit status: killed, with the machine or by hand.
            Some(pid) => {
                // It may have written the status between the two reads.
                if dir.join("exit").exists() {
                    return Ok(Transition::ephemeral(PhaseInfo::running(0, "ending")));
                }
                Ok(Transition::ephemeral(PhaseInfo::retryable(ExecError::system(
                    "process_vanished",
                    format!("the command (pid {pid}) ended without an exit status"),
                ))))
            }
            None => {
                let age = std::fs::metadata(&marker).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
                if age.is_some_and(|age| age > PID_GRACE) {
                    return Ok(Transition::ephemeral(PhaseInfo::retryable(ExecError::system(
                        "start_lost",
                        "the command's start was interrupted before it ran",
                    ))));
                }
                Ok(Transition::ephemeral(PhaseInfo::running(0, "starting")))
            }
        }
    }

    /// Stops the command: TERM to its process group, KILL after 5 s.
    async fn abort(&self, ctx: &mut TaskContext) -> Result<(), ExecError> {
        let dir = attempt_dir(ctx);
        let Some(pid) = read_number(&dir.join("pid")) else { return Ok(()) };
        if !alive(pid) {
            return Ok(());
        }
        signal(pid, libc::SIGTERM);
        for _ in 0..50 {
            if !alive(pid) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        signal(pid, libc::SIGKILL);
        Ok(())
    }

    /// Keeps the attempt's directory (its logs are read after it ends).
    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }
}
