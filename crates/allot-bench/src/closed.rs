//! A closed-loop runner for pairs of calls that are not the HTTP grant pairs of `load`: each
//! client runs `pair(index, fresh token)` back to back; pairs that start and end inside the
//! measurement window count.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::latency::Latency;
use crate::load::{self, LoadSpec};

/// One row of the result table.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) target: String,
    pub(super) clients: usize,
    pub(super) pairs_per_s: f64,
    pub(super) pair_ms: Latency,
    pub(super) errors: u64,
    pub(super) not_granted: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) first_error: Option<String>,
}

/// What one pair did.
pub(super) enum Pair {
    Done,
    NotGranted,
    Failed(String),
}

/// `clients` tasks, each doing `pair(index, fresh token)` in a closed loop, measured over the
/// spec's window after its warm-up.
pub(super) async fn closed_loop<F, Fut>(name: &str, clients: usize, spec: &LoadSpec, pair: F) -> Row
where
    F: Fn(usize, String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Pair> + Send,
{
    let run = load::run_id();
    let began = Instant::now();
    let (start, end) = (began + spec.warmup, began + spec.warmup + spec.duration);
    let tasks: Vec<_> = (0..clients)
        .map(|index| {
            let (pair, run) = (pair.clone(), run.clone());
            tokio::spawn(async move {
                let (mut samples, mut errors, mut not_granted, mut first_error) = (Vec::new(), 0u64, 0u64, None);
                for seq in 0u64.. {
                    let started = Instant::now();
                    if started >= end {
                        break;
                    }
                    let outcome = pair(index, format!("{run}-{index}-{seq}")).await;
                    let finished = Instant::now();
                    let inside = started >= start && finished <= end;
                    match outcome {
                        Pair::Done if inside => samples.push((finished - started).as_nanos() as u64),
                        Pair::Done => {}
                        Pair::NotGranted => not_granted += u64::from(inside),
                        Pair::Failed(message) => {
                            errors += u64::from(inside);
                            first_error.get_or_insert(message);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                (samples, errors, not_granted, first_error)
            })
        })
        .collect();
    let mut row = Row {
        target: name.to_owned(),
        clients,
        pairs_per_s: 0.0,
        pair_ms: Latency::default(),
        errors: 0,
        not_granted: 0,
        first_error: None,
    };
    let mut all = Vec::new();
    for task in tasks {
        match task.await {
            Ok((samples, errors, not_granted, first_error)) => {
                all.extend(samples);
                row.errors += errors;
                row.not_granted += not_granted;
                if row.first_error.is_none() {
                    row.first_error = first_error;
                }
            }
            Err(err) => {
                row.errors += 1;
                row.first_error.get_or_insert(err.to_string());
            }
        }
    }
    row.pairs_per_s = all.len() as f64 / spec.duration.as_secs_f64();
    row.pair_ms = Latency::from_nanos(all);
    row
}
