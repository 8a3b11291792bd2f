//! Priorities: of applications and tasks (a number, or a named class of the daemon's), and of
//! queues as their parents order them [YuniKorn's priority scheduling: `priority.offset`,
//! `priority.policy = fence`].
//!
//! Invariants:
//! - once admitted, an application's and a task's [`Priority`] carry a value: the one given,
//!   the named class's, or (for an application) the default class's, else 0; a task that names
//!   neither takes its application's;
//! - a queue's priority is the highest of what waits in it (its applications' pending tasks, or
//!   its children's priorities), plus its offset, within `i32`; a fenced queue shows its parent
//!   only its offset; a queue with nothing pending has none and sorts after every other.

use std::collections::BTreeMap;

use super::SchedError;

/// A priority as asked for, and once admitted as resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Priority {
    /// Higher goes first. Set once admitted.
    pub value: Option<i32>,
    /// The named class it came from, if any.
    pub class: Option<String>,
}

impl Priority {
    /// A priority of `value`, named by no class.
    pub fn of(value: i32) -> Priority {
        Priority { value: Some(value), class: None }
    }

    /// The value; 0 for one not yet admitted.
    pub fn value(&self) -> i32 {
        self.value.unwrap_or(0)
    }
}

/// The most priority classes a daemon names, and the longest name.
pub const MAX_PRIORITY_CLASSES: usize = 100;
pub const MAX_PRIORITY_CLASS_NAME: usize = 63;

/// The daemon's named priorities (Kubernetes' `PriorityClass`), with the one an application
/// that names none gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriorityClasses {
    classes: BTreeMap<String, i32>,
    default: Option<String>,
}

impl PriorityClasses {
    /// Checks the names (1 to 63 of a-z, 0-9, `-`, as a Kubernetes name) and that the default is
    /// one of them.
    pub fn new(classes: BTreeMap<String, i32>, default: Option<String>) -> Result<PriorityClasses, String> {
        if classes.len() > MAX_PRIORITY_CLASSES {
            return Err(format!("at most {MAX_PRIORITY_CLASSES} priority classes, got {}", classes.len()));
        }
        let valid = |name: &str| {
            (1..=MAX_PRIORITY_CLASS_NAME).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if let Some(bad) = classes.keys().find(|name| !valid(name)) {
            return Err(format!(
                "priority class `{}` is not a name: 1 to {MAX_PRIORITY_CLASS_NAME} of a-z, 0-9 and `-`",
                bad.escape_debug()
            ));
        }
        if let Some(default) = default.as_ref().filter(|d| !classes.contains_key(*d)) {
            return Err(format!("the default priority class `{}` is not one of the classes", default.escape_debug()));
        }
        Ok(PriorityClasses { classes, default })
    }

    /// Every class by name.
    pub fn classes(&self) -> &BTreeMap<String, i32> {
        &self.classes
    }

    pub fn default_class(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// Resolves what `asked`: its value, or its class's; when it names neither, `inherit` (a
    /// task's application) or the default class (an application). Naming both is refused: the
    /// two could disagree.
    pub fn resolve(&self, asked: &Priority, inherit: Option<&Priority>) -> Result<Priority, SchedError> {
        match (asked.value, &asked.class) {
            (Some(_), Some(class)) => Err(SchedError::Invalid(format!(
                "give a priority or a priority class, not both (got priority {} and class `{class}`)",
                asked.value()
            ))),
            (Some(value), None) => Ok(Priority::of(value)),
            (None, Some(class)) => match self.classes.get(class) {
                Some(value) => Ok(Priority { value: Some(*value), class: Some(class.clone()) }),
                None => Err(SchedError::UnknownPriorityClass {
                    class: class.clone(),
                    known: match self.classes.is_empty() {
                        true => "the daemon names no priority classes".to_owned(),
                        false => format!(
                            "the daemon's classes are: {}",
                            self.classes.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    },
                }),
            },
            (None, None) => Ok(match (inherit, &self.default) {
                (Some(parent), _) => parent.clone(),
                (None, Some(class)) => Priority { value: self.classes.get(class).copied(), class: Some(class.clone()) },
                (None, None) => Priority::of(0),
            }),
        }
    }
}

/// How a queue shows its priority to its parent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PriorityPolicy {
    /// The highest priority waiting in it, plus its offset.
    #[default]
    Default,
    /// Its offset alone: what waits inside does not compete outside by its own priority.
    Fence,
}

impl PriorityPolicy {
    pub fn name(self) -> &'static str {
        match self {
            PriorityPolicy::Default => "default",
            PriorityPolicy::Fence => "fence",
        }
    }

    pub fn from_name(name: &str) -> Option<PriorityPolicy> {
        [PriorityPolicy::Default, PriorityPolicy::Fence].into_iter().find(|p| p.name() == name)
    }
}

/// What a queue shows its parent, given the highest priority pending inside it (`None`: nothing
/// pending, which stays none).
pub fn shown(policy: PriorityPolicy, offset: i32, inside: Option<i32>) -> Option<i32> {
    let inside = inside?;
    Some(match policy {
        PriorityPolicy::Fence => offset,
        PriorityPolicy::Default => inside.saturating_add(offset),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> PriorityClasses {
        PriorityClasses::new(
            BTreeMap::from([("high".to_owned(), 1000), ("normal".to_owned(), 0), ("batch".to_owned(), -100)]),
            Some("normal".to_owned()),
        )
        .unwrap()
    }

    #[test]
    fn a_priority_is_its_value_its_class_or_the_default() {
        let classes = classes();
        assert_eq!(classes.resolve(&Priority::of(7), None).unwrap(), Priority::of(7));
        let high = Priority { value: None, class: Some("high".into()) };
        assert_eq!(classes.resolve(&high, None).unwrap(), Priority { value: Some(1000), class: Some("high".into()) });
        let default = classes.resolve(&Priority::default(), None).unwrap();
        assert_eq!(default, Priority { value: Some(0), class: Some("normal".into()) });
        // A task naming nothing takes its application's.
        let app = Priority { value: Some(-100), class: Some("batch".into()) };
        assert_eq!(classes.resolve(&Priority::default(), Some(&app)).unwrap(), app);
        // Without classes, nothing named is 0.
        assert_eq!(PriorityClasses::default().resolve(&Priority::default(), None).unwrap(), Priority::of(0));
    }

    #[test]
    fn an_unknown_class_or_both_at_once_is_refused() {
        let classes = classes();
        let nope = Priority { value: None, class: Some("urgent".into()) };
        let err = classes.resolve(&nope, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "priority class `urgent` does not exist; the daemon's classes are: batch, high, normal"
        );
        let both = Priority { value: Some(5), class: Some("high".into()) };
        assert!(matches!(classes.resolve(&both, None), Err(SchedError::Invalid(_))));
    }

    #[test]
    fn classes_are_checked() {
        let one = |name: &str| BTreeMap::from([(name.to_owned(), 1)]);
        assert!(PriorityClasses::new(one("Bad Name"), None).is_err());
        assert!(PriorityClasses::new(one(""), None).is_err());
        assert!(PriorityClasses::new(one("ok"), Some("missing".into())).is_err());
        assert!(PriorityClasses::new(one("ok-1"), Some("ok-1".into())).is_ok());
    }

    #[test]
    fn a_fenced_queue_shows_its_offset_and_an_empty_one_nothing() {
        assert_eq!(shown(PriorityPolicy::Default, 10, Some(5)), Some(15));
        assert_eq!(shown(PriorityPolicy::Default, 10, Some(i32::MAX)), Some(i32::MAX), "saturates");
        assert_eq!(shown(PriorityPolicy::Fence, 10, Some(1000)), Some(10));
        assert_eq!(shown(PriorityPolicy::Fence, 10, None), None);
    }
}
