//! Typed errors for pg_fencing's SQLSTATEs (class `FT`, the extension's docs/sqlstates.md) and
//! for what this crate refuses itself. One mapping from a server error's fields to a
//! [`FencingError`] ([`FencingError::from_fields`]); each driver's module feeds it.

use std::fmt;

/// A pg_fencing SQLSTATE.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Code {
    /// `FT001`: the token is below the high-water mark of the resource or row.
    StaleToken,
    /// `FT002`: a write to a protected table without a token that counts.
    NoToken,
    /// `FT003`: the token's lock or lease was lost (expired, released, revoked, taken over);
    /// also what a [`crate::Lease`] reports when it is lost.
    LeaseLost,
    /// `FT004`: the table's protection cannot hold right now; writes are refused until repaired.
    ProtectionInactive,
    /// `FT005`: the lock service (etcd) is unreachable or went backwards; retry later.
    LockServiceUnavailable,
    /// `FT006`: the token is not the current lock holder's.
    NotCurrentHolder,
    /// Another SQLSTATE of class `FT` (a newer extension's).
    Other(String),
}

impl Code {
    /// The code for a SQLSTATE of class `FT`; `None` for any other SQLSTATE.
    pub fn from_sqlstate(sqlstate: &str) -> Option<Code> {
        Some(match sqlstate {
            "FT001" => Code::StaleToken,
            "FT002" => Code::NoToken,
            "FT003" => Code::LeaseLost,
            "FT004" => Code::ProtectionInactive,
            "FT005" => Code::LockServiceUnavailable,
            "FT006" => Code::NotCurrentHolder,
            other if other.len() == 5 && other.starts_with("FT") => Code::Other(other.to_owned()),
            _ => return None,
        })
    }

    /// The five-character SQLSTATE.
    pub fn sqlstate(&self) -> &str {
        match self {
            Code::StaleToken => "FT001",
            Code::NoToken => "FT002",
            Code::LeaseLost => "FT003",
            Code::ProtectionInactive => "FT004",
            Code::LockServiceUnavailable => "FT005",
            Code::NotCurrentHolder => "FT006",
            Code::Other(s) => s,
        }
    }
}

/// A write or lock operation refused by pg_fencing (SQLSTATE class `FT`), with the server's
/// message, detail and hint; for a stale token (`FT001`) also the refused token, the resource
/// (resource mode) or the row and its table (per-row mode), and the high-water mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingError {
    /// The SQLSTATE.
    pub code: Code,
    /// The server's message (for this crate's own `FT003`, why the lease or lock was lost).
    pub message: String,
    /// The server's detail.
    pub detail: Option<String>,
    /// The server's hint.
    pub hint: Option<String>,
    /// `FT001`: the refused token.
    pub token: Option<i64>,
    /// `FT001` in resource mode: the resource.
    pub resource: Option<String>,
    /// `FT001` in per-row mode: the row's key, as the server writes it (`(42)`).
    pub row: Option<String>,
    /// `FT001` in per-row mode: the table (`public.payouts`).
    pub table: Option<String>,
    /// `FT001`: the high-water mark the token is below (from the detail).
    pub high_water: Option<i64>,
}

impl FencingError {
    /// The error for a server error's fields; `None` unless `sqlstate` is of class `FT`.
    ///
    /// The server's `FT001` message is exactly `stale fencing token N for resource "<name>"` or
    /// `… for row <key> of table <table>`, the name and key written as they are (not escaped):
    /// the resource is everything between the first and the last quote, the table what follows
    /// the last " of table ". The detail ends with "… is `<mark>`.".
    pub fn from_fields(
        sqlstate: &str,
        message: &str,
        detail: Option<&str>,
        hint: Option<&str>,
    ) -> Option<FencingError> {
        let code = Code::from_sqlstate(sqlstate)?;
        let mut e = FencingError {
            code,
            message: message.to_owned(),
            detail: detail.map(str::to_owned),
            hint: hint.map(str::to_owned),
            token: None,
            resource: None,
            row: None,
            table: None,
            high_water: None,
        };
        if let Some(rest) = message.strip_prefix("stale fencing token ") {
            if let Some((token, target)) = rest.split_once(" for ") {
                if let Ok(token) = token.parse::<i64>() {
                    if let Some(name) = target
                        .strip_prefix("resource \"")
                        .and_then(|n| n.strip_suffix('"'))
                    {
                        e.token = Some(token);
                        e.resource = Some(name.to_owned());
                    } else if let Some((row, table)) = target
                        .strip_prefix("row ")
                        .and_then(|r| r.rsplit_once(" of table "))
                    {
                        e.token = Some(token);
                        e.row = Some(row.to_owned());
                        e.table = Some(table.to_owned());
                    }
                }
            }
        }
        if let Some(d) = detail {
            if d.contains("high-water mark of ") {
                if let Some((_, mark)) = d.rsplit_once(" is ") {
                    e.high_water = mark.strip_suffix('.').unwrap_or(mark).parse().ok();
                }
            }
        }
        Some(e)
    }

    /// A lease's or lock's loss as this crate reports it (`FT003`).
    pub(crate) fn lease_lost(message: String) -> FencingError {
        FencingError::from_fields("FT003", &message, None, None).expect("FT003 is of class FT")
    }

    /// True for `FT001`, `FT003` and `FT006`: the token will never be accepted again (a newer
    /// holder exists, or the lock or lease is gone). Stop, do not retry with this token, and do
    /// not report the job as failed: another holder owns it now.
    pub fn superseded(&self) -> bool {
        matches!(
            self.code,
            Code::StaleToken | Code::LeaseLost | Code::NotCurrentHolder
        )
    }
}

impl fmt::Display for FencingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pg_fencing {}: {}", self.code.sqlstate(), self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for FencingError {}

/// Everything this crate returns as an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Refused by pg_fencing (SQLSTATE class `FT`), or a lease lost (`FT003`).
    #[error(transparent)]
    Fencing(Box<FencingError>),
    /// The fenced transaction could not commit because a statement in it failed (and the
    /// function went on after its error), so PostgreSQL had aborted it: it was rolled back,
    /// nothing of it committed.
    #[error("the fenced transaction was rolled back: a statement in it failed (the function went on after its error), so nothing was committed")]
    RolledBack,
    /// Not a fencing token (tokens are 1 … 2^63 − 1).
    #[error("a fencing token is a positive 64-bit integer (1 .. 9223372036854775807), not {0}")]
    BadToken(i64),
    /// A call this crate refuses (a connection already in a transaction, a TTL that is not
    /// positive …); the message says which.
    #[error("pg_fencing: {0}")]
    Usage(String),
    /// Any other error of the driver (the driver's error is the source).
    #[error("database error: {0}")]
    Database(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// An error of the etcd client.
    #[cfg(feature = "etcd")]
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
}

impl From<FencingError> for Error {
    fn from(e: FencingError) -> Error {
        Error::Fencing(Box::new(e))
    }
}

impl Error {
    /// The pg_fencing refusal, if this is one.
    pub fn fencing(&self) -> Option<&FencingError> {
        match self {
            Error::Fencing(f) => Some(f.as_ref()),
            _ => None,
        }
    }

    /// The SQLSTATE of a refusal or of the driver's database error (tokio-postgres, sqlx), if
    /// there is one: `40001` and `40P01` say the whole transaction may be retried with the same
    /// token.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            Error::Fencing(f) => Some(f.code.sqlstate().to_owned()),
            #[allow(unused_variables)]
            Error::Database(e) => {
                #[cfg(feature = "tokio-postgres")]
                if let Some(e) = e.downcast_ref::<tokio_postgres::Error>() {
                    return e.code().map(|c| c.code().to_owned());
                }
                #[cfg(feature = "sqlx")]
                if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
                    return db.code().map(|c| c.into_owned());
                }
                None
            }
            _ => None,
        }
    }

    /// True for a refusal that means a newer holder exists or the lock or lease is gone
    /// ([`FencingError::superseded`]).
    pub fn superseded(&self) -> bool {
        self.fencing().is_some_and(FencingError::superseded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_resource() {
        let e = FencingError::from_fields(
            "FT001",
            "stale fencing token 7 for resource \"pay \"q\" outs\"",
            Some("the high-water mark of resource \"pay\" is 9."),
            None,
        )
        .unwrap();
        assert_eq!(e.code, Code::StaleToken);
        assert_eq!(e.token, Some(7));
        assert_eq!(e.resource.as_deref(), Some("pay \"q\" outs"));
        assert_eq!(e.high_water, Some(9));
        assert!(e.superseded());
    }

    #[test]
    fn stale_row() {
        let e = FencingError::from_fields(
            "FT001",
            "stale fencing token 3 for row (1) of table x of table public.ledger",
            Some("the high-water mark of the row is 12."),
            None,
        )
        .unwrap();
        assert_eq!(e.row.as_deref(), Some("(1) of table x"));
        assert_eq!(e.table.as_deref(), Some("public.ledger"));
        assert_eq!(e.high_water, Some(12));
    }

    #[test]
    fn other_codes() {
        assert!(FencingError::from_fields("23505", "dup", None, None).is_none());
        let e = FencingError::from_fields("FT004", "inactive", None, None).unwrap();
        assert_eq!(e.code, Code::ProtectionInactive);
        assert!(!e.superseded());
        assert_eq!(e.token, None);
        assert_eq!(
            FencingError::from_fields("FT009", "m", None, None)
                .unwrap()
                .code,
            Code::Other("FT009".into())
        );
        assert!(Error::from(FencingError::lease_lost("x".into())).superseded());
    }
}
