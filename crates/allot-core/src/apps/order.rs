//! The orders a list of applications comes in, and a place in one (where the next page starts):
//! by id, by submission (YuniKorn's `SubmissionTime`), or by end.

use std::cmp::Ordering;

use crate::apps::{App, AppId, SchedError, Scheduler};
use crate::quotas::Millis;

/// The order of a list of applications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AppOrder {
    /// By id (the default).
    #[default]
    Id,
    /// By submission, oldest first (or newest first, `descending`); submissions in one
    /// millisecond in the order the scheduler took them.
    Submitted { descending: bool },
    /// By end, the earliest first (or the latest, `descending`); those not ended come last,
    /// in submission order.
    Ended { descending: bool },
}

/// A place in a list of applications: a page starts after it. Its kind goes with the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppPlace {
    Id(AppId),
    /// The submission number ([`App::seq`]: unique, in submission order).
    Submitted {
        seq: u64,
    },
    /// When it ended (none: not yet), and its submission number.
    Ended {
        at: Option<Millis>,
        seq: u64,
    },
}

impl App {
    /// Its place in a list in `order`.
    pub fn place(&self, order: AppOrder) -> AppPlace {
        match order {
            AppOrder::Id => AppPlace::Id(self.spec.id.clone()),
            AppOrder::Submitted { .. } => AppPlace::Submitted { seq: self.seq },
            AppOrder::Ended { .. } => AppPlace::Ended { at: self.ended_at, seq: self.seq },
        }
    }
}

impl AppOrder {
    /// How two places of this order's kind compare in it.
    fn compare(self, a: &AppPlace, b: &AppPlace) -> Ordering {
        let flip = |ordering: Ordering, descending: bool| if descending { ordering.reverse() } else { ordering };
        match (self, a, b) {
            (AppOrder::Submitted { descending }, AppPlace::Submitted { seq: a }, AppPlace::Submitted { seq: b }) => {
                flip(a.cmp(b), descending)
            }
            (
                AppOrder::Ended { descending },
                AppPlace::Ended { at: a, seq: sa },
                AppPlace::Ended { at: b, seq: sb },
            ) => match (a, b) {
                (Some(a), Some(b)) => flip(a.cmp(b).then(sa.cmp(sb)), descending),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => sa.cmp(sb),
            },
            (_, AppPlace::Id(a), AppPlace::Id(b)) => a.cmp(b),
            // Places of different kinds are refused before they are compared.
            _ => Ordering::Equal,
        }
    }

    /// Whether `place` is of this order's kind.
    pub fn fits(self, place: &AppPlace) -> bool {
        matches!(
            (self, place),
            (AppOrder::Id, AppPlace::Id(_))
                | (AppOrder::Submitted { .. }, AppPlace::Submitted { .. })
                | (AppOrder::Ended { .. }, AppPlace::Ended { .. })
        )
    }
}

impl Scheduler {
    /// At most `limit` applications after `after` in `order` (a place of another order's kind
    /// is refused).
    pub fn apps_in_order(
        &self,
        order: AppOrder,
        after: Option<&AppPlace>,
        limit: usize,
    ) -> Result<Vec<&App>, SchedError> {
        if after.is_some_and(|place| !order.fits(place)) {
            return Err(SchedError::Invalid(format!(
                "{after:?} is not a place in a list of applications by {order:?}"
            )));
        }
        match (order, after) {
            (AppOrder::Id, Some(AppPlace::Id(id))) => return Ok(self.apps_after(Some(id), limit)),
            (AppOrder::Id, _) => return Ok(self.apps_after(None, limit)),
            _ => {}
        }
        let mut apps: Vec<(AppPlace, &App)> = self
            .apps
            .values()
            .map(|app| (app.place(order), app))
            .filter(|(place, _)| after.is_none_or(|after| order.compare(place, after) == Ordering::Greater))
            .collect();
        let by_place = |a: &(AppPlace, &App), b: &(AppPlace, &App)| order.compare(&a.0, &b.0);
        if apps.len() > limit {
            apps.select_nth_unstable_by(limit, by_place);
            apps.truncate(limit);
        }
        apps.sort_unstable_by(by_place);
        Ok(apps.into_iter().map(|(_, app)| app).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(order: AppOrder, places: &[AppPlace]) -> Vec<AppPlace> {
        let mut sorted = places.to_vec();
        sorted.sort_by(|a, b| order.compare(a, b));
        sorted
    }

    #[test]
    fn ended_applications_come_first_in_either_direction() {
        let ended = |at, seq| AppPlace::Ended { at: Some(at), seq };
        let running = |seq| AppPlace::Ended { at: None, seq };
        let all = [running(3), ended(20, 1), running(0), ended(10, 2), ended(10, 4)];
        assert_eq!(
            places(AppOrder::Ended { descending: false }, &all),
            [ended(10, 2), ended(10, 4), ended(20, 1), running(0), running(3)]
        );
        assert_eq!(
            places(AppOrder::Ended { descending: true }, &all),
            [ended(20, 1), ended(10, 4), ended(10, 2), running(0), running(3)]
        );
    }

    #[test]
    fn a_place_of_another_order_is_refused() {
        let sched = Scheduler::default();
        let order = AppOrder::Submitted { descending: false };
        let refused = sched.apps_in_order(order, Some(&AppPlace::Ended { at: None, seq: 1 }), 10);
        assert!(matches!(refused, Err(SchedError::Invalid(_))), "{refused:?}");
        assert_eq!(sched.apps_in_order(order, Some(&AppPlace::Submitted { seq: 1 }), 10), Ok(vec![]));
    }
}
