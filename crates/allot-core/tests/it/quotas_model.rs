//! Model-based property tests: random operation sequences run against `Ledger` and against a
//! deliberately naive reference model (plain vectors, linear scans), compared after every step.

use std::collections::HashMap;

use allot_core::*;
use proptest::prelude::*;
use proptest::test_runner::Config;

const NAMESPACES: [&str; 3] = ["hive", "gpu", "hive:a"];
const TOKENS: [&str; 5] = ["t0", "t1", "t2", "t3", "t4"];
/// Scopes that share prefixes: caps must match them exactly, component by component.
const SCOPES: [(&str, &str); 4] = [("proj", "dev"), ("proj2", "dev"), ("proj", "development"), ("proj", "dev2")];

fn ns(i: usize) -> NamespaceName {
    NamespaceName::new(NAMESPACES[i]).unwrap()
}

fn token(i: usize) -> Token {
    Token::new(TOKENS[i]).unwrap()
}

fn scope(i: usize) -> Scope {
    let (project, domain) = SCOPES[i];
    Scope::new(project, domain).unwrap()
}

/// A fencing number to pass: the grant's current one, or an arbitrary (often stale) one.
#[derive(Debug, Clone, Copy)]
enum Fencing {
    Current,
    Value(u64),
}

/// The token a release or keepalive names.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// `TOKENS[i]`, granted or not.
    Token(usize),
    /// The `n`-th (modulo their number) granted token of the namespace, if any; else `TOKENS[0]`.
    Held(usize),
}

#[derive(Debug, Clone)]
enum Op {
    PutNamespace {
        ns: usize,
        quota: u64,
    },
    RemoveNamespace {
        ns: usize,
        force: bool,
    },
    Allocate {
        ns: usize,
        token: usize,
        units: u64,
        scope: Option<usize>,
        caps: Constraints,
        ttl: Option<u64>,
    },
    /// Allocates a token again with the units and scope it holds (if it holds any; else one unit,
    /// no scope), with caps that may differ (an idempotent retry) and a lease that may differ (a
    /// token conflict).
    Retry {
        ns: usize,
        token: usize,
        caps: Constraints,
        ttl: Option<u64>,
    },
    Release {
        ns: usize,
        token: Target,
        fencing: Option<Fencing>,
    },
    Keepalive {
        ns: usize,
        token: Target,
        fencing: Option<Fencing>,
    },
    Advance {
        ms: u64,
    },
}

fn fencing_strategy() -> impl Strategy<Value = Option<Fencing>> {
    prop_oneof![
        2 => Just(None),
        2 => Just(Some(Fencing::Current)),
        1 => (0u64..8).prop_map(|n| Some(Fencing::Value(n))),
    ]
}

/// A scope and caps; caps only come with a scope.
fn scope_strategy() -> impl Strategy<Value = (Option<usize>, Constraints)> {
    prop_oneof![
        1 => Just((None, Constraints::default())),
        3 => (0..SCOPES.len(), proptest::option::of(0u64..4), proptest::option::of(0u64..4))
            .prop_map(|(s, project, namespace)| (Some(s), Constraints { project, namespace })),
    ]
}

fn target_strategy() -> impl Strategy<Value = Target> {
    prop_oneof![(0..TOKENS.len()).prop_map(Target::Token), (0usize..8).prop_map(Target::Held)]
}

fn op_strategy(namespaces: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..namespaces, 0u64..6).prop_map(|(ns, quota)| Op::PutNamespace { ns, quota }),
        1 => (0..namespaces, any::<bool>()).prop_map(|(ns, force)| Op::RemoveNamespace { ns, force }),
        8 => (0..namespaces, 0..TOKENS.len(), 1u64..4, scope_strategy(), proptest::option::of(1u64..50))
            .prop_map(|(ns, token, units, (scope, caps), ttl)| Op::Allocate { ns, token, units, scope, caps, ttl }),
        2 => (0..namespaces, 0..TOKENS.len(), proptest::option::of(0u64..4), proptest::option::of(1u64..50))
            .prop_map(|(ns, token, cap, ttl)| Op::Retry { ns, token, caps: Constraints { project: cap, namespace: None }, ttl }),
        4 => (0..namespaces, target_strategy(), fencing_strategy())
            .prop_map(|(ns, token, fencing)| Op::Release { ns, token, fencing }),
        2 => (0..namespaces, target_strategy(), fencing_strategy())
            .prop_map(|(ns, token, fencing)| Op::Keepalive { ns, token, fencing }),
        3 => (0u64..30).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn request(
    op_ns: usize,
    op_token: usize,
    units: u64,
    op_scope: Option<usize>,
    caps: Constraints,
    ttl: Option<u64>,
) -> AllocateRequest {
    AllocateRequest {
        namespace: ns(op_ns),
        token: token(op_token),
        units,
        scope: op_scope.map(scope),
        constraints: caps,
        lease: match ttl {
            Some(ttl_ms) => LeaseRequest::Ttl { ttl_ms },
            None => LeaseRequest::None,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The reference model.

#[derive(Debug, Default)]
struct ModelNamespace {
    quota: u64,
    next_fencing: u64,
    /// Fencing numbers are reserved in blocks of FENCING_BLOCK (a removed namespace records its
    /// exact next number, so a re-created one goes on from there).
    fencing_bound: u64,
    grants: Vec<Grant>,
    stats: NamespaceStats,
}

impl ModelNamespace {
    fn granted(&self) -> u64 {
        self.grants.iter().map(|g| g.units).sum()
    }

    fn project_units(&self, project: &str) -> u64 {
        self.grants.iter().filter(|g| g.scope.as_ref().is_some_and(|s| &*s.project == project)).map(|g| g.units).sum()
    }

    fn scope_units(&self, scope: &Scope) -> u64 {
        self.grants.iter().filter(|g| g.scope.as_ref() == Some(scope)).map(|g| g.units).sum()
    }

    fn find(&self, token: &Token) -> Option<usize> {
        self.grants.iter().position(|g| &g.token == token)
    }
}

#[derive(Debug, Default)]
struct Model {
    now: Millis,
    namespaces: HashMap<NamespaceName, ModelNamespace>,
    retired_fencing: HashMap<NamespaceName, u64>,
}

fn check_fencing(grant: &Grant, fencing: Option<u64>) -> Result<(), LedgerError> {
    match fencing {
        Some(given) if given != grant.fencing => Err(LedgerError::StaleFencing { given, current: grant.fencing }),
        _ => Ok(()),
    }
}

impl Model {
    fn put_namespace(&mut self, name: &NamespaceName, quota: u64) -> bool {
        let created = !self.namespaces.contains_key(name);
        if created {
            let next_fencing = self.retired_fencing.remove(name).unwrap_or(1);
            let fresh = ModelNamespace { next_fencing, fencing_bound: next_fencing, ..ModelNamespace::default() };
            self.namespaces.insert(name.clone(), fresh);
        }
        self.namespaces.get_mut(name).unwrap().quota = quota;
        created
    }

    fn remove_namespace(&mut self, name: &NamespaceName, force: bool) -> Result<usize, LedgerError> {
        let Some(state) = self.namespaces.get(name) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        if !state.grants.is_empty() && !force {
            return Err(LedgerError::NamespaceInUse { namespace: name.clone(), grants: state.grants.len() });
        }
        let state = self.namespaces.remove(name).unwrap();
        self.retired_fencing.insert(name.clone(), state.next_fencing);
        Ok(state.grants.len())
    }

    fn allocate(&mut self, request: AllocateRequest) -> Result<Decision, LedgerError> {
        let now = self.now;
        let Some(state) = self.namespaces.get_mut(&request.namespace) else {
            return Err(LedgerError::NamespaceNotFound(request.namespace));
        };
        if let Some(i) = state.find(&request.token) {
            let grant = &state.grants[i];
            let held_lease = match grant.lease {
                Lease::None => LeaseRequest::None,
                Lease::Ttl { ttl_ms, .. } => LeaseRequest::Ttl { ttl_ms },
                Lease::Session(_) => unreachable!("the model has no sessions"),
            };
            let words = |lease: LeaseRequest| match lease {
                LeaseRequest::Ttl { ttl_ms } => format!("ttl_ms {ttl_ms}"),
                _ => "no lease".to_owned(),
            };
            let scope_words = |scope: &Option<Scope>| match scope {
                Some(scope) => format!("{}/{}", scope.project, scope.namespace),
                None => "none".to_owned(),
            };
            // A retry must match what was granted: units, scope and lease (not the caps).
            let conflict = if grant.units != request.units {
                Some(("units", grant.units.to_string(), request.units.to_string()))
            } else if grant.scope != request.scope {
                Some(("scope", scope_words(&grant.scope), scope_words(&request.scope)))
            } else if held_lease != request.lease {
                Some(("ttl_ms", words(held_lease), words(request.lease)))
            } else {
                None
            };
            if let Some((field, held, asked)) = conflict {
                return Err(LedgerError::TokenConflict { token: request.token, waiting: false, field, held, asked });
            }
            return Ok(Decision::Granted { grant: grant.clone(), existing: true });
        }
        if let Some(scope) = &request.scope {
            let caps = [
                (CapLevel::Project, request.constraints.project, state.project_units(&scope.project)),
                (CapLevel::Namespace, request.constraints.namespace, state.scope_units(scope)),
            ];
            for (level, cap, held) in caps {
                if let Some(cap) = cap {
                    if held + request.units > cap {
                        state.stats.cap_exceeded += 1;
                        let refusal = Refusal::CapExceeded { level, cap, held };
                        return Ok(Decision::Refused { refusal, place: None });
                    }
                }
            }
        }
        if state.granted() + request.units > state.quota {
            state.stats.exhausted += 1;
            return Ok(Decision::Refused { refusal: Refusal::Exhausted, place: None });
        }
        let grant = Grant {
            namespace: request.namespace,
            token: request.token,
            units: request.units,
            scope: request.scope,
            fencing: state.next_fencing,
            lease: match request.lease {
                LeaseRequest::Ttl { ttl_ms } => Lease::Ttl { ttl_ms, deadline: now + ttl_ms },
                LeaseRequest::None => Lease::None,
                LeaseRequest::Session(_) => unreachable!("the model has no sessions"),
            },
            granted_at: now,
        };
        state.next_fencing += 1;
        if state.next_fencing > state.fencing_bound {
            state.fencing_bound = state.next_fencing + FENCING_BLOCK;
        }
        state.stats.granted += 1;
        state.grants.push(grant.clone());
        Ok(Decision::Granted { grant, existing: false })
    }

    fn release(
        &mut self,
        name: &NamespaceName,
        token: &Token,
        fencing: Option<u64>,
    ) -> Result<Option<Grant>, LedgerError> {
        let Some(state) = self.namespaces.get_mut(name) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        let Some(i) = state.find(token) else { return Ok(None) };
        check_fencing(&state.grants[i], fencing)?;
        state.stats.released += 1;
        Ok(Some(state.grants.remove(i)))
    }

    fn keepalive(&mut self, name: &NamespaceName, token: &Token, fencing: Option<u64>) -> Result<Grant, LedgerError> {
        let now = self.now;
        let Some(state) = self.namespaces.get_mut(name) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        let Some(i) = state.find(token) else {
            return Err(LedgerError::GrantNotFound { namespace: name.clone(), token: token.clone() });
        };
        let grant = &mut state.grants[i];
        check_fencing(grant, fencing)?;
        if let Lease::Ttl { ttl_ms, .. } = grant.lease {
            grant.lease = Lease::Ttl { ttl_ms, deadline: now + ttl_ms };
        }
        Ok(grant.clone())
    }

    fn expire(&mut self) -> u64 {
        let now = self.now;
        let mut expired = 0;
        for state in self.namespaces.values_mut() {
            let before = state.grants.len();
            state.grants.retain(|g| !matches!(g.lease, Lease::Ttl { deadline, .. } if deadline <= now));
            let n = (before - state.grants.len()) as u64;
            state.stats.expired += n;
            expired += n;
        }
        expired
    }

    fn next_deadline(&self) -> Option<Millis> {
        self.namespaces
            .values()
            .flat_map(|s| s.grants.iter())
            .filter_map(|g| match g.lease {
                Lease::Ttl { deadline, .. } => Some(deadline),
                _ => None,
            })
            .min()
    }

    fn current_fencing(&self, name: &NamespaceName, token: &Token) -> Option<u64> {
        let state = self.namespaces.get(name)?;
        state.find(token).map(|i| state.grants[i].fencing)
    }

    fn target(&self, name: &NamespaceName, target: Target) -> Token {
        match target {
            Target::Token(i) => token(i),
            Target::Held(n) => {
                let mut held: Vec<&Token> =
                    self.namespaces.get(name).map(|s| s.grants.iter().map(|g| &g.token).collect()).unwrap_or_default();
                held.sort();
                if held.is_empty() {
                    token(0)
                } else {
                    held[n % held.len()].clone()
                }
            }
        }
    }

    fn resolve(&self, name: &NamespaceName, token: &Token, fencing: Option<Fencing>) -> Option<u64> {
        match fencing? {
            Fencing::Current => Some(self.current_fencing(name, token).unwrap_or(1)),
            Fencing::Value(n) => Some(n),
        }
    }
}

/// An operation that answers directly must not wake or cancel anyone (there are no waiters).
fn assert_quiet(effects: &Effects) -> Result<(), TestCaseError> {
    prop_assert!(effects.woken.is_empty(), "unexpected woken waiters: {:?}", effects.woken);
    prop_assert!(effects.cancelled.is_empty(), "unexpected cancelled waiters: {:?}", effects.cancelled);
    Ok(())
}

fn step(ledger: &mut Ledger, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    let now = model.now;
    match *op {
        Op::PutNamespace { ns: n, quota } => {
            let (created, effects) = ledger.put_namespace(&ns(n), quota, now).unwrap();
            assert_quiet(&effects)?;
            prop_assert_eq!(created, model.put_namespace(&ns(n), quota));
        }
        Op::RemoveNamespace { ns: n, force } => {
            let got = ledger.remove_namespace(&ns(n), force);
            if let Ok((_, effects)) = &got {
                assert_quiet(effects)?;
            }
            prop_assert_eq!(got.map(|(grants, _)| grants), model.remove_namespace(&ns(n), force));
        }
        Op::Allocate { ns: n, token: t, units, scope, caps, ttl } => {
            let req = request(n, t, units, scope, caps, ttl);
            let got = ledger.allocate(req.clone(), now, false);
            if let Ok((_, effects)) = &got {
                assert_quiet(effects)?;
            }
            prop_assert_eq!(got.map(|(decision, _)| decision), model.allocate(req));
        }
        Op::Retry { ns: n, token: t, caps, ttl } => {
            let held = model.namespaces.get(&ns(n)).and_then(|s| s.find(&token(t)).map(|i| s.grants[i].clone()));
            let mut req = request(n, t, 1, None, Constraints::default(), ttl);
            if let Some(grant) = held {
                req.units = grant.units;
                req.scope = grant.scope;
                if req.scope.is_some() {
                    req.constraints = caps;
                }
            }
            let got = ledger.allocate(req.clone(), now, false);
            if let Ok((_, effects)) = &got {
                assert_quiet(effects)?;
            }
            prop_assert_eq!(got.map(|(decision, _)| decision), model.allocate(req));
        }
        Op::Release { ns: n, token: t, fencing } => {
            let t = model.target(&ns(n), t);
            let fencing = model.resolve(&ns(n), &t, fencing);
            let got = ledger.release(&ns(n), &t, fencing, now);
            if let Ok((_, effects)) = &got {
                assert_quiet(effects)?;
            }
            prop_assert_eq!(got.map(|(grant, _)| grant), model.release(&ns(n), &t, fencing));
        }
        Op::Keepalive { ns: n, token: t, fencing } => {
            let t = model.target(&ns(n), t);
            let fencing = model.resolve(&ns(n), &t, fencing);
            let got = ledger.keepalive_grant(&ns(n), &t, fencing, now);
            if let Ok((_, effects)) = &got {
                assert_quiet(effects)?;
            }
            prop_assert_eq!(got.map(|(grant, _)| grant), model.keepalive(&ns(n), &t, fencing));
        }
        Op::Advance { ms } => {
            model.now += ms;
            let effects = ledger.expire(model.now);
            assert_quiet(&effects)?;
            prop_assert_eq!(effects.expired, model.expire());
        }
    }
    Ok(())
}

fn compare(ledger: &Ledger, model: &Model) -> Result<(), TestCaseError> {
    let now = model.now;
    if let Err(e) = ledger.check_invariants() {
        return Err(TestCaseError::fail(format!("invariant broken: {e}")));
    }
    for i in 0..NAMESPACES.len() {
        let name = ns(i);
        let Some(state) = model.namespaces.get(&name) else {
            prop_assert_eq!(ledger.namespace(&name, now), Err(LedgerError::NamespaceNotFound(name.clone())));
            prop_assert_eq!(ledger.grants(&name), Err(LedgerError::NamespaceNotFound(name.clone())));
            continue;
        };
        let expected = NamespaceView {
            name: name.clone(),
            quota: state.quota,
            granted_units: state.granted(),
            grants: state.grants.len(),
            waiters: 0,
            waiting_units: 0,
            longest_wait_ms: 0,
            next_fencing: state.next_fencing,
            stats: state.stats,
        };
        prop_assert_eq!(ledger.namespace(&name, now).unwrap(), expected);
        let mut grants = state.grants.clone();
        grants.sort_by(|a, b| a.token.cmp(&b.token));
        prop_assert_eq!(ledger.grants(&name).unwrap(), grants);
    }
    let mut names: Vec<NamespaceName> = model.namespaces.keys().cloned().collect();
    names.sort();
    prop_assert_eq!(ledger.namespaces(now).into_iter().map(|v| v.name).collect::<Vec<_>>(), names);
    prop_assert_eq!(ledger.next_deadline(), model.next_deadline());
    Ok(())
}

/// `cases` unless `PROPTEST_CASES` says otherwise (for longer runs).
fn config(cases: u32) -> Config {
    let cases = super::cases(cases);
    // No regression files: the failing sequence is printed instead.
    Config { cases, failure_persistence: None, ..Config::default() }
}

proptest! {
    #![proptest_config(config(256))]

    /// Without waiters, every answer and every observable piece of state matches the model.
    #[test]
    fn ledger_matches_the_model(
        initial in proptest::collection::vec(proptest::option::weighted(0.9, 0u64..6), NAMESPACES.len()),
        ops in proptest::collection::vec(op_strategy(NAMESPACES.len()), 1..=60),
    ) {
        let mut ledger = Ledger::new();
        let mut model = Model::default();
        // Most cases start with some namespaces, so that most operations reach the quota logic.
        let initial = initial.iter().enumerate().filter_map(|(ns, quota)| Some(Op::PutNamespace { ns, quota: (*quota)? }));
        let ops: Vec<Op> = initial.chain(ops).collect();
        for (i, op) in ops.iter().enumerate() {
            step(&mut ledger, &mut model, op).map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
            compare(&ledger, &model).map_err(|e| TestCaseError::fail(format!("after step {i} {op:?}: {e}")))?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// With waiters: no full model, but the invariants and the quota must hold after every step, and
// every waiter must be answered exactly once.

#[derive(Debug, Clone)]
enum WaitOp {
    PutNamespace {
        ns: usize,
        quota: u64,
    },
    RemoveNamespace {
        ns: usize,
    },
    Allocate {
        ns: usize,
        token: usize,
        units: u64,
        scope: Option<usize>,
        caps: Constraints,
        ttl: Option<u64>,
        wait: bool,
    },
    Release {
        ns: usize,
        token: Target,
    },
    /// Cancels the `n`-th live waiter (modulo their number), if any.
    Cancel {
        n: usize,
    },
    Advance {
        ms: u64,
    },
}

fn wait_op_strategy() -> impl Strategy<Value = WaitOp> {
    const NS: usize = 2;
    prop_oneof![
        2 => (0..NS, 0u64..6).prop_map(|(ns, quota)| WaitOp::PutNamespace { ns, quota }),
        1 => (0..NS).prop_map(|ns| WaitOp::RemoveNamespace { ns }),
        8 => (0..NS, 0..TOKENS.len(), 1u64..4, scope_strategy(), proptest::option::of(1u64..50), prop::bool::weighted(0.7))
            .prop_map(|(ns, token, units, (scope, caps), ttl, wait)| WaitOp::Allocate { ns, token, units, scope, caps, ttl, wait }),
        4 => (0..NS, target_strategy()).prop_map(|(ns, token)| WaitOp::Release { ns, token }),
        2 => any::<usize>().prop_map(|n| WaitOp::Cancel { n }),
        3 => (0u64..30).prop_map(|ms| WaitOp::Advance { ms }),
    ]
}

/// The waiters the test believes are still waiting, with their requests.
type Live = HashMap<WaiterId, AllocateRequest>;

fn account(ledger: &Ledger, live: &mut Live, effects: &Effects) -> Result<(), TestCaseError> {
    for woken in &effects.woken {
        let Some(request) = live.remove(&woken.waiter) else {
            return Err(TestCaseError::fail(format!("woke {:?}, which was not waiting", woken.waiter)));
        };
        prop_assert_eq!(&woken.grant.namespace, &request.namespace);
        prop_assert_eq!(&woken.grant.token, &request.token);
        prop_assert_eq!(woken.grant.units, request.units);
        prop_assert_eq!(&woken.grant.scope, &request.scope);
        // Nothing in one step ends a grant made in that step (leases last at least 1 ms).
        prop_assert_eq!(ledger.grant(&request.namespace, &request.token), Ok(woken.grant.clone()));
    }
    for (id, _) in &effects.cancelled {
        prop_assert!(live.remove(id).is_some(), "cancelled {:?}, which was not waiting", id);
    }
    Ok(())
}

fn wait_step(ledger: &mut Ledger, live: &mut Live, now: &mut Millis, op: &WaitOp) -> Result<(), TestCaseError> {
    match *op {
        WaitOp::PutNamespace { ns: n, quota } => {
            let (_, effects) = ledger.put_namespace(&ns(n), quota, *now).unwrap();
            account(ledger, live, &effects)?;
        }
        WaitOp::RemoveNamespace { ns: n } => {
            if let Ok((_, effects)) = ledger.remove_namespace(&ns(n), true) {
                account(ledger, live, &effects)?;
                prop_assert!(live.values().all(|r| r.namespace != ns(n)), "waiters of a removed namespace");
            }
        }
        WaitOp::Allocate { ns: n, token: t, units, scope, caps, ttl, wait } => {
            let mut req = request(n, t, units, scope, caps, ttl);
            // Half the time, retry a waiting token with the request it waits with (it keeps its
            // place); otherwise the retry may differ and must be refused as a conflict.
            if wait && t % 2 == 0 {
                if let Some(waiting) = live.values().find(|r| r.namespace == req.namespace && r.token == req.token) {
                    req = waiting.clone();
                }
            }
            if let Ok((decision, effects)) = ledger.allocate(req.clone(), *now, wait) {
                account(ledger, live, &effects)?;
                if let Decision::Queued { waiter, replaced, .. } = decision {
                    prop_assert!(wait);
                    if let Some(old) = replaced {
                        prop_assert!(live.remove(&old).is_some(), "replaced {:?}, which was not waiting", old);
                    }
                    live.insert(waiter, req);
                }
            }
        }
        WaitOp::Release { ns: n, token: t } => {
            let t = match t {
                Target::Token(i) => token(i),
                Target::Held(k) => {
                    let held = ledger.grants(&ns(n)).unwrap_or_default();
                    held.get(k % held.len().max(1)).map_or_else(|| token(0), |g| g.token.clone())
                }
            };
            if let Ok((_, effects)) = ledger.release(&ns(n), &t, None, *now) {
                account(ledger, live, &effects)?;
            }
        }
        WaitOp::Cancel { n } => {
            let mut ids: Vec<WaiterId> = live.keys().copied().collect();
            ids.sort();
            if !ids.is_empty() {
                let id = ids[n % ids.len()];
                let namespace = live[&id].namespace.clone();
                let Some((_, _, effects)) = ledger.cancel_waiter(&namespace, id, *now) else {
                    return Err(TestCaseError::fail(format!("{id:?} should still be waiting")));
                };
                live.remove(&id);
                account(ledger, live, &effects)?;
                prop_assert!(ledger.cancel_waiter(&namespace, id, *now).is_none());
            }
        }
        WaitOp::Advance { ms } => {
            *now += ms;
            let effects = ledger.expire(*now);
            account(ledger, live, &effects)?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    /// With waiting requests: invariants hold, no new grant overfills a quota, and every waiter
    /// the ledger reports is one the test saw queued and not yet answered.
    #[test]
    fn waiters_keep_the_invariants(
        initial in proptest::collection::vec(1u64..6, 2),
        ops in proptest::collection::vec(wait_op_strategy(), 1..=60),
    ) {
        let mut ledger = Ledger::new();
        let mut live = Live::new();
        let mut now: Millis = 0;
        let initial = initial.iter().enumerate().map(|(ns, &quota)| WaitOp::PutNamespace { ns, quota });
        let ops: Vec<WaitOp> = initial.chain(ops).collect();
        for (i, op) in ops.iter().enumerate() {
            let before: HashMap<NamespaceName, u64> =
                ledger.namespaces(now).into_iter().map(|v| (v.name, v.granted_units)).collect();
            wait_step(&mut ledger, &mut live, &mut now, op)
                .map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
            if let Err(e) = ledger.check_invariants() {
                return Err(TestCaseError::fail(format!("after step {i} {op:?}: invariant broken: {e}")));
            }
            for view in ledger.namespaces(now) {
                // Lowering a quota revokes nothing, so `granted` may sit above it, but never grows there.
                let limit = view.quota.max(before.get(&view.name).copied().unwrap_or(0));
                prop_assert!(
                    view.granted_units <= limit,
                    "after step {} {:?}: {} granted units in {} (quota {}, before {:?})",
                    i, op, view.granted_units, view.name, view.quota, before.get(&view.name)
                );
                let mut waiting: Vec<(WaiterId, Token)> =
                    live.iter().filter(|(_, r)| r.namespace == view.name).map(|(id, r)| (*id, r.token.clone())).collect();
                waiting.sort();
                let mut queue: Vec<(WaiterId, Token)> =
                    ledger.waiters(&view.name, now).unwrap().into_iter().map(|w| (w.id, w.token)).collect();
                queue.sort();
                prop_assert_eq!(queue, waiting, "after step {} {:?}: waiters of {}", i, op, view.name);
            }
        }
    }
}

// A waiting token retried with a different request (fewer units, another scope or caps) is a
// `TokenConflict`, as it is for a granted token, and the waiter is left unchanged: swapping it into
// the queue without checking it again would leave the queue inconsistent.

fn plain(namespace: usize, t: usize, units: u64) -> AllocateRequest {
    request(namespace, t, units, None, Constraints::default(), None)
}

#[test]
fn a_retried_wait_with_another_request_is_a_conflict() {
    let mut ledger = Ledger::new();
    ledger.put_namespace(&ns(0), 2, 0).unwrap();
    assert!(matches!(ledger.allocate(plain(0, 0, 1), 0, false).unwrap().0, Decision::Granted { .. }));
    assert!(matches!(ledger.allocate(plain(0, 1, 2), 0, true).unwrap().0, Decision::Queued { .. }));
    let retried = ledger.allocate(plain(0, 1, 1), 1, true);
    assert!(matches!(retried, Err(LedgerError::TokenConflict { .. })), "{retried:?}");
    // The same request again keeps its place.
    let (decision, _) = ledger.allocate(plain(0, 1, 2), 1, true).unwrap();
    assert!(matches!(decision, Decision::Queued { replaced: Some(_), .. }), "{decision:?}");
    ledger.check_invariants().unwrap();
}

#[test]
fn a_retried_wait_under_other_caps_is_a_conflict() {
    let mut ledger = Ledger::new();
    ledger.put_namespace(&ns(0), 3, 0).unwrap();
    let held = request(0, 0, 2, Some(0), Constraints::default(), None);
    assert!(matches!(ledger.allocate(held, 0, false).unwrap().0, Decision::Granted { .. }));
    assert!(matches!(ledger.allocate(plain(0, 1, 2), 0, true).unwrap().0, Decision::Queued { .. }));
    let caps = Constraints { project: None, namespace: Some(2) };
    let retried = ledger.allocate(request(0, 1, 1, Some(0), caps, None), 1, true);
    assert!(matches!(retried, Err(LedgerError::TokenConflict { .. })), "{retried:?}");
    ledger.check_invariants().unwrap();
    // The 2-unit waiter still blocks the quota: a newcomer does not jump ahead of it.
    let (late, _) = ledger.allocate(plain(0, 2, 1), 2, false).unwrap();
    assert!(matches!(late, Decision::Refused { .. }), "{late:?}");
}
