//! [`allocate`]: picks offers best-fit first ([`pick_n`], [`amount_to_take`]) and accepts one,
//! retrying with backoff. The two functions are the pick rule (`docs/glossary.md`) that the
//! Python client's `alloc()` follows too; `testdata/offer_picks.json` holds the cases both are
//! tested against.

use allot_api as api;
use rand::seq::SliceRandom;
use rand::Rng;
use std::fmt;
use std::time::Duration;

use super::*;

/// Up to `n` offers to try, best first [Reflow `pickN`]: offers that cannot fit `min` are
/// dropped; offers that can hold `max` come first, in ascending [`Resources::distance`] to `max`
/// (the tightest fit first); then offers that fit `min` but not `max`, also in ascending distance
/// to `max` (the largest first). Offers at equal distance keep their order (shuffle them first).
/// The distance counts every resource, weighted by `weights` (Reflow counted only cpu and mem).
pub fn pick_n<'a>(
    offers: &'a [PoolOffer],
    n: usize,
    min: &Resources,
    max: &Resources,
    weights: &SizeWeights,
) -> Vec<&'a PoolOffer> {
    let mut ranked: Vec<(bool, f64, &PoolOffer)> = offers
        .iter()
        .filter(|offer| offer.available.fits(min))
        .map(|offer| (!offer.available.fits(max), offer.available.distance(max, weights), offer))
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    ranked.into_iter().take(n).map(|(_, _, offer)| offer).collect()
}

/// How much to ask of an offer with `available` for a request of `min` to `max`: `max` capped by
/// what is available, or the whole offer when what would be left is useless: no cpu, no mem or no
/// disk left (each counted only if the offer has some) [Reflow's whole-offer rule].
pub fn amount_to_take(available: &Resources, min: &Resources, max: &Resources) -> Resources {
    use allot_core::resources::{CPU, DISK, MEM};
    let want = max.max(min).min(available);
    let left = available.saturating_sub(&want);
    let useless = [CPU, MEM, DISK].iter().any(|name| available.get_milli(name) > 0 && left.get_milli(name) == 0);
    if useless {
        available.clone()
    } else {
        want
    }
}

/// Waits between retries: `initial * factor^retry`, at most `max`, then shortened by a random
/// part of at most `jitter` (a wait lies in `[w - jitter * w, w)`, as Reflow's `retry.Jitter`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub max: Duration,
    /// 0 to 1.
    pub jitter: f64,
}

impl Backoff {
    /// The wait before retry `retry` (0 for the first retry) without jitter.
    pub fn nominal(&self, retry: u32) -> Duration {
        let factor = self.factor.max(1.0).powi(retry.min(1000) as i32);
        let secs = (self.initial.as_secs_f64() * factor).min(self.max.as_secs_f64());
        Duration::try_from_secs_f64(secs).unwrap_or(self.max)
    }

    /// The wait before retry `retry`, jittered.
    pub fn wait(&self, retry: u32) -> Duration {
        let nominal = self.nominal(retry).as_secs_f64();
        let spread = nominal * self.jitter.clamp(0.0, 1.0);
        let cut = if spread > 0.0 { rand::thread_rng().gen_range(0.0..spread) } else { 0.0 };
        Duration::from_secs_f64(nominal - cut)
    }
}

/// How [`allocate`] tries.
#[derive(Debug, Clone)]
pub struct AllocateOptions {
    /// How many rounds of "get offers, try the best picks" (default 6, Reflow's).
    pub tries: u32,
    /// How many offers each round tries, best first (default 10, Reflow's).
    pub picks: usize,
    /// The wait between rounds (default 50 ms doubling up to 1 s, jitter 0.2; Reflow had none).
    pub backoff: Backoff,
    /// How resources weigh in the best-fit distance (default: every resource, 8 GiB mem = 1 cpu).
    pub weights: SizeWeights,
    /// How long a round waits for offers (default 10 s).
    pub offers_timeout: Duration,
}

impl Default for AllocateOptions {
    fn default() -> AllocateOptions {
        AllocateOptions {
            tries: 6,
            picks: 10,
            backoff: Backoff {
                initial: Duration::from_millis(50),
                factor: 2.0,
                max: Duration::from_secs(1),
                jitter: 0.2,
            },
            weights: SizeWeights::default(),
            offers_timeout: DEFAULT_OFFERS_TIMEOUT,
        }
    }
}

/// What one round of [`allocate`] saw.
#[derive(Debug, Clone, Default)]
pub struct TryReport {
    /// Offers received.
    pub offers: usize,
    /// Offers picked (those that fit `min`, at most `picks`).
    pub picked: usize,
    /// Picks refused because the offer was gone (`offer_expired`, `pool_stopped`, `pool_not_found`).
    pub expired: usize,
    /// Picks refused with a transient error.
    pub transient: Vec<PoolCallError>,
    /// Pools that failed to give offers.
    pub failed_pools: Vec<PoolFailure>,
    /// Pools that did not give offers in time.
    pub timed_out_pools: Vec<String>,
}

impl fmt::Display for TryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} offers, {} fit", self.offers, self.picked)?;
        if self.expired > 0 {
            write!(f, ", {} gone when accepted", self.expired)?;
        }
        if let Some(last) = self.transient.last() {
            write!(f, ", {} transient errors (last: {last})", self.transient.len())?;
        }
        if let Some(first) = self.failed_pools.first() {
            write!(f, ", {} pools failed (first: {})", self.failed_pools.len(), first.error)?;
        }
        if !self.timed_out_pools.is_empty() {
            write!(f, ", {} pools timed out", self.timed_out_pools.len())?;
        }
        Ok(())
    }
}

/// Why [`allocate`] gave no alloc.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocateError {
    /// The request cannot be met by any offer: `min` is empty, or `max` is below `min`.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Accepting an offer failed with an error that another offer would not fix.
    #[error("accepting offer {offer} failed on try {try_number}: {error}")]
    Accept { offer: String, try_number: u32, error: PoolCallError },
    /// No pool could give offers, and retrying will not help.
    #[error("no pool gave offers: {}", failures_text(.failed))]
    Offers { failed: Vec<PoolFailure> },
    /// Every try ended without an alloc.
    #[error("no alloc for {min} after {} tries: {}", .tries.len(), tries_text(.tries))]
    Unavailable { min: Resources, tries: Vec<TryReport> },
}

fn failures_text(failed: &[PoolFailure]) -> String {
    failed.iter().map(|f| f.error.to_string()).collect::<Vec<_>>().join("; ")
}

fn tries_text(tries: &[TryReport]) -> String {
    tries.iter().enumerate().map(|(i, t)| format!("try {}: {t}", i + 1)).collect::<Vec<_>>().join("; ")
}

impl AllocateError {
    /// True when trying again later may succeed (nothing fit or everything was taken).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, AllocateError::Unavailable { .. })
    }
}

/// Allocates from `pools` [Reflow `pool.Allocate`, improved]: up to `options.tries` rounds with
/// backoff between them; each round gets the offers, shuffles them (so concurrent callers spread
/// out), and tries up to `options.picks` of them in [`pick_n`] order, asking each for
/// [`amount_to_take`]. An offer that is gone or a transient error moves on to the next pick; any
/// other error is returned at once.
pub async fn allocate<P: PoolSet + ?Sized>(
    pools: &P,
    request: &AllocNeed,
    options: &AllocateOptions,
) -> Result<api::Alloc, AllocateError> {
    if request.min.is_empty() {
        return Err(AllocateError::InvalidRequest("min is empty".to_owned()));
    }
    let max = request.max_or_min();
    let mut tries = Vec::new();
    for attempt in 0..options.tries.max(1) {
        if attempt > 0 {
            tokio::time::sleep(options.backoff.wait(attempt - 1)).await;
        }
        let report = pools.offers_within(options.offers_timeout).await;
        let mut offers = report.offers;
        shuffle(&mut offers);
        let picks = pick_n(&offers, options.picks, &request.min, &max, &options.weights);
        let mut outcome = TryReport {
            offers: offers.len(),
            picked: picks.len(),
            failed_pools: report.failed,
            timed_out_pools: report.timed_out,
            ..TryReport::default()
        };
        if offers.is_empty()
            && outcome.timed_out_pools.is_empty()
            && !outcome.failed_pools.is_empty()
            && outcome.failed_pools.iter().all(|f| !f.error.is_retryable())
        {
            return Err(AllocateError::Offers { failed: outcome.failed_pools });
        }
        for offer in picks {
            let take = amount_to_take(&offer.available, &request.min, &max);
            let accept = AllocNeed {
                min: request.min.clone(),
                max: (take != request.min).then_some(take),
                owner: request.owner.clone(),
                labels: request.labels.clone(),
                metadata: request.metadata.clone(),
            };
            match pools.accept_offer(offer, &accept).await {
                Ok(alloc) => return Ok(alloc),
                Err(err) if err.is_offer_gone() => outcome.expired += 1,
                Err(err) if err.is_retryable() => outcome.transient.push(err),
                Err(error) => return Err(AllocateError::Accept { offer: offer.uri(), try_number: attempt + 1, error }),
            }
        }
        tries.push(outcome);
    }
    Err(AllocateError::Unavailable { min: request.min.clone(), tries })
}

fn shuffle<T>(items: &mut [T]) {
    items.shuffle(&mut rand::thread_rng());
}
