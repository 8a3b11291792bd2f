//! Where a submitted application goes: the queue it names, when it may be used, else the first
//! placement rule's (`allot_core::apps::placement`), over the queues the store has now.

use allot_api as api;
use allot_core::apps::placement::{PlacementRules, Request, Spot};
use allot_core::apps::queues::{QueuePath, Queues};
use allot_core::apps::QueueRule;

use crate::error::{ApiError, ErrorCode};

/// The queue an application names, as a path (`invalid_queue` if it cannot be one).
pub(crate) fn named_queue(text: Option<&str>) -> Result<Option<QueuePath>, ApiError> {
    let named = text.map(QueuePath::named).transpose();
    named.map_err(|e| ApiError::from(allot_core::apps::SchedError::from(e)))
}

/// The queue the rules choose for `body` (its user and groups already the ones it runs as),
/// given what exists now and whether the submitter may use a queue; the queue it names when
/// that one is a leaf it may use. No rule: the named queue as is.
pub(crate) fn choose(
    rules: &PlacementRules,
    body: &api::SubmitApp,
    queues: &Queues,
    usable: &dyn Fn(&QueuePath) -> bool,
) -> Result<(QueuePath, Option<QueueRule>), ApiError> {
    let named = named_queue(body.queue.as_deref())?;
    let spot = |path: &QueuePath| queues.get(path).map(|_| Spot { leaf: queues.children(path).next().is_none() });
    if rules.is_empty() {
        let queue = named.ok_or_else(|| {
            let message = format!(
                "application `{}` names no queue (`queue`), and no placement rules are configured to choose one",
                body.id
            );
            ApiError::of(ErrorCode::NoUsableQueue, message)
        })?;
        return Ok((queue, None));
    }
    if let Some(named) = named.as_ref().filter(|q| spot(q) == Some(Spot { leaf: true }) && usable(q)) {
        return Ok((named.clone(), None));
    }
    let request =
        Request { queue: body.queue.as_deref(), user: &body.user, groups: &body.user_groups, tags: &body.tags };
    match rules.place(&request, &spot, usable) {
        Ok(placed) => Ok((placed.queue, Some(QueueRule { rule: placed.rule, create: placed.create }))),
        // The queue it named exists and is refused to the user, and no rule helps: a refusal.
        Err(not_placed) if named.as_ref().is_some_and(|q| spot(q).is_some()) => {
            let named = named.expect("checked");
            let code =
                if spot(&named) == Some(Spot { leaf: true }) { ErrorCode::Forbidden } else { ErrorCode::QueueNotALeaf };
            let why = match code {
                ErrorCode::Forbidden => format!("user `{}` may not submit to queue `{named}`", body.user),
                _ => format!("queue `{named}` has child queues: applications go to leaf queues only"),
            };
            Err(ApiError::of(code, format!("{why}, and {}", lowered(&not_placed.to_string()))))
        }
        Err(not_placed) => Err(ApiError::of(
            ErrorCode::NoUsableQueue,
            format!("application `{}` of user `{}`: {not_placed}", body.id, body.user),
        )),
    }
}

fn lowered(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
}
