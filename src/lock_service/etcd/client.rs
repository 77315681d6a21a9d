//! How the etcd thread connects to etcd, and the settings it connects with (no PostgreSQL).
#![forbid(unsafe_code)]

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use std::time::Duration;

/// The worker's etcd settings, as its main thread read them (`pg_fencing.etcd_endpoints`,
/// `pg_fencing.lease_ttl`, the TLS and authentication settings) and sent them to the etcd thread.
#[derive(Clone, Debug, Default)]
pub(crate) struct Config {
    pub(crate) endpoints: Vec<String>,
    pub(crate) ttl: i64,
    /// The data directory, where the etcd thread saves its state files.
    pub(crate) state_dir: String,
    pub(crate) security: Security,
}

/// TLS and authentication, with the files already read (by the worker's main thread, which
/// resolves paths against the data directory). `problem`: why the settings cannot be used (an
/// unreadable file, a password file others may read); every connection attempt fails with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Security {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) client_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) server_name: Option<String>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) problem: Option<String>,
}

impl Config {
    /// Do two configurations reach etcd the same way (a connection made with one serves the
    /// other)?
    pub(crate) fn same_connection(&self, other: &Config) -> bool {
        self.endpoints == other.endpoints && self.security == other.security
    }
}

/// HTTP/2 keep-alive pings: every 5 minutes at most, only while a request or stream is open.
/// etcd's gRPC proxy (like any gRPC server with default settings) allows a ping every 5 minutes
/// and closes connections that ping more often ("too many pings"); etcd itself allows one every
/// 5 s (`--grpc-keepalive-min-time`). A dead connection is noticed sooner by the deadlines of
/// the requests themselves: lease keepalives every TTL/3, a watch's view confirmed every 200 ms.
const PING_INTERVAL: Duration = Duration::from_secs(300);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// A connection that has answered a status request.
pub(crate) async fn connect(cfg: &Config) -> Result<Client, String> {
    if cfg.endpoints.is_empty() {
        return Err("pg_fencing.etcd_endpoints is empty".into());
    }
    let sec = &cfg.security;
    if let Some(why) = &sec.problem {
        return Err(why.clone());
    }
    // No per-request timeout: a Lock request legitimately waits as long as the caller's
    // timeout; every call below has its own deadline.
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
        .with_keep_alive_while_idle(false);
    if let Some(ca) = &sec.ca_pem {
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert, key)) = &sec.client_pem {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &sec.server_name {
            tls = tls.domain_name(name.clone());
        }
        opts = opts.with_tls(tls);
    }
    if let Some((user, password)) = &sec.user {
        opts = opts
            .with_user(user.clone(), password.clone())
            .with_auto_token_refresh(true);
    }
    let connected = async {
        let mut c = tokio::time::timeout(
            Duration::from_secs(2),
            Client::connect(cfg.endpoints.clone(), Some(opts)),
        )
        .await
        .map_err(|_| "connection timed out".to_string())?
        .map_err(|e| describe(&e))?;
        // A connection is only established lazily; make sure somebody answers.
        tokio::time::timeout(Duration::from_secs(2), c.status())
            .await
            .map_err(|_| "status request timed out".to_string())?
            .map_err(|e| describe(&e))?;
        Ok::<Client, String>(c)
    };
    connected.await.map_err(|why| {
        // etcd with --client-cert-auth closes a TLS connection that brought no certificate; what
        // the client sees of that varies (an alert, a broken pipe, a cancelled request).
        let closed = [
            "Certificate",
            "broken pipe",
            "connection closed",
            "canceled",
        ]
        .iter()
        .any(|sign| why.contains(sign));
        if sec.ca_pem.is_some()
            && sec.client_pem.is_none()
            && closed
            && !why.contains("invalid peer certificate")
        {
            format!(
                "etcd closed the connection; if it requires client certificates, set \
                 pg_fencing.etcd_cert_file and pg_fencing.etcd_key_file ({why})"
            )
        } else {
            why
        }
    })
}

/// An etcd-client error with its causes: a TLS failure ("invalid peer certificate: UnknownIssuer")
/// is only in the sources of tonic's "transport error".
pub(crate) fn describe(e: &etcd_client::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// What an etcd request's failure means to its caller, from etcd-client's error variant and the
/// gRPC status code etcd answered with (etcd's `rpctypes`: a compacted revision is
/// `OUT_OF_RANGE`, an unknown lease `NOT_FOUND`). One exception reads the message: etcd 3.4's
/// `grpc-proxy` passes etcd's errors on as `UNKNOWN` with etcd's own text, and tonic reports some
/// transport failures as `UNKNOWN` too, so for that code alone the text decides (etcd's fixed
/// error strings, or a transport failure; anything else is an answer, `Refused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EtcdFailure {
    /// No answer from etcd: the connection failed or broke (transport, I/O, endpoints), or gRPC
    /// gave up on the call (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, `CANCELLED`, `INTERNAL`, a
    /// transport failure reported as `UNKNOWN`).
    Connection,
    /// etcd answered that the revision asked for was compacted away.
    Compacted,
    /// etcd answered that something the request names does not exist (for a request under a
    /// lease: the lease).
    NotFound,
    /// Any other answer of etcd, or a client-side error.
    Refused,
}

pub(crate) fn classify(e: &etcd_client::Error) -> EtcdFailure {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::TransportError(_) | E::IoError(_) | E::EndpointError(_) | E::EndpointsNotManaged => {
            EtcdFailure::Connection
        }
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Internal => {
                EtcdFailure::Connection
            }
            Code::OutOfRange => EtcdFailure::Compacted,
            Code::NotFound => EtcdFailure::NotFound,
            Code::Unknown => {
                let text = status.message();
                if text.contains("required revision has been compacted") {
                    EtcdFailure::Compacted
                } else if text.contains("requested lease not found") {
                    EtcdFailure::NotFound
                } else if text.contains("transport") || text.contains("connection") {
                    EtcdFailure::Connection
                } else {
                    EtcdFailure::Refused
                }
            }
            _ => EtcdFailure::Refused,
        },
        _ => EtcdFailure::Refused,
    }
}
