//! What a local client may read: root sees every process, another local
//! user only their own (see [`super::peer`] for how a client's uid is
//! found).
//!
//! For a user other than root, an endpoint that names a process (`pid=`)
//! must name one whose uids are all theirs; host-wide answers (`/metrics`,
//! `/folded` without a pid, `/runqueue` of the host or of a cgroup) are
//! refused; `/processes` lists their own processes only; the pages, the
//! scripts and `/healthz` are open. Wherever an answer would name another
//! user's process (culprits, wakers, `/healthz`), such a user reads a
//! count instead ([`reader`]).

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::peer::Client;
use crate::profile::{model::window::Window, report::disclosure::Reader};

tokio::task_local! {
    /// While a request of a user other than root is handled: when the
    /// process it names started (see [`scoped`]).
    static NOT_BEFORE: SystemTime;
}

/// A process's start time is known to the second (the boot time is whole
/// seconds): its queries start this much later, to leave out all of an
/// earlier process with the same pid.
const START_MARGIN: Duration = Duration::from_secs(1);

/// Runs the handler future `f` with the windows it reads starting no
/// earlier than `not_before` ([`clamp`]).
pub async fn scoped<F: Future>(not_before: Option<SystemTime>, f: F) -> F::Output {
    match not_before {
        Some(t) => NOT_BEFORE.scope(t, f).await,
        None => f.await,
    }
}

/// `window`, without what came before the process of a user's request
/// started: a pid reused within the window (by this user, after another
/// user's process ended) shows only this user's process. Called in the
/// handler's async part, where [`scoped`] set the time.
pub fn clamp(window: Window) -> Window {
    match NOT_BEFORE.try_with(|t| *t) {
        Ok(t) => window.since(t),
        Err(_) => window,
    }
}

/// Whether the request being handled is a user's other than root (about
/// their own process): answers then leave out other processes' stacks
/// and names ([`crate::profile::report::query::Filter::others_hidden`]). Called
/// in the handler's async part, as [`clamp`] is.
pub fn others_hidden() -> bool {
    NOT_BEFORE.try_with(|_| ()).is_ok()
}

/// When the request's process started, with [`START_MARGIN`]; `None` if
/// it is gone.
pub fn start_of(pid: u32) -> Option<SystemTime> {
    crate::process::live::start_time(pid).map(|t| t + START_MARGIN)
}

/// What a request may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// Every process: root, a valid token, or local checks turned off.
    All,
    /// The processes of this uid only.
    Own(u32),
    /// Only the pages, scripts and `/healthz`: a loopback client whose uid
    /// could not be found.
    Open,
}

/// Why a request is refused (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

/// Paths open to every local user: pages, scripts, health counters.
fn open_path(path: &str) -> bool {
    path == "/"
        || path == "/healthz"
        || path.starts_with("/ui/")
        || path
            .strip_prefix("/process/")
            .is_some_and(|p| !p.contains('/'))
}

/// Endpoints answering about the one process of their `pid` parameter.
const PER_PROCESS: [&str; 9] = [
    "/folded",
    "/trace",
    "/flamegraph",
    "/pprof",
    "/threads",
    "/timeline",
    "/blocked",
    "/runqueue",
    "/explain",
];

/// The authority of a client without a token: root and remote clients (a
/// non-loopback listener needs a token or `--insecure-listen`) read all; a
/// local user their own processes; a loopback client whose uid is unknown
/// (or a request that came through no socket) only the open paths.
pub fn of_client(client: Option<&Client>) -> Authority {
    match client {
        Some(Client { uid: Some(0), .. }) => Authority::All,
        Some(Client { uid: Some(uid), .. }) => Authority::Own(*uid),
        Some(c) if !c.is_loopback() => Authority::All,
        _ => Authority::Open,
    }
}

fn unknown_client() -> Refusal {
    Refusal(
        "cannot tell which local user this connection belongs to, so it may read no \
         process data (connect over TCP from this host, or give the --token-file token)"
            .into(),
    )
}

/// Who reads an answer, for what it may name of other processes
/// ([`crate::profile::report::disclosure`]): a user other than root (or one whose
/// uid is unknown) sees other users' processes only as a count.
pub fn reader(authority: Authority) -> Reader {
    let uid = match authority {
        Authority::All => return Reader::All,
        Authority::Own(uid) => Some(uid),
        Authority::Open => None,
    };
    Reader::User {
        uid,
        owner_of: Arc::new(|pid| Some((process_uid(pid)?, start_of(pid)?))),
    }
}

/// The reader of a request the access check handed `authority`; none
/// (a router without the check) reads no other process.
pub fn reader_of(authority: Option<axum::Extension<Authority>>) -> Reader {
    reader(authority.map_or(Authority::Open, |a| a.0))
}

/// Whether `authority` may ask for `path?query`; `uid_of` gives a
/// process's uid if all of its uids (real, effective, saved, fs) are one.
/// For a user other than root, the pid checked to be theirs, if any.
pub fn check(
    authority: Authority,
    path: &str,
    query: Option<&str>,
    uid_of: impl Fn(u32) -> Option<u32>,
) -> Result<Option<u32>, Refusal> {
    let uid = match authority {
        Authority::All => return Ok(None),
        Authority::Own(uid) => uid,
        Authority::Open if open_path(path) => return Ok(None),
        Authority::Open => return Err(unknown_client()),
    };
    if open_path(path) || path == "/processes" {
        return Ok(None);
    }
    if !PER_PROCESS.contains(&path) {
        return Err(Refusal(format!(
            "{path} shows every process on the host: only root (or a client with the \
             --token-file token) may read it; uid {uid} may ask about its own processes \
             with `pid=`"
        )));
    }
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.unwrap_or("")).unwrap_or_default();
    if pairs.iter().any(|(k, _)| k == "cgroup" || k == "container") {
        return Err(Refusal(format!(
            "uid {uid} may not ask about cgroups or containers, whose processes may be \
             other users': ask with `pid=` about one of its own processes"
        )));
    }
    let pids: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "pid")
        .map(|(_, v)| v.as_str())
        .collect();
    let [pid] = pids.as_slice() else {
        return Err(Refusal(format!(
            "uid {uid} may read only its own processes: give one `pid=` naming one of them"
        )));
    };
    match pid.parse::<u32>().ok().map(|p| (p, uid_of(p))) {
        Some((p, Some(owner))) if owner == uid => Ok(Some(p)),
        Some((p, _)) => Err(Refusal(format!(
            "pid {p} is not a process of uid {uid} (or no longer runs): a local user \
             may read only its own processes"
        ))),
        None => Err(Refusal(format!("`pid={pid}` is not a process id"))),
    }
}

/// The uid of process `pid` if all its uids agree (see
/// [`crate::process::live::sole_uid`]).
pub fn process_uid(pid: u32) -> Option<u32> {
    crate::process::live::sole_uid(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(addr: &str, uid: Option<u32>) -> Client {
        Client {
            addr: addr.parse().unwrap(),
            uid,
        }
    }

    #[test]
    fn root_reads_all_users_their_own_unknown_local_nothing() {
        let of = |c: Client| of_client(Some(&c));
        assert_eq!(of(client("127.0.0.1:5000", Some(0))), Authority::All);
        assert_eq!(of(client("[::1]:5000", Some(65534))), Authority::Own(65534));
        assert_eq!(
            of(client("[::ffff:127.0.0.1]:5000", Some(1000))),
            Authority::Own(1000)
        );
        assert_eq!(of(client("127.0.0.1:5000", None)), Authority::Open);
        assert_eq!(of(client("[::ffff:127.0.0.1]:5000", None)), Authority::Open);
        assert_eq!(of_client(None), Authority::Open);
        // A local user reaching a non-loopback address is still that user.
        assert_eq!(of(client("10.0.0.5:5000", Some(7))), Authority::Own(7));
        // A remote client: the listener's token rule decides.
        assert_eq!(of(client("10.0.0.5:5000", None)), Authority::All);
        let open = |path: &str| check(Authority::Open, path, Some("pid=1"), |_| Some(0));
        assert!(open("/healthz").is_ok() && open("/ui/app.css").is_ok() && open("/").is_ok());
        for refused in ["/processes", "/threads", "/metrics"] {
            assert!(open(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_user_reads_only_pids_of_their_own() {
        let owners = |pid: u32| match pid {
            10 => Some(1000),
            20 => Some(0),
            _ => None,
        };
        let user = Authority::Own(1000);
        let ok = |path: &str, q: &str| check(user, path, Some(q), owners).is_ok();
        for path in PER_PROCESS {
            assert!(ok(path, "pid=10&seconds=5"), "{path}");
            assert!(!ok(path, "pid=20"), "{path} of root's");
            assert!(!ok(path, "pid=30"), "{path} of a gone process");
            assert!(!ok(path, ""), "{path} host-wide");
            assert!(!ok(path, "pid=10&pid=20"), "{path} two pids");
            assert!(!ok(path, "pid=x"), "{path} bad pid");
        }
        assert!(!ok("/runqueue", "pid=10&cgroup=/"));
        assert!(!ok("/runqueue", "container=abcdefabcdef"));
        assert!(!ok("/folded", "tid=10"));
        for open in ["/", "/healthz", "/ui/app.css", "/process/20", "/processes"] {
            assert!(ok(open, ""), "{open}");
        }
        for refused in ["/metrics", "/host", "/unknown", "/process/20/x"] {
            assert!(!ok(refused, "pid=10"), "{refused}");
        }
        let message = check(user, "/threads", Some("pid=20"), owners).unwrap_err();
        assert!(message.0.contains("pid 20"), "{message:?}");
        // Root and token holders are not checked at all.
        assert!(check(Authority::All, "/metrics", None, owners).is_ok());
        assert!(check(Authority::All, "/threads", Some("pid=20"), |_| None).is_ok());
    }
}
