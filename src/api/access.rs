//! Who may use the API: a `Host` check against DNS rebinding, the
//! optional bearer token of `--token-file`, and without a token, what the
//! local user at the other end may read ([`super::authority`]).
//!
//! DNS rebinding: a web page at `attacker.example` makes its name resolve
//! to 127.0.0.1, and the browser then lets its scripts read
//! `http://attacker.example:7070/folded`, every process's stacks, since the
//! origin did not change. The browser still sends `Host: attacker.example`,
//! so refusing names we do not answer to stops it; an IP literal cannot be
//! rebound, so IP addresses are always accepted.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::SystemTime,
};

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, Uri},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::{
    authority::{self, Authority},
    error::ApiError,
    peer::Client,
    server::stats::STATS,
};
use crate::hostname::this_host_name;
use crate::{
    hostname::normalize,
    token::Token,
    untrusted::refusals::{count_for, Reason, What},
};

/// The one endpoint served without the token: liveness probes (kubelet,
/// systemd, load balancers) should not need a secret, and it shows no
/// process data.
const OPEN_PATH: &str = "/healthz";

/// The access rules of one server.
#[derive(Debug, Clone)]
pub struct Access {
    /// Host names accepted besides IP literals, lowercase, no trailing dot:
    /// `localhost`, this machine's name, the `--allow-host` names.
    hosts: Vec<String>,
    token: Option<Token>,
    /// Without a token, whether a local client's uid limits what it reads
    /// (`--local-auth`, on by default).
    local_auth: bool,
}

impl Access {
    /// The Host check alone: IP literals, `localhost` and this machine's
    /// name; no token, no per-user limit (in-process routers have no
    /// client socket).
    pub fn local() -> Access {
        Access::new(Vec::new(), None).with_local_auth(false)
    }

    /// The Host check, also accepting `extra_hosts` (`--allow-host`), and
    /// with `token`, requiring it on every endpoint but `/healthz`; without
    /// one, a local user other than root reads only their own processes.
    pub fn new(extra_hosts: Vec<String>, token: Option<Token>) -> Access {
        let mut hosts = vec!["localhost".to_string()];
        hosts.extend(this_host_name());
        hosts.extend(extra_hosts.iter().map(|h| normalize(h)));
        hosts.sort();
        hosts.dedup();
        Access {
            hosts,
            token,
            local_auth: true,
        }
    }

    /// Turns the per-user limit of clients without a token on or off.
    pub fn with_local_auth(mut self, on: bool) -> Access {
        self.local_auth = on;
        self
    }

    /// What the request may read, or why it may not: the token when one is
    /// configured (a valid one reads all), else the client's uid; with the
    /// start of the process a user other than root asks about.
    fn authority(&self, req: &Request) -> Result<(Authority, Option<SystemTime>), ApiError> {
        let path = req.uri().path();
        if self.token.is_some() {
            let valid = self.token_ok(req.headers());
            if path != OPEN_PATH {
                if let Err(reason) = valid {
                    STATS.count_rejected_token();
                    return Err(ApiError::Unauthorized(reason.into()));
                }
            }
            // `/healthz` without the token: the processes it names are
            // only for root's eyes (or a local user's own).
            let authority = match (valid, req.extensions().get::<Client>()) {
                (Ok(()), _) => Authority::All,
                (Err(_), Some(c)) if c.uid.is_some() => authority::of_client(Some(c)),
                (Err(_), _) => Authority::Open,
            };
            return Ok((authority, None));
        }
        if !self.local_auth {
            return Ok((Authority::All, None));
        }
        let authority = authority::of_client(req.extensions().get::<Client>());
        let refuse = |message: String| {
            count_for(What::Client, Reason::Forbidden, 0);
            ApiError::Forbidden(message)
        };
        let pid = authority::check(authority, path, req.uri().query(), authority::process_uid)
            .map_err(|r| refuse(r.0))?;
        let start = match pid {
            Some(pid) => Some(
                authority::start_of(pid)
                    .ok_or_else(|| refuse(format!("pid {pid} no longer runs")))?,
            ),
            None => None,
        };
        Ok((authority, start))
    }

    /// Whether a `Host` value (`name`, `name:port`, `1.2.3.4:80`,
    /// `[::1]:80`) names this server.
    fn host_allowed(&self, value: &str) -> bool {
        match parse_host(value) {
            Some(Host::Ip) => true,
            Some(Host::Name(name)) => self.hosts.contains(&name),
            None => false,
        }
    }

    /// The `Host` headers and the request target's authority (an
    /// absolute-form target overrides `Host`) that are not allowed; a
    /// request with two `Host` headers is refused too, since a proxy and
    /// this server might each pick a different one.
    fn refused_host(&self, headers: &HeaderMap, uri: &Uri) -> Option<String> {
        let hosts: Vec<_> = headers.get_all(header::HOST).iter().collect();
        if hosts.len() > 1 {
            return Some("(several Host headers)".into());
        }
        let values = hosts
            .iter()
            .map(|v| v.to_str().unwrap_or("(not text)"))
            .chain(uri.authority().map(|a| a.as_str()));
        values
            .into_iter()
            .find(|v| !self.host_allowed(v))
            .map(str::to_string)
    }

    /// Whether `headers` carry `Authorization: Bearer <token>` (or no token
    /// is configured).
    fn token_ok(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err("missing `Authorization: Bearer <token>` header");
        };
        let bytes = value.as_bytes();
        let given = match bytes.iter().position(|b| *b == b' ') {
            Some(i) if bytes[..i].eq_ignore_ascii_case(b"bearer") => bytes[i + 1..].trim_ascii(),
            _ => return Err("the Authorization header is not `Bearer <token>`"),
        };
        if token.matches(given) {
            Ok(())
        } else {
            Err("wrong bearer token")
        }
    }
}

/// What a `Host` value names.
#[derive(Debug, PartialEq, Eq)]
enum Host {
    /// An IPv4 or bracketed IPv6 literal.
    Ip,
    /// A name, lowercase, without its trailing dot.
    Name(String),
}

/// Parses a `Host` value with an optional port; `None` if malformed.
fn parse_host(value: &str) -> Option<Host> {
    let port_ok = |port: &str| {
        !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
    };
    if let Some(rest) = value.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        ip.parse::<Ipv6Addr>().ok()?;
        return match after {
            "" => Some(Host::Ip),
            _ => after
                .strip_prefix(':')
                .filter(|p| port_ok(p))
                .map(|_| Host::Ip),
        };
    }
    let name = match value.rsplit_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return None,
        None => value,
    };
    if name.is_empty() || name.contains(':') {
        return None;
    }
    if name.parse::<Ipv4Addr>().is_ok() {
        return Some(Host::Ip);
    }
    Some(Host::Name(normalize(name)))
}

/// Checks an `--allow-host` value: a host name, without port or scheme.
pub fn parse_allowed_host(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if valid {
        Ok(normalize(value))
    } else {
        Err(format!(
            "`{value}` is not a host name (give the name only, e.g. `profiler.example.com`)"
        ))
    }
}

/// Middleware: refuses requests for other hosts (421), with a token,
/// requests without it (401), and requests for what the client's user may
/// not read (403), before any handler runs; hands the handlers the
/// request's [`Authority`].
pub async fn check(State(access): State<Arc<Access>>, mut req: Request, next: Next) -> Response {
    if let Some(host) = access.refused_host(req.headers(), req.uri()) {
        STATS.count_rejected_host();
        return ApiError::MisdirectedHost(host).into_response();
    }
    match access.authority(&req) {
        Ok((authority, start)) => {
            req.extensions_mut().insert(authority);
            authority::scoped(start, next.run(req)).await
        }
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_values() {
        for ip in [
            "127.0.0.1",
            "127.0.0.1:7070",
            "10.1.2.3:80",
            "[::1]",
            "[::1]:7070",
            "[fe80::1]:1",
        ] {
            assert_eq!(parse_host(ip), Some(Host::Ip), "{ip}");
        }
        assert_eq!(
            parse_host("LocalHost.:7070"),
            Some(Host::Name("localhost".into()))
        );
        for bad in [
            "", ":80", "a:b", "[::1", "[::1]x", "[::1]:", "::1", "[zz]:1", "h:123456",
        ] {
            assert_eq!(parse_host(bad), None, "{bad}");
        }
        assert_eq!(
            parse_host("127.0.0.1.nip.io"),
            Some(Host::Name("127.0.0.1.nip.io".into()))
        );
    }

    #[test]
    fn allows_ips_localhost_this_host_and_extra_names() {
        let a = Access::new(vec!["Prof.Example.".into()], None);
        for ok in [
            "127.0.0.1:1",
            "[::1]:7070",
            "localhost",
            "prof.example:7070",
        ] {
            assert!(a.host_allowed(ok), "{ok}");
        }
        if let Some(me) = this_host_name() {
            assert!(a.host_allowed(&format!("{me}:7070")), "{me}");
        }
        for refused in [
            "attacker.example",
            "localhost.attacker.example",
            "prof.example.evil",
        ] {
            assert!(!a.host_allowed(refused), "{refused}");
        }
    }

    #[test]
    fn checks_the_bearer_token() {
        let a = Access::new(Vec::new(), Some(Token::new("tok").unwrap()));
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            a.token_ok(&h)
        };
        assert!(with("Bearer tok").is_ok());
        assert!(with("bearer  tok ").is_ok());
        assert!(with("Bearer to").is_err());
        assert!(with("Basic tok").is_err());
        assert!(with("tok").is_err());
        assert!(a.token_ok(&HeaderMap::new()).is_err());
        assert!(Access::local().token_ok(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn healthz_without_the_token_is_read_as_the_client_not_as_root() {
        let a = Access::new(Vec::new(), Some(Token::new("tok").unwrap()));
        let authority = |uid: Option<u32>, addr: &str, token: bool| {
            let mut req = Request::builder().uri("/healthz");
            if token {
                req = req.header(header::AUTHORIZATION, "Bearer tok");
            }
            let mut req = req.body(axum::body::Body::empty()).unwrap();
            req.extensions_mut().insert(Client {
                addr: addr.parse().unwrap(),
                uid,
            });
            a.authority(&req).unwrap().0
        };
        assert_eq!(authority(Some(7), "127.0.0.1:1", false), Authority::Own(7));
        assert_eq!(authority(Some(0), "127.0.0.1:1", false), Authority::All);
        assert_eq!(authority(None, "10.0.0.5:1", false), Authority::Open);
        assert_eq!(authority(None, "10.0.0.5:1", true), Authority::All);
        assert_eq!(authority(Some(7), "127.0.0.1:1", true), Authority::All);
    }

    #[test]
    fn allowed_host_flag_takes_names_only() {
        assert_eq!(parse_allowed_host("Prof.example").unwrap(), "prof.example");
        for bad in ["", "prof:7070", "http://prof", "a b"] {
            assert!(parse_allowed_host(bad).is_err(), "{bad}");
        }
    }
}
