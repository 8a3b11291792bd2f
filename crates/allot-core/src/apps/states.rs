//! The state machines of applications and their tasks (YuniKorn's application-management
//! protocol, done with one typed machine per object).
//!
//! Each machine is one table of `(state, event, next state)` rows: an event that has no row for
//! the current state is an [`IllegalTransition`] naming both, and changes nothing. The store
//! holds the one state of each object; nothing keeps a second copy in sync.
//!
//! Invariants (checked by the tests): terminal states have no way out; every state is reachable
//! from `New`; from every state a terminal state can be reached; an application whose tasks have
//! all ended reaches a terminal state by [`settle`].

use std::fmt;

/// Why a transition was refused: the event has no row for the object's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{object} in state {state} cannot take event {event}")]
pub struct IllegalTransition {
    /// `application` or `task`.
    pub object: &'static str,
    pub state: &'static str,
    pub event: &'static str,
}

/// Declares a state or event enum with its name (for errors and the API) and its list.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn name(self) -> &'static str {
                match self { $($name::$variant => stringify!($variant)),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum! {
    /// The state of an application.
    AppState {
        /// Submitted, not yet admitted to its queue.
        New,
        /// Admitted, nothing of it placed yet (an application without task groups).
        Accepted,
        /// Waiting for its gang to be reserved: the placeholders of every task group, all
        /// together or none. Nothing of it is placed meanwhile.
        Reserving,
        /// Placing and running its tasks: something of it is placed, or its gang is reserved
        /// (every placeholder held, as YuniKorn reports a gang once its placeholders are
        /// allocated).
        Running,
        /// Its gang gave up (Soft): its reserve timeout ran out, or its placeholder timeout did
        /// and the unused placeholders are released; it goes on as an ordinary application.
        Resuming,
        /// Every task has ended (or it was reported complete): releasing what it holds.
        Completing,
        Completed,
        /// Failed (reported, or a Hard gang's timeout): releasing what it holds.
        Failing,
        Failed,
        /// Refused at admission (unknown queue, a gang that can never fit...).
        Rejected,
    }
}

named_enum! {
    /// What happens to an application.
    AppEvent {
        /// Admission passed; or a Soft gang that gave up before it was reserved waits as an
        /// ordinary application.
        Accept,
        /// Admission refused.
        Reject,
        /// It has task groups: wait for its gang to be reserved.
        Reserve,
        /// Run: its first placement (no gang), or its gang is reserved, or resuming is done, or
        /// a task was added while completing.
        Run,
        /// A Soft gang's reserve or placeholder timeout ran out.
        Resume,
        /// Every task has ended, or the application was reported complete.
        Complete,
        /// Reported failed, or a Hard gang's timeout ran out.
        Fail,
        /// Everything it held is released: completing or failing ends.
        Release,
    }
}

impl AppState {
    /// Completed, Failed and Rejected: nothing happens to the application any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, AppState::Completed | AppState::Failed | AppState::Rejected)
    }

    /// The state after `event`, or the refusal.
    pub fn on(self, event: AppEvent) -> Result<AppState, IllegalTransition> {
        next(APP_TRANSITIONS, self, event).ok_or(IllegalTransition {
            object: "application",
            state: self.name(),
            event: event.name(),
        })
    }
}

/// The application's machine: every legal transition, one row each.
pub const APP_TRANSITIONS: &[(AppState, AppEvent, AppState)] = {
    use AppEvent as E;
    use AppState as S;
    &[
        (S::New, E::Accept, S::Accepted),
        (S::New, E::Reject, S::Rejected),
        (S::Accepted, E::Reserve, S::Reserving),
        (S::Accepted, E::Run, S::Running),
        (S::Accepted, E::Complete, S::Completing),
        (S::Accepted, E::Fail, S::Failing),
        (S::Reserving, E::Run, S::Running),
        (S::Reserving, E::Resume, S::Resuming),
        (S::Reserving, E::Complete, S::Completing),
        (S::Reserving, E::Fail, S::Failing),
        // Its gang taken back whole by preemption: reserved again.
        (S::Running, E::Reserve, S::Reserving),
        (S::Running, E::Resume, S::Resuming),
        (S::Running, E::Complete, S::Completing),
        (S::Running, E::Fail, S::Failing),
        (S::Resuming, E::Accept, S::Accepted),
        (S::Resuming, E::Run, S::Running),
        (S::Resuming, E::Complete, S::Completing),
        (S::Resuming, E::Fail, S::Failing),
        (S::Completing, E::Run, S::Running),
        (S::Completing, E::Release, S::Completed),
        (S::Completing, E::Fail, S::Failing),
        (S::Failing, E::Release, S::Failed),
    ]
};

named_enum! {
    /// The state of a task.
    TaskState {
        /// Added, not yet checked against its group.
        New,
        /// Waiting to be placed.
        Pending,
        /// A placement is being made: its alloc and tokens, together or not at all.
        Scheduling,
        /// Its alloc and tokens are held; whoever runs it may start it.
        Allocated,
        Running,
        Completed,
        Failed,
        /// Removed, or ended with its application.
        Killed,
        /// Refused when added (larger than its group's placeholder, an unknown group...).
        Rejected,
    }
}

named_enum! {
    /// What happens to a task.
    TaskEvent {
        /// Checked and admitted: it waits to be placed.
        Admit,
        /// Refused when added.
        Reject,
        /// The scheduler takes it up.
        Schedule,
        /// The placement did not fit: back to waiting, holding nothing.
        Defer,
        /// Its alloc and tokens are held.
        Allocate,
        /// Reported running.
        Start,
        /// Reported completed.
        Complete,
        /// Reported failed, or failed with its application.
        Fail,
        /// Removed, or ended with its application.
        Kill,
        /// Its placement was lost (the daemon that runs its pool stopped): back to waiting,
        /// holding nothing, to be placed again elsewhere.
        Lose,
    }
}

impl TaskState {
    /// Completed, Failed, Killed and Rejected: the task holds nothing and nothing happens to it.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Killed | TaskState::Rejected)
    }

    /// The state after `event`, or the refusal.
    pub fn on(self, event: TaskEvent) -> Result<TaskState, IllegalTransition> {
        next(TASK_TRANSITIONS, self, event).ok_or(IllegalTransition {
            object: "task",
            state: self.name(),
            event: event.name(),
        })
    }
}

/// The task's machine: every legal transition, one row each.
pub const TASK_TRANSITIONS: &[(TaskState, TaskEvent, TaskState)] = {
    use TaskEvent as E;
    use TaskState as S;
    &[
        (S::New, E::Admit, S::Pending),
        (S::New, E::Reject, S::Rejected),
        (S::New, E::Kill, S::Killed),
        (S::Pending, E::Schedule, S::Scheduling),
        (S::Pending, E::Fail, S::Failed),
        (S::Pending, E::Kill, S::Killed),
        (S::Scheduling, E::Allocate, S::Allocated),
        (S::Scheduling, E::Defer, S::Pending),
        (S::Scheduling, E::Fail, S::Failed),
        (S::Scheduling, E::Kill, S::Killed),
        (S::Allocated, E::Start, S::Running),
        (S::Allocated, E::Complete, S::Completed),
        (S::Allocated, E::Fail, S::Failed),
        (S::Allocated, E::Kill, S::Killed),
        (S::Allocated, E::Lose, S::Pending),
        (S::Running, E::Complete, S::Completed),
        (S::Running, E::Fail, S::Failed),
        (S::Running, E::Kill, S::Killed),
        (S::Running, E::Lose, S::Pending),
    ]
};

fn next<S: Copy + PartialEq, E: Copy + PartialEq>(table: &[(S, E, S)], state: S, event: E) -> Option<S> {
    table.iter().find(|(from, on, _)| *from == state && *on == event).map(|(_, _, to)| *to)
}

/// What an application does by itself once every one of its tasks has ended (`tasks_ended`) or
/// while it releases what it holds: the events that take it on, in order, until it is terminal or
/// waits for something else. A Failing application always ends Failed; a live one with no task
/// left completes.
pub fn settle(state: AppState, tasks_ended: bool) -> Vec<AppEvent> {
    match state {
        AppState::Completing | AppState::Failing => vec![AppEvent::Release],
        AppState::Accepted | AppState::Reserving | AppState::Running | AppState::Resuming if tasks_ended => {
            vec![AppEvent::Complete, AppEvent::Release]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The states reachable from `start` in `table`.
    fn reachable<S: Copy + Ord, E>(table: &[(S, E, S)], start: S) -> BTreeSet<S> {
        let mut seen = BTreeSet::from([start]);
        loop {
            let more: Vec<S> =
                table.iter().filter(|(from, _, to)| seen.contains(from) && !seen.contains(to)).map(|r| r.2).collect();
            if more.is_empty() {
                return seen;
            }
            seen.extend(more);
        }
    }

    #[test]
    fn each_table_has_one_row_per_state_and_event() {
        let mut apps = BTreeSet::new();
        assert!(APP_TRANSITIONS.iter().all(|(s, e, _)| apps.insert((*s, *e))), "a duplicate application row");
        let mut tasks = BTreeSet::new();
        assert!(TASK_TRANSITIONS.iter().all(|(s, e, _)| tasks.insert((*s, *e))), "a duplicate task row");
    }

    #[test]
    fn terminal_states_have_no_way_out_and_every_state_can_end() {
        for state in AppState::ALL {
            let out = APP_TRANSITIONS.iter().any(|(from, _, _)| from == state);
            assert_eq!(out, !state.is_terminal(), "{state}");
            assert!(reachable(APP_TRANSITIONS, AppState::New).contains(state), "{state} is unreachable");
            assert!(reachable(APP_TRANSITIONS, *state).iter().any(|s| s.is_terminal()), "{state} cannot end");
        }
        for state in TaskState::ALL {
            let out = TASK_TRANSITIONS.iter().any(|(from, _, _)| from == state);
            assert_eq!(out, !state.is_terminal(), "{state}");
            assert!(reachable(TASK_TRANSITIONS, TaskState::New).contains(state), "{state} is unreachable");
            assert!(reachable(TASK_TRANSITIONS, *state).iter().any(|s| s.is_terminal()), "{state} cannot end");
        }
    }

    #[test]
    fn an_illegal_event_names_the_state_and_the_event() {
        let err = AppState::Completed.on(AppEvent::Run).unwrap_err();
        assert_eq!(err.to_string(), "application in state Completed cannot take event Run");
        let err = TaskState::Pending.on(TaskEvent::Start).unwrap_err();
        assert_eq!(err.to_string(), "task in state Pending cannot take event Start");
        assert_eq!(AppState::Reserving.on(AppEvent::Resume), Ok(AppState::Resuming));
        assert_eq!(TaskState::Scheduling.on(TaskEvent::Defer), Ok(TaskState::Pending));
    }

    proptest::proptest! {
        /// Random events on an application and its tasks: a refused event changes nothing, no
        /// object leaves its table, and once every task has ended the application ends too.
        #[test]
        fn random_events_never_reach_an_illegal_state_and_applications_end(
            events in proptest::collection::vec((0usize..4, 0usize..16), 0..60),
        ) {
            let mut app = AppState::New;
            let mut tasks = [TaskState::New; 3];
            for (target, index) in events {
                if target == 3 {
                    let event = AppEvent::ALL[index % AppEvent::ALL.len()];
                    match app.on(event) {
                        Ok(next) => {
                            proptest::prop_assert!(APP_TRANSITIONS.contains(&(app, event, next)));
                            app = next;
                        }
                        Err(err) => proptest::prop_assert_eq!(err.state, app.name()),
                    }
                } else {
                    let event = TaskEvent::ALL[index % TaskEvent::ALL.len()];
                    let task = &mut tasks[target];
                    if let Ok(next) = task.on(event) {
                        proptest::prop_assert!(TASK_TRANSITIONS.contains(&(*task, event, next)));
                        *task = next;
                    }
                }
            }
            // The tasks end (killed if need be), then the application settles by itself.
            for task in &mut tasks {
                if !task.is_terminal() {
                    *task = task.on(TaskEvent::Kill).unwrap();
                }
            }
            for event in settle(app, tasks.iter().all(|t| t.is_terminal())) {
                app = app.on(event).unwrap();
            }
            // An application never admitted stays New until it is accepted or rejected.
            proptest::prop_assert!(app.is_terminal() || app == AppState::New, "{} did not end", app);
        }
    }
}
