//! Property-based test of the rule (feature `pg_test` only): random sequences of fenced
//! operations from several simulated lock holders, run against PostgreSQL and against a small
//! model of the rule; both must agree on every outcome and on the final marks.
//!
//! Holders get tokens from one increasing counter (the lock service); any holder may re-acquire
//! (a newer token) at any time, so older holders become zombies. Operations: plain INSERT, UPDATE,
//! DELETE on a resource-mode table, `fencing_advance`, and plain and `fenced_*` writes on a per-row
//! table. Each runs in a subtransaction of the test's transaction (an EXCEPTION block), so a
//! refused write leaves nothing, as a refused transaction would.
#![forbid(unsafe_code)]

use pgrx::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Acquire,
    ResInsert,
    ResUpdate,
    ResDelete,
    Advance,
    RowInsert,
    RowUpdate,
    RowDelete,
    FencedInsert,
    FencedUpdate,
    FencedDelete,
}

const KINDS: [Kind; 11] = [
    Kind::Acquire,
    Kind::ResInsert,
    Kind::ResUpdate,
    Kind::ResDelete,
    Kind::Advance,
    Kind::RowInsert,
    Kind::RowUpdate,
    Kind::RowDelete,
    Kind::FencedInsert,
    Kind::FencedUpdate,
    Kind::FencedDelete,
];
const HOLDERS: usize = 3;

#[derive(Debug, Clone)]
struct Op {
    holder: usize,
    kind: Kind,
    key: i32,
}

fn op() -> impl Strategy<Value = Op> {
    (0..HOLDERS, 0..KINDS.len(), 1..4i32).prop_map(|(holder, k, key)| Op {
        holder,
        kind: KINDS[k],
        key,
    })
}

/// The rule, written the simple way: one mark per resource, one token per row, one tombstone per
/// deleted key; a write is accepted iff its token is at least every mark it touches.
#[derive(Default)]
struct Model {
    next: i64,
    tokens: [i64; HOLDERS],
    res_mark: Option<i64>,
    res_rows: HashSet<i32>,
    rows: HashMap<i32, i64>,
    tombs: HashMap<i32, i64>,
}

impl Model {
    fn new() -> Self {
        Model {
            next: HOLDERS as i64 + 1,
            tokens: [1, 2, 3],
            ..Default::default()
        }
    }

    /// The expected outcome ("ok" or a SQLSTATE), applying the write if accepted.
    fn apply(&mut self, op: &Op) -> &'static str {
        let t = self.tokens[op.holder];
        let stale_res = self.res_mark.is_some_and(|m| t < m);
        let k = op.key;
        match op.kind {
            Kind::Acquire => {
                self.tokens[op.holder] = self.next;
                self.next += 1;
                "ok"
            }
            Kind::Advance | Kind::ResUpdate | Kind::ResDelete if stale_res => "FT001",
            Kind::Advance => {
                self.res_mark = Some(t);
                "ok"
            }
            Kind::ResUpdate | Kind::ResDelete => {
                if self.res_rows.contains(&k) {
                    self.res_mark = Some(self.res_mark.map_or(t, |m| m.max(t)));
                    if op.kind == Kind::ResDelete {
                        self.res_rows.remove(&k);
                    }
                }
                "ok"
            }
            Kind::ResInsert if stale_res => "FT001",
            Kind::ResInsert if self.res_rows.contains(&k) => "23505",
            Kind::ResInsert => {
                self.res_rows.insert(k);
                self.res_mark = Some(self.res_mark.map_or(t, |m| m.max(t)));
                "ok"
            }
            Kind::RowInsert | Kind::FencedInsert if self.rows.contains_key(&k) => "23505",
            Kind::RowInsert | Kind::FencedInsert => {
                if self.tombs.get(&k).is_some_and(|m| t < *m) {
                    "FT001"
                } else {
                    self.rows.insert(k, t);
                    "ok"
                }
            }
            Kind::RowUpdate | Kind::RowDelete | Kind::FencedUpdate | Kind::FencedDelete => {
                let Some(row) = self.rows.get(&k).copied() else {
                    let fenced = matches!(op.kind, Kind::FencedUpdate | Kind::FencedDelete);
                    return if fenced { "P0002" } else { "ok" };
                };
                if t < row {
                    return "FT001";
                }
                if matches!(op.kind, Kind::RowDelete | Kind::FencedDelete) {
                    self.rows.remove(&k);
                    let m = self.tombs.entry(k).or_insert(t);
                    *m = (*m).max(t);
                } else {
                    self.rows.insert(k, t);
                }
                "ok"
            }
        }
    }
}

fn statement(op: &Op, n: u32, t: i64) -> Option<String> {
    let (res, row, k) = (format!("pt_res_{n}"), format!("pt_row_{n}"), op.key);
    Some(match op.kind {
        Kind::Acquire => return None,
        Kind::ResInsert => format!("INSERT INTO {res} VALUES ({k}, 0)"),
        Kind::ResUpdate => format!("UPDATE {res} SET v = v + 1 WHERE id = {k}"),
        Kind::ResDelete => format!("DELETE FROM {res} WHERE id = {k}"),
        Kind::Advance => format!("SELECT fencing_advance('pt-{n}', {t})"),
        Kind::RowInsert => format!("INSERT INTO {row} VALUES ({k}, 0)"),
        Kind::RowUpdate => format!("UPDATE {row} SET v = v + 1 WHERE id = {k}"),
        Kind::RowDelete => format!("DELETE FROM {row} WHERE id = {k}"),
        Kind::FencedInsert => {
            format!("SELECT fenced_insert('{row}', '{{\"id\": {k}, \"v\": 0}}', {t})")
        }
        Kind::FencedUpdate => {
            format!("SELECT fenced_update('{row}', '{{\"id\": {k}}}', '{{\"v\": 1}}', {t})")
        }
        Kind::FencedDelete => format!("SELECT fenced_delete('{row}', '{{\"id\": {k}}}', {t})"),
    })
}

/// Runs the property test; panics (failing the `#[pg_test]`) with the shrunk counterexample.
pub fn run() {
    Spi::run(
        "CREATE FUNCTION pt_try(tok bigint, q text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM set_config('pg_fencing.token', tok::text, true);
             EXECUTE q;
             RETURN 'ok';
         EXCEPTION WHEN OTHERS THEN
             RETURN SQLSTATE;
         END $$",
    )
    .expect("create pt_try");
    let case = Cell::new(0u32);
    let config = Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        let n = case.get();
        case.set(n + 1);
        Spi::run(&format!(
            "CREATE TABLE pt_res_{n} (id int PRIMARY KEY, v int);
             SELECT fencing_protect('pt_res_{n}', 'pt-{n}');
             CREATE TABLE pt_row_{n} (id int PRIMARY KEY, v int);
             SELECT fencing_protect('pt_row_{n}');"
        ))
        .map_err(|e| TestCaseError::fail(format!("setup: {e}")))?;
        let mut model = Model::new();
        for (i, op) in ops.iter().enumerate() {
            let t = model.tokens[op.holder];
            let expected = model.apply(op);
            if let Some(sql) = statement(op, n, t) {
                let got: String = Spi::get_one_with_args(
                    "SELECT pt_try($1, $2)",
                    &[t.into(), sql.clone().into()],
                )
                .map_err(|e| TestCaseError::fail(format!("{e}")))?
                .unwrap_or_default();
                prop_assert_eq!(
                    got.as_str(),
                    expected,
                    "step {} {:?} with token {}: {}",
                    i,
                    op,
                    t,
                    sql
                );
            }
        }
        let mark: Option<i64> = Spi::get_one(&format!("SELECT fencing_high_water('pt-{n}')"))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(mark, model.res_mark, "resource mark");
        let rows: Option<String> = Spi::get_one(&format!(
            "SELECT string_agg(id || ':' || fence_token, ',' ORDER BY id) FROM pt_row_{n}"
        ))
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let mut want: Vec<(i32, i64)> = model.rows.iter().map(|(k, v)| (*k, *v)).collect();
        want.sort();
        let want = want
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(",");
        prop_assert_eq!(rows.unwrap_or_default(), want, "row tokens");
        Ok(())
    });
    if let Err(e) = result {
        panic!("PostgreSQL and the model of the rule disagree: {e}");
    }
}
