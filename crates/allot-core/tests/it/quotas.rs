//! Ledger tests: deterministic, with the clock passed in by hand.

use allot_core::*;

fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(name).unwrap()
}

fn req(namespace: &str, token: &str, units: u64) -> AllocateRequest {
    AllocateRequest {
        namespace: ns(namespace),
        token: Token::new(token).unwrap(),
        units,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    }
}

fn scoped(namespace: &str, token: &str, project: &str, domain: &str, caps: Constraints) -> AllocateRequest {
    AllocateRequest { scope: Some(Scope::new(project, domain).unwrap()), constraints: caps, ..req(namespace, token, 1) }
}

fn ledger_with(namespace: &str, quota: u64) -> Ledger {
    let mut ledger = Ledger::new();
    ledger.put_namespace(&ns(namespace), quota, 0).unwrap();
    ledger
}

#[track_caller]
fn granted(decision: &Decision) -> &Grant {
    match decision {
        Decision::Granted { grant, .. } => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[track_caller]
fn queued(decision: &Decision) -> WaiterId {
    match decision {
        Decision::Queued { waiter, .. } => *waiter,
        other => panic!("expected to be queued, got {other:?}"),
    }
}

#[test]
fn grants_until_the_quota_is_full() {
    let mut ledger = ledger_with("hive", 2);
    let (a, effects) = ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    assert_eq!(granted(&a).fencing, 1);
    assert!(effects.changes.iter().any(|c| matches!(c, Change::GrantAdded(_))));
    let (b, _) = ledger.allocate(req("hive", "b", 1), 0, false).unwrap();
    assert_eq!(granted(&b).fencing, 2);
    let (c, effects) = ledger.allocate(req("hive", "c", 1), 0, false).unwrap();
    assert_eq!(c, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    assert!(effects.is_empty());
    ledger.check_invariants().unwrap();
}

#[test]
fn allocate_is_idempotent_and_counted_once() {
    let mut ledger = ledger_with("hive", 1);
    let (first, _) = ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    let (again, effects) = ledger.allocate(req("hive", "a", 1), 5, false).unwrap();
    assert_eq!(again, Decision::Granted { grant: granted(&first).clone(), existing: true });
    assert!(effects.changes.is_empty());
    assert_eq!(ledger.namespace(&ns("hive"), 0).unwrap().granted_units, 1);
    let conflict = ledger.allocate(req("hive", "a", 2), 0, false);
    assert!(matches!(conflict, Err(LedgerError::TokenConflict { field: "units", .. })));
}

#[test]
fn a_retry_must_ask_for_the_lease_it_was_granted() {
    let mut ledger = ledger_with("hive", 3);
    let id = SessionId(1);
    ledger.open_session(id, 60_000, None, 0).unwrap();
    let with_ttl = AllocateRequest { lease: LeaseRequest::Ttl { ttl_ms: 30_000 }, ..req("hive", "ttl", 1) };
    granted(&ledger.allocate(with_ttl.clone(), 0, false).unwrap().0);
    // The same TTL is a retry; another TTL, no lease or a session is a conflict naming the field.
    assert!(matches!(ledger.allocate(with_ttl.clone(), 1, false).unwrap().0, Decision::Granted { existing: true, .. }));
    let other_ttl = AllocateRequest { lease: LeaseRequest::Ttl { ttl_ms: 60_000 }, ..with_ttl.clone() };
    let err = ledger.allocate(other_ttl, 1, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "token `ttl` is already granted with a different ttl_ms (granted: ttl_ms 30000; asked: ttl_ms 60000); \
         release it first or use another token"
    );
    let no_lease = AllocateRequest { lease: LeaseRequest::None, ..with_ttl.clone() };
    assert!(matches!(ledger.allocate(no_lease, 1, false), Err(LedgerError::TokenConflict { field: "ttl_ms", .. })));
    let session = AllocateRequest { lease: LeaseRequest::Session(id), ..with_ttl };
    assert!(matches!(
        ledger.allocate(session.clone(), 1, false),
        Err(LedgerError::TokenConflict { field: "session", .. })
    ));
    // A grant of a session retried without it, or with another session, is a conflict too.
    let other = SessionId(2);
    ledger.open_session(other, 60_000, None, 0).unwrap();
    let in_session = AllocateRequest { token: Token::new("s").unwrap(), ..session };
    granted(&ledger.allocate(in_session.clone(), 2, false).unwrap().0);
    let elsewhere = AllocateRequest { lease: LeaseRequest::Session(other), ..in_session.clone() };
    assert!(matches!(
        ledger.allocate(elsewhere, 2, false),
        Err(LedgerError::TokenConflict { field: "session", waiting: false, .. })
    ));
    let alone = AllocateRequest { lease: LeaseRequest::None, ..in_session };
    assert!(matches!(ledger.allocate(alone, 2, false), Err(LedgerError::TokenConflict { field: "session", .. })));
    ledger.check_invariants().unwrap();
}

#[test]
fn a_retried_wait_must_ask_for_the_same_lease() {
    let mut ledger = ledger_with("hive", 1);
    granted(&ledger.allocate(req("hive", "held", 1), 0, false).unwrap().0);
    let waiting = AllocateRequest { lease: LeaseRequest::Ttl { ttl_ms: 5_000 }, ..req("hive", "w", 1) };
    queued(&ledger.allocate(waiting.clone(), 0, true).unwrap().0);
    let other = AllocateRequest { lease: LeaseRequest::Ttl { ttl_ms: 9_000 }, ..waiting };
    let err = ledger.allocate(other, 1, true).unwrap_err();
    assert!(matches!(err, LedgerError::TokenConflict { field: "ttl_ms", waiting: true, .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains("already waiting with a different ttl_ms (waiting for: ttl_ms 5000; asked: ttl_ms 9000)"));
}

#[test]
fn release_is_idempotent_and_says_what_it_did() {
    let mut ledger = ledger_with("hive", 1);
    ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    let (released, _) = ledger.release(&ns("hive"), &Token::new("a").unwrap(), None, 0).unwrap();
    assert_eq!(released.unwrap().units, 1);
    let (again, effects) = ledger.release(&ns("hive"), &Token::new("a").unwrap(), None, 0).unwrap();
    assert_eq!(again, None);
    assert!(effects.changes.is_empty());
    assert!(matches!(
        ledger.release(&ns("nope"), &Token::new("a").unwrap(), None, 0),
        Err(LedgerError::NamespaceNotFound(_))
    ));
}

#[test]
fn multi_unit_grants_count_their_units() {
    let mut ledger = ledger_with("gpu", 10);
    granted(&ledger.allocate(req("gpu", "big", 7), 0, false).unwrap().0);
    let (small, _) = ledger.allocate(req("gpu", "small", 4), 0, false).unwrap();
    assert_eq!(small, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    granted(&ledger.allocate(req("gpu", "small", 3), 0, false).unwrap().0);
    // More than the whole quota is not an error: the quota may be raised.
    let (huge, _) = ledger.allocate(req("gpu", "huge", 11), 0, false).unwrap();
    assert_eq!(huge, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    assert!(matches!(ledger.allocate(req("gpu", "zero", 0), 0, false), Err(LedgerError::OutOfRange { .. })));
}

#[test]
fn caps_match_scopes_exactly_and_name_the_level() {
    let mut ledger = ledger_with("hive", 100);
    let caps = Constraints { project: Some(2), namespace: Some(1) };
    granted(&ledger.allocate(scoped("hive", "p1", "proj", "dev", caps), 0, false).unwrap().0);
    // Same project and domain: the namespace-scope cap of 1 is full.
    let (d, _) = ledger.allocate(scoped("hive", "p2", "proj", "dev", caps), 0, false).unwrap();
    assert_eq!(
        d,
        Decision::Refused {
            refusal: Refusal::CapExceeded { level: CapLevel::Namespace, cap: 1, held: 1 },
            place: None
        }
    );
    // `proj:development` is another namespace scope; `proj2` is another project (Flyte's prefix bug).
    granted(&ledger.allocate(scoped("hive", "p3", "proj", "development", caps), 0, false).unwrap().0);
    granted(&ledger.allocate(scoped("hive", "p4", "proj2", "dev", caps), 0, false).unwrap().0);
    // Project `proj` now holds 2: its cap is full whatever the domain.
    let (d, _) = ledger.allocate(scoped("hive", "p5", "proj", "prod", caps), 0, false).unwrap();
    assert_eq!(
        d,
        Decision::Refused { refusal: Refusal::CapExceeded { level: CapLevel::Project, cap: 2, held: 2 }, place: None }
    );
    // A cap of zero lets the scope hold nothing; no caps means no limit.
    let zero = Constraints { project: Some(0), namespace: None };
    assert!(matches!(
        ledger.allocate(scoped("hive", "z", "other", "dev", zero), 0, false).unwrap().0,
        Decision::Refused { refusal: Refusal::CapExceeded { level: CapLevel::Project, cap: 0, held: 0 }, .. }
    ));
    granted(&ledger.allocate(scoped("hive", "free", "proj", "dev", Constraints::default()), 0, false).unwrap().0);
    let mut no_scope = req("hive", "x", 1);
    no_scope.constraints.project = Some(1);
    assert_eq!(ledger.allocate(no_scope, 0, false), Err(LedgerError::CapsWithoutScope));
    ledger.check_invariants().unwrap();
}

#[test]
fn ttl_leases_expire_and_keepalive_renews_them() {
    let mut ledger = ledger_with("hive", 1);
    let mut r = req("hive", "a", 1);
    r.lease = LeaseRequest::Ttl { ttl_ms: 100 };
    ledger.allocate(r, 0, false).unwrap();
    assert_eq!(ledger.next_deadline(), Some(100));
    assert!(ledger.expire(99).is_empty());
    let (grant, effects) = ledger.keepalive_grant(&ns("hive"), &Token::new("a").unwrap(), Some(1), 50).unwrap();
    assert_eq!(grant.lease, Lease::Ttl { ttl_ms: 100, deadline: 150 });
    assert_eq!(effects.changes, vec![Change::Grant(grant.clone())]);
    assert!(ledger.expire(149).is_empty());
    let effects = ledger.expire(150);
    assert_eq!(effects.expired, 1);
    assert_eq!(ledger.namespace(&ns("hive"), 150).unwrap().granted_units, 0);
    assert_eq!(ledger.namespace(&ns("hive"), 150).unwrap().stats.expired, 1);
    assert_eq!(ledger.next_deadline(), None);
    ledger.check_invariants().unwrap();
}

#[test]
fn leases_due_at_once_end_in_batches_earliest_first() {
    let mut ledger = ledger_with("hive", 10);
    for (i, ttl_ms) in [30, 10, 20, 10, 40].into_iter().enumerate() {
        let mut r = req("hive", &format!("t{i}"), 1);
        r.lease = LeaseRequest::Ttl { ttl_ms };
        ledger.allocate(r, 0, false).unwrap();
    }
    let first = ledger.expire_some(35, 2);
    assert_eq!(first.expired, 2);
    assert_eq!(ledger.next_deadline(), Some(20), "the two due at 10 went first; more are due");
    let second = ledger.expire_some(35, 2);
    assert_eq!(second.expired, 2);
    assert_eq!(ledger.next_deadline(), Some(40), "nothing more is due at 35");
    assert!(ledger.expire_some(35, 2).is_empty());
    assert_eq!(ledger.namespace(&ns("hive"), 35).unwrap().granted_units, 1);
    ledger.check_invariants().unwrap();
}

#[test]
fn stale_fencing_numbers_are_refused() {
    let mut ledger = ledger_with("hive", 1);
    ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    ledger.release(&ns("hive"), &Token::new("a").unwrap(), Some(1), 0).unwrap();
    let (grant, _) = ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    assert_eq!(granted(&grant).fencing, 2);
    let token = Token::new("a").unwrap();
    assert_eq!(
        ledger.release(&ns("hive"), &token, Some(1), 0),
        Err(LedgerError::StaleFencing { given: 1, current: 2 })
    );
    assert!(matches!(ledger.keepalive_grant(&ns("hive"), &token, Some(1), 0), Err(LedgerError::StaleFencing { .. })));
    assert!(ledger.release(&ns("hive"), &token, Some(2), 0).unwrap().0.is_some());
}

#[test]
fn a_namespace_where_allot_holds_a_grant_is_not_removed_even_with_force() {
    let mut ledger = ledger_with("hive", 3);
    ledger.allocate(req("hive", "client", 1), 0, false).unwrap();
    ledger.allocate_held(req("hive", "@app:task", 1), 0, false).unwrap();
    for force in [false, true] {
        let refused = ledger.remove_namespace(&ns("hive"), force);
        let Err(LedgerError::NamespaceHeldByScheduler { grants: 1, token, .. }) = &refused else {
            panic!("force {force}: {refused:?}");
        };
        assert_eq!(token.as_str(), "@app:task");
    }
    assert_eq!(ledger.namespace(&ns("hive"), 0).unwrap().granted_units, 2, "nothing was ended");
    ledger.release_held(&ns("hive"), &Token::new("@app:task").unwrap(), 0).unwrap();
    assert_eq!(ledger.remove_namespace(&ns("hive"), true).unwrap().0, 1, "the client's grant ends with force");
}

#[test]
fn fencing_keeps_increasing_when_a_namespace_is_recreated() {
    let mut ledger = ledger_with("hive", 1);
    ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    assert!(matches!(ledger.remove_namespace(&ns("hive"), false), Err(LedgerError::NamespaceInUse { grants: 1, .. })));
    ledger.remove_namespace(&ns("hive"), true).unwrap();
    ledger.put_namespace(&ns("hive"), 1, 0).unwrap();
    let (grant, _) = ledger.allocate(req("hive", "b", 1), 0, false).unwrap();
    // Numbering goes on exactly where the first incarnation stopped: the removal records it.
    assert_eq!(granted(&grant).fencing, 2);
}

#[test]
fn fencing_numbers_are_made_durable_a_block_at_a_time() {
    let mut ledger = ledger_with("hive", 10);
    let (_, effects) = ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    let bound = 2 + FENCING_BLOCK;
    assert!(effects.changes.contains(&Change::Namespace {
        name: ns("hive"),
        quota: 10,
        next_fencing: bound,
        put: false
    }));
    let (_, effects) = ledger.allocate(req("hive", "b", 1), 0, false).unwrap();
    assert!(!effects.changes.iter().any(|c| matches!(c, Change::Namespace { .. })), "{effects:?}");
    // After a restart from the durable records, numbering continues at the bound.
    let grants = ledger.grants(&ns("hive")).unwrap();
    let mut restored = Ledger::restore(vec![(ns("hive"), 10, bound)], vec![], vec![], grants).unwrap();
    let (grant, _) = restored.allocate(req("hive", "c", 1), 0, false).unwrap();
    assert_eq!(granted(&grant).fencing, bound);
}

#[test]
fn a_fencing_checkpoint_makes_the_exact_next_number_durable() {
    let mut ledger = ledger_with("hive", 10);
    ledger.put_namespace(&ns("idle"), 1, 0).unwrap();
    for token in ["a", "b", "c"] {
        ledger.allocate(req("hive", token, 1), 0, false).unwrap();
    }
    // Only namespaces whose durable bound is ahead of the next number are rewritten.
    let changes = ledger.fencing_checkpoint();
    assert_eq!(changes, vec![Change::Namespace { name: ns("hive"), quota: 10, next_fencing: 4, put: false }]);
    ledger.check_invariants().unwrap();
    assert!(ledger.fencing_checkpoint().is_empty(), "a second checkpoint has nothing to write");
    // A restart from those records continues exactly; the next grant reserves a new block.
    let grants = ledger.grants(&ns("hive")).unwrap();
    let mut restored = Ledger::restore(vec![(ns("hive"), 10, 4)], vec![], vec![], grants).unwrap();
    let (grant, effects) = restored.allocate(req("hive", "d", 1), 0, false).unwrap();
    assert_eq!(granted(&grant).fencing, 4);
    assert!(effects.changes.contains(&Change::Namespace {
        name: ns("hive"),
        quota: 10,
        next_fencing: 5 + FENCING_BLOCK,
        put: false
    }));
    // The same holds on the ledger that wrote the checkpoint.
    let (grant, effects) = ledger.allocate(req("hive", "e", 1), 0, false).unwrap();
    assert_eq!(granted(&grant).fencing, 4);
    assert!(effects.changes.iter().any(|c| matches!(c, Change::Namespace { .. })), "{effects:?}");
    ledger.check_invariants().unwrap();
}

#[test]
fn sessions_hold_grants_and_free_them_when_they_expire() {
    let mut ledger = ledger_with("hive", 2);
    let id = SessionId(7);
    ledger.open_session(id, 100, None, 0).unwrap();
    for token in ["a", "b"] {
        let mut r = req("hive", token, 1);
        r.lease = LeaseRequest::Session(id);
        granted(&ledger.allocate(r, 0, false).unwrap().0);
    }
    assert_eq!(ledger.session(id).unwrap().grants.len(), 2);
    // One keepalive renews every grant of the session.
    ledger.keepalive_session(id, 80).unwrap();
    assert!(ledger.expire(150).is_empty());
    let effects = ledger.expire(180);
    assert_eq!(effects.expired, 2);
    assert!(effects.changes.contains(&Change::SessionRemoved { id, expired: true }));
    let ended: Vec<GrantEnd> = effects
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::GrantRemoved { cause, .. } => Some(*cause),
            _ => None,
        })
        .collect();
    assert_eq!(ended, [GrantEnd::SessionExpired, GrantEnd::SessionExpired], "the grants ended with their session");
    assert_eq!(ledger.namespace(&ns("hive"), 180).unwrap().granted_units, 0);
    let mut r = req("hive", "c", 1);
    r.lease = LeaseRequest::Session(id);
    assert_eq!(ledger.allocate(r, 200, false), Err(LedgerError::SessionNotFound(id)));
    ledger.check_invariants().unwrap();
}

#[test]
fn closing_a_session_releases_its_grants_and_wakes_waiters() {
    let mut ledger = ledger_with("hive", 1);
    let id = SessionId(1);
    ledger.open_session(id, 1000, None, 0).unwrap();
    let mut r = req("hive", "a", 1);
    r.lease = LeaseRequest::Session(id);
    ledger.allocate(r, 0, false).unwrap();
    let waiter = queued(&ledger.allocate(req("hive", "b", 1), 1, true).unwrap().0);
    let (_, effects) = ledger.close_session(id, 2).unwrap();
    assert_eq!(effects.woken.len(), 1);
    assert_eq!(effects.woken[0].waiter, waiter);
    assert_eq!(ledger.namespace(&ns("hive"), 2).unwrap().stats.released, 1);
}

#[test]
fn waiters_are_served_first_come_first_served() {
    let mut ledger = ledger_with("hive", 1);
    ledger.allocate(req("hive", "holder", 1), 0, false).unwrap();
    let first = queued(&ledger.allocate(req("hive", "w1", 1), 1, true).unwrap().0);
    let (second, _) = ledger.allocate(req("hive", "w2", 1), 2, true).unwrap();
    assert!(matches!(second, Decision::Queued { place: QueuePlace { position: 2, units_ahead: 1 }, .. }));
    // A newcomer that does not wait does not jump the queue.
    let (late, _) = ledger.allocate(req("hive", "late", 1), 3, false).unwrap();
    assert_eq!(late, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    let (_, effects) = ledger.release(&ns("hive"), &Token::new("holder").unwrap(), None, 4).unwrap();
    assert_eq!(effects.woken.len(), 1);
    assert_eq!(effects.woken[0].waiter, first);
    assert_eq!(effects.woken[0].grant.token.as_str(), "w1");
    ledger.check_invariants().unwrap();
}

#[test]
fn a_large_request_is_not_starved_by_small_ones() {
    let mut ledger = ledger_with("gpu", 4);
    for token in ["s1", "s2", "s3"] {
        ledger.allocate(req("gpu", token, 1), 0, false).unwrap();
    }
    let big = queued(&ledger.allocate(req("gpu", "big", 4), 1, true).unwrap().0);
    // One unit is free, but the big request is ahead: small requests wait behind it.
    let (small, _) = ledger.allocate(req("gpu", "s4", 1), 2, false).unwrap();
    assert_eq!(small, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    let small = queued(&ledger.allocate(req("gpu", "s5", 1), 2, true).unwrap().0);
    for token in ["s1", "s2"] {
        let (_, effects) = ledger.release(&ns("gpu"), &Token::new(token).unwrap(), None, 3).unwrap();
        assert!(effects.woken.is_empty());
    }
    let (_, effects) = ledger.release(&ns("gpu"), &Token::new("s3").unwrap(), None, 4).unwrap();
    assert_eq!(effects.woken.iter().map(|w| w.waiter).collect::<Vec<_>>(), [big]);
    let (_, effects) = ledger.release(&ns("gpu"), &Token::new("big").unwrap(), None, 5).unwrap();
    assert_eq!(effects.woken.iter().map(|w| w.waiter).collect::<Vec<_>>(), [small]);
    ledger.check_invariants().unwrap();
}

#[test]
fn a_waiter_blocked_by_its_cap_does_not_hold_others_back() {
    let mut ledger = ledger_with("hive", 10);
    let caps = Constraints { project: Some(1), namespace: None };
    ledger.allocate(scoped("hive", "a1", "a", "dev", caps), 0, false).unwrap();
    let capped = queued(&ledger.allocate(scoped("hive", "a2", "a", "dev", caps), 1, true).unwrap().0);
    granted(&ledger.allocate(scoped("hive", "b1", "b", "dev", caps), 2, false).unwrap().0);
    let waiters = ledger.waiters(&ns("hive"), 3).unwrap();
    assert_eq!(waiters[0].blocked_by_cap, Some(CapLevel::Project));
    assert_eq!(waiters[0].waited_ms, 2);
    let (_, effects) = ledger.release(&ns("hive"), &Token::new("a1").unwrap(), None, 4).unwrap();
    assert_eq!(effects.woken[0].waiter, capped);
    ledger.check_invariants().unwrap();
}

#[test]
fn a_cancelled_waiter_learns_its_place_and_unblocks_the_queue() {
    let mut ledger = ledger_with("gpu", 2);
    ledger.allocate(req("gpu", "h", 1), 0, false).unwrap();
    // One unit is free and nobody waits: w1 is granted at once.
    granted(&ledger.allocate(req("gpu", "w1", 1), 0, true).unwrap().0);
    let big = queued(&ledger.allocate(req("gpu", "big", 2), 0, true).unwrap().0);
    let w3 = queued(&ledger.allocate(req("gpu", "w3", 1), 0, true).unwrap().0);
    let view = ledger.waiters(&ns("gpu"), 0).unwrap();
    assert_eq!(view.len(), 2, "{view:?}");
    let (refusal, place, effects) = ledger.cancel_waiter(&ns("gpu"), big, 10).unwrap();
    assert_eq!(refusal, Refusal::Exhausted);
    assert_eq!(place, QueuePlace { position: 1, units_ahead: 0 });
    assert!(effects.woken.is_empty(), "quota is full: w3 still waits");
    assert_eq!(ledger.cancel_waiter(&ns("gpu"), big, 10), None);
    let (_, effects) = ledger.release(&ns("gpu"), &Token::new("h").unwrap(), None, 11).unwrap();
    assert_eq!(effects.woken[0].waiter, w3);
    ledger.check_invariants().unwrap();
}

#[test]
fn a_retried_wait_keeps_its_place() {
    let mut ledger = ledger_with("hive", 1);
    ledger.allocate(req("hive", "h", 1), 0, false).unwrap();
    let w1 = queued(&ledger.allocate(req("hive", "w1", 1), 0, true).unwrap().0);
    queued(&ledger.allocate(req("hive", "w2", 1), 0, true).unwrap().0);
    let (again, _) = ledger.allocate(req("hive", "w1", 1), 5, true).unwrap();
    match again {
        Decision::Queued { place, replaced, .. } => {
            assert_eq!(place.position, 1);
            assert_eq!(replaced, Some(w1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn raising_a_quota_admits_waiters_and_lowering_revokes_nothing() {
    let mut ledger = ledger_with("hive", 2);
    ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    ledger.allocate(req("hive", "b", 1), 0, false).unwrap();
    let w = queued(&ledger.allocate(req("hive", "c", 1), 0, true).unwrap().0);
    let (created, effects) = ledger.put_namespace(&ns("hive"), 3, 1).unwrap();
    assert!(!created);
    assert_eq!(effects.woken[0].waiter, w);
    let (_, effects) = ledger.put_namespace(&ns("hive"), 1, 2).unwrap();
    assert!(effects.woken.is_empty());
    assert_eq!(ledger.namespace(&ns("hive"), 2).unwrap().granted_units, 3);
    ledger.release(&ns("hive"), &Token::new("a").unwrap(), None, 3).unwrap();
    let (d, _) = ledger.allocate(req("hive", "d", 1), 3, false).unwrap();
    assert_eq!(d, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    ledger.release(&ns("hive"), &Token::new("b").unwrap(), None, 3).unwrap();
    ledger.release(&ns("hive"), &Token::new("c").unwrap(), None, 3).unwrap();
    granted(&ledger.allocate(req("hive", "d", 1), 3, false).unwrap().0);
}

#[test]
fn removing_a_namespace_cancels_its_waiters() {
    let mut ledger = ledger_with("hive", 1);
    ledger.allocate(req("hive", "a", 1), 0, false).unwrap();
    let w = queued(&ledger.allocate(req("hive", "b", 1), 0, true).unwrap().0);
    let (grants, effects) = ledger.remove_namespace(&ns("hive"), true).unwrap();
    assert_eq!(grants, 1);
    assert_eq!(effects.cancelled, vec![(w, LedgerError::NamespaceNotFound(ns("hive")))]);
    assert!(matches!(ledger.allocate(req("hive", "c", 1), 0, false), Err(LedgerError::NamespaceNotFound(_))));
}

#[test]
fn restore_rebuilds_counters_leases_and_fencing() {
    let mut ledger = ledger_with("hive", 5);
    let id = SessionId(3);
    ledger.open_session(id, 100, None, 0).unwrap();
    let mut a = scoped("hive", "a", "p", "d", Constraints::default());
    a.lease = LeaseRequest::Session(id);
    let mut b = req("hive", "b", 2);
    b.lease = LeaseRequest::Ttl { ttl_ms: 50 };
    ledger.allocate(a, 0, false).unwrap();
    ledger.allocate(b, 0, false).unwrap();
    let grants = ledger.grants(&ns("hive")).unwrap();
    let restored =
        Ledger::restore(vec![(ns("hive"), 5, 3)], vec![], vec![(id, 100, 100, None)], grants.clone()).unwrap();
    restored.check_invariants().unwrap();
    assert_eq!(restored.grants(&ns("hive")).unwrap(), grants);
    assert_eq!(restored.namespace(&ns("hive"), 0).unwrap().granted_units, 3);
    assert_eq!(restored.next_deadline(), Some(50));
    assert!(matches!(Ledger::restore(vec![], vec![], vec![], grants.clone()), Err(RestoreError::OrphanGrant { .. })));
    assert!(matches!(
        Ledger::restore(vec![(ns("hive"), 5, 3)], vec![], vec![], grants),
        Err(RestoreError::MissingSession { .. })
    ));
}

#[test]
fn lowering_the_quota_below_a_waiter_keeps_it_waiting() {
    let mut ledger = ledger_with("gpu", 4);
    ledger.allocate(req("gpu", "held", 4), 0, false).unwrap();
    let big = queued(&ledger.allocate(req("gpu", "big", 3), 0, true).unwrap().0);
    let small = queued(&ledger.allocate(req("gpu", "small", 1), 0, true).unwrap().0);
    let (_, effects) = ledger.put_namespace(&ns("gpu"), 2, 1).unwrap();
    assert!(effects.cancelled.is_empty() && effects.woken.is_empty(), "{effects:?}");
    // The big waiter still heads the queue: a release admits no one behind it.
    let (_, effects) = ledger.release(&ns("gpu"), &Token::new("held").unwrap(), None, 2).unwrap();
    assert!(effects.woken.is_empty(), "{effects:?}");
    assert_eq!(ledger.waiters(&ns("gpu"), 2).unwrap().iter().map(|w| w.id).collect::<Vec<_>>(), [big, small]);
    // Raised again before their waits end, both are admitted, in order.
    let (_, effects) = ledger.put_namespace(&ns("gpu"), 4, 3).unwrap();
    assert_eq!(effects.woken.iter().map(|w| w.waiter).collect::<Vec<_>>(), [big, small]);
    ledger.check_invariants().unwrap();
}

#[test]
fn a_quota_of_zero_pauses_the_namespace() {
    let mut ledger = ledger_with("paused", 0);
    let (now, _) = ledger.allocate(req("paused", "a", 1), 0, false).unwrap();
    assert_eq!(now, Decision::Refused { refusal: Refusal::Exhausted, place: None });
    let waiter = queued(&ledger.allocate(req("paused", "a", 1), 0, true).unwrap().0);
    let (_, effects) = ledger.put_namespace(&ns("paused"), 1, 1).unwrap();
    assert_eq!(effects.woken.iter().map(|w| w.waiter).collect::<Vec<_>>(), [waiter]);
    ledger.check_invariants().unwrap();
}

#[test]
fn ending_a_session_cancels_the_requests_waiting_to_join_it() {
    let mut ledger = ledger_with("gpu", 2);
    let id = SessionId(9);
    ledger.open_session(id, 1000, None, 0).unwrap();
    ledger.allocate(req("gpu", "held", 2), 0, false).unwrap();
    let mut joining = req("gpu", "joining", 2);
    joining.lease = LeaseRequest::Session(id);
    let joining = queued(&ledger.allocate(joining, 0, true).unwrap().0);
    let other = queued(&ledger.allocate(req("gpu", "other", 1), 0, true).unwrap().0);
    let (_, effects) = ledger.close_session(id, 1).unwrap();
    assert_eq!(effects.cancelled, vec![(joining, LedgerError::SessionNotFound(id))]);
    let (_, effects) = ledger.release(&ns("gpu"), &Token::new("held").unwrap(), None, 2).unwrap();
    assert_eq!(effects.woken.iter().map(|w| w.waiter).collect::<Vec<_>>(), [other]);
    ledger.check_invariants().unwrap();
}

#[test]
fn a_rebuilt_ledger_never_reuses_a_waiter_id() {
    let mut ledger = ledger_with("gpu", 1);
    ledger.allocate(req("gpu", "held", 1), 0, false).unwrap();
    let old = queued(&ledger.allocate(req("gpu", "old", 1), 0, true).unwrap().0);
    let mut rebuilt =
        Ledger::restore(vec![(ns("gpu"), 1, 2)], vec![], vec![], ledger.grants(&ns("gpu")).unwrap()).unwrap();
    rebuilt.carry_over_from(&ledger);
    let new = queued(&rebuilt.allocate(req("gpu", "new", 1), 1, true).unwrap().0);
    assert_ne!(old, new);
    assert_eq!(rebuilt.cancel_waiter(&ns("gpu"), old, 2), None, "a stale id must not cancel the new waiter");
}

#[test]
fn huge_queues_saturate_instead_of_overflowing() {
    let mut ledger = ledger_with("gpu", MAX_UNITS);
    ledger.allocate(req("gpu", "held", MAX_UNITS), 0, false).unwrap();
    for n in 0..2100 {
        queued(&ledger.allocate(req("gpu", &format!("w{n}"), MAX_UNITS), 0, true).unwrap().0);
    }
    assert_eq!(ledger.namespace(&ns("gpu"), 0).unwrap().waiting_units, u64::MAX);
    assert_eq!(ledger.waiters(&ns("gpu"), 0).unwrap().last().unwrap().place.units_ahead, u64::MAX);
}

#[test]
fn lists_page_in_key_order() {
    let mut ledger = Ledger::new();
    for name in ["b", "a:x", "c", "a"] {
        ledger.put_namespace(&ns(name), 10, 0).unwrap();
    }
    let names = |views: Vec<NamespaceView>| views.into_iter().map(|v| v.name.to_string()).collect::<Vec<_>>();
    assert_eq!(names(ledger.namespaces_after(None, 2, 0)), ["a", "a:x"]);
    assert_eq!(names(ledger.namespaces_after(Some(&ns("a:x")), 2, 0)), ["b", "c"]);
    // A key that is not (or no longer) listed still says where the page starts.
    assert_eq!(names(ledger.namespaces_after(Some(&ns("bb")), 2, 0)), ["c"]);
    for token in ["t3", "t1", "t4", "t2", "t0"] {
        ledger.allocate(req("a", token, 1), 0, false).unwrap();
    }
    let tokens = |grants: Vec<Grant>| grants.into_iter().map(|g| g.token.to_string()).collect::<Vec<_>>();
    assert_eq!(tokens(ledger.grants_after(&ns("a"), None, 2).unwrap()), ["t0", "t1"]);
    assert_eq!(tokens(ledger.grants_after(&ns("a"), Some(&Token::new("t1").unwrap()), 2).unwrap()), ["t2", "t3"]);
    assert_eq!(tokens(ledger.grants_after(&ns("a"), Some(&Token::new("t3").unwrap()), 2).unwrap()), ["t4"]);
    assert!(ledger.grants_after(&ns("a"), Some(&Token::new("t4").unwrap()), 2).unwrap().is_empty());
}

#[test]
fn a_page_of_waiters_continues_by_arrival_as_the_queue_moves() {
    let mut ledger = ledger_with("gpu", 1);
    ledger.allocate(req("gpu", "holder", 1), 0, false).unwrap();
    for token in ["w1", "w2", "w3", "w4"] {
        queued(&ledger.allocate(req("gpu", token, 1), 1, true).unwrap().0);
    }
    let first = ledger.waiters_after(&ns("gpu"), None, 2, 2).unwrap();
    assert_eq!(first.iter().map(|w| w.token.as_str()).collect::<Vec<_>>(), ["w1", "w2"]);
    let cursor = first[1].arrival;
    // A retry of w2 takes its waiter over: a new id, the same place and arrival number.
    let taken_over = queued(&ledger.allocate(req("gpu", "w2", 1), 3, true).unwrap().0);
    assert_ne!(taken_over, first[1].id);
    // The head is granted: the queue moves, and the next page still starts after w2.
    ledger.release(&ns("gpu"), &Token::new("holder").unwrap(), None, 4).unwrap();
    let next = ledger.waiters_after(&ns("gpu"), Some(cursor), 2, 5).unwrap();
    assert_eq!(next.iter().map(|w| w.token.as_str()).collect::<Vec<_>>(), ["w3", "w4"]);
    assert_eq!(next[0].place, QueuePlace { position: 2, units_ahead: 1 }, "places are as of this read");
    let again = ledger.waiters_after(&ns("gpu"), None, 10, 5).unwrap();
    assert_eq!(again[0].arrival, cursor, "w2 kept its arrival number");
    assert_eq!(again[0].id, taken_over);
    ledger.check_invariants().unwrap();
}
