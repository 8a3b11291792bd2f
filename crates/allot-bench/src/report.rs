//! Latency summaries and the text reports of `allot bench`: one run's summary, the comparison
//! table, the wake-latency summary, and the checks against the issue's targets.

use std::fmt::Write as _;

use serde::Serialize;

use crate::load::LoadResult;

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub(super) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// One target of the issue, checked against a measurement.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Check {
    pub(super) what: String,
    /// The measured value; absent when it could not be measured.
    pub(super) value: Option<f64>,
    pub(super) limit: f64,
    pub(super) ok: bool,
}

impl Check {
    /// A check that passes when `value` is at least `limit`.
    pub(super) fn at_least(what: String, value: Option<f64>, limit: f64) -> Check {
        let ok = value.is_some_and(|v| v >= limit);
        Check { what, value, limit, ok }
    }

    /// A check that passes when `value` is at most `limit`.
    pub(super) fn at_most(what: String, value: Option<f64>, limit: f64) -> Check {
        let ok = value.is_some_and(|v| v <= limit);
        Check { what, value, limit, ok }
    }
}

/// Shows a benchmark's results (as JSON with `json`, else as `print` writes them), then fails
/// when `check` is asked and a target of `checks` was missed.
pub(super) fn finish<T: serde::Serialize>(
    output: &T,
    json: bool,
    print: impl FnOnce(&T),
    check: bool,
    checks: &[Check],
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(output)?);
    } else {
        print(output);
    }
    if check && checks.iter().any(|c| !c.ok) {
        anyhow::bail!("a target was missed");
    }
    Ok(())
}

/// The checks as lines of text.
pub(super) fn checks(checks: &[Check]) -> String {
    let mut out = String::new();
    for check in checks {
        let value = check.value.map_or_else(|| "not measured".to_owned(), |v| format!("{v:.3}"));
        let verdict = if check.ok { "ok" } else { "MISSED" };
        let _ = writeln!(out, "  {verdict:<6} {}: {value} (limit {})", check.what, check.limit);
    }
    out
}

/// The summary of one `allot bench pairs` run.
pub(super) fn summary(result: &LoadResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} ({}), {} clients, {:.1}s measured",
        result.target, result.url, result.clients, result.seconds
    );
    let _ = writeln!(out, "  pairs/s     {:>10.0}   ({} pairs)", result.pairs_per_s, result.pairs);
    let _ = writeln!(out, "  requests/s  {:>10.0}   ({} requests)", result.requests_per_s, result.requests);
    let _ = writeln!(out, "  latency ms      p50      p90      p99      max     mean");
    for (name, latency) in [
        ("request", &result.request_ms),
        ("allocate", &result.allocate_ms),
        ("release", &result.release_ms),
        ("pair", &result.pair_ms),
    ] {
        let _ = writeln!(
            out,
            "  {name:<10} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            latency.p50, latency.p90, latency.p99, latency.max, latency.mean
        );
    }
    let _ = writeln!(out, "  errors {}, not granted {}", result.errors, result.not_granted);
    if let Some(error) = &result.first_error {
        let _ = writeln!(out, "  first error: {error}");
    }
    out
}

/// One target at one number of clients, over the rounds of a run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Summary {
    pub(super) target: String,
    pub(super) clients: usize,
    pub(super) rounds: usize,
    /// Medians over the rounds.
    pub(super) pairs_per_s: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) server_cpu_us_per_pair: Option<f64>,
    /// The worst round's p99 and max.
    pub(super) p99_ms_worst: f64,
    pub(super) max_ms: f64,
    /// Errors and refusals of every round.
    pub(super) errors: u64,
}

/// The rounds of each target and number of clients, summarised, in first-seen order.
pub(super) fn summaries(results: &[LoadResult]) -> Vec<Summary> {
    let mut keys: Vec<(&str, usize)> = Vec::new();
    for result in results {
        if !keys.contains(&(result.target.as_str(), result.clients)) {
            keys.push((result.target.as_str(), result.clients));
        }
    }
    keys.into_iter()
        .map(|(target, clients)| {
            let rounds: Vec<&LoadResult> =
                results.iter().filter(|r| r.target == target && r.clients == clients).collect();
            let of = |f: fn(&LoadResult) -> f64| median(rounds.iter().map(|r| f(r)).collect()).unwrap_or(0.0);
            let worst = |f: fn(&LoadResult) -> f64| rounds.iter().map(|r| f(r)).fold(0.0, f64::max);
            Summary {
                target: target.to_owned(),
                clients,
                rounds: rounds.len(),
                pairs_per_s: of(|r| r.pairs_per_s),
                p50_ms: of(|r| r.request_ms.p50),
                p99_ms: of(|r| r.request_ms.p99),
                server_cpu_us_per_pair: median(rounds.iter().filter_map(|r| r.server_cpu_us_per_pair).collect()),
                p99_ms_worst: worst(|r| r.request_ms.p99),
                max_ms: worst(|r| r.request_ms.max),
                errors: rounds.iter().map(|r| r.errors + r.not_granted).sum(),
            }
        })
        .collect()
}

/// The summaries as a table, with pairs/s as a ratio of the baseline's at the same clients.
pub(super) fn summary_table(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>9} {:>8} {:>7} {:>7} {:>9} {:>7} {:>11} {:>6}",
        "target", "clients", "pairs/s", "vs base", "p50 ms", "p99 ms", "worst p99", "max ms", "cpu µs/pair", "errors"
    );
    for summary in summaries {
        let baseline = summaries.iter().find(|s| s.target == "baseline" && s.clients == summary.clients);
        let ratio = baseline
            .filter(|b| b.pairs_per_s > 0.0)
            .map_or_else(|| "-".to_owned(), |b| format!("{:.2}", summary.pairs_per_s / b.pairs_per_s));
        let _ = writeln!(
            out,
            "{:<14} {:>7} {:>9.0} {:>8} {:>7.3} {:>7.3} {:>9.3} {:>7.2} {:>11} {:>6}",
            summary.target,
            summary.clients,
            summary.pairs_per_s,
            ratio,
            summary.p50_ms,
            summary.p99_ms,
            summary.p99_ms_worst,
            summary.max_ms,
            summary.server_cpu_us_per_pair.map_or_else(|| "-".to_owned(), |cpu| format!("{cpu:.1}")),
            summary.errors,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn checks_need_a_value() {
        assert!(Check::at_least("r".into(), Some(0.9), 0.85).ok);
        assert!(!Check::at_least("r".into(), Some(0.8), 0.85).ok);
        assert!(!Check::at_most("p99".into(), None, 5.0).ok);
        assert!(Check::at_most("p99".into(), Some(5.0), 5.0).ok);
    }
}
