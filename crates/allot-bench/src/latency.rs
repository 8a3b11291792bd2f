//! A latency distribution, as every load of `allot bench` reports it.

use serde::Serialize;

/// A latency distribution in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(super) struct Latency {
    pub(super) count: u64,
    pub(super) mean: f64,
    pub(super) p50: f64,
    pub(super) p90: f64,
    pub(super) p99: f64,
    pub(super) max: f64,
}

impl Latency {
    /// Summarises samples given in nanoseconds.
    pub(super) fn from_nanos(mut samples: Vec<u64>) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let ms = |nanos: u64| nanos as f64 / 1e6;
        let at = |p: f64| {
            let rank = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            ms(samples[rank - 1])
        };
        let sum: u128 = samples.iter().map(|&n| u128::from(n)).sum();
        Latency {
            count: samples.len() as u64,
            mean: sum as f64 / samples.len() as f64 / 1e6,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: ms(samples[samples.len() - 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let latency = Latency::from_nanos((1..=100).map(|ms| ms * 1_000_000).collect());
        assert_eq!(latency.count, 100);
        assert_eq!(latency.p50, 50.0);
        assert_eq!(latency.p90, 90.0);
        assert_eq!(latency.p99, 99.0);
        assert_eq!(latency.max, 100.0);
        assert!((latency.mean - 50.5).abs() < 1e-9);
        let one = Latency::from_nanos(vec![2_000_000]);
        assert_eq!((one.p50, one.p99, one.max), (2.0, 2.0, 2.0));
        assert_eq!(Latency::from_nanos(Vec::new()).count, 0);
    }
}
