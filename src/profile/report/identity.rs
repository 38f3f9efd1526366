//! Who a process is, as answers show it (`/processes`, `/threads`): its
//! command line, executable, program (Java main class or jar, Python
//! script or module) and cgroup in each hierarchy, as the newest slice of
//! the window recorded them, so that a process that exited keeps its
//! identity. Also the one `name=` matcher ([`matches`]) and the `limit=`
//! cut ([`cut`]) of the answers that list processes or threads.
//!
//! Everything shown was cleaned when it was read (see
//! [`crate::process::identity`]); a reader who may not see a process
//! gets no identity for it (the reports leave out its row).

use std::collections::BTreeMap;

use serde::Serialize;

use super::disclosure::Sight;
use crate::{
    process::container::Container,
    profile::model::{store::Snapshot, window::Window, Origin},
};

/// Most bytes of a `name=` value.
pub const MAX_NAME: usize = 256;

/// A process's identity as answers show it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Shown {
    /// Its arguments joined by spaces, at most
    /// [`crate::process::identity::MAX_SHOWN`] bytes, escaped, secret
    /// values masked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// Its executable's path, as the kernel gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
    /// What its launcher runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub main: Option<Main>,
    /// Its cgroup in each hierarchy.
    #[serde(skip_serializing_if = "Cgroups::is_empty")]
    pub cgroups: Cgroups,
}

/// A launcher's program: a Java main class, jar or module, a Python
/// script, or a Python module (`-m module`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Main {
    /// `java_class`, `java_jar`, `java_module`, `python_script` or
    /// `python_module`.
    pub kind: &'static str,
    pub name: String,
}

/// A process's cgroup path in the unified hierarchy (`v2`) and in each v1
/// controller's (`v1`, by controller: `cpu`, `memory`, `name=systemd`).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Cgroups {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v2: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub v1: BTreeMap<String, String>,
}

impl Cgroups {
    pub fn is_empty(&self) -> bool {
        self.v2.is_none() && self.v1.is_empty()
    }
}

impl Shown {
    /// What `origin` records of a process; `None` when it records nothing
    /// to show.
    pub fn of(origin: &Origin) -> Option<Shown> {
        let identity = origin.identity.as_deref();
        let mut v1 = BTreeMap::new();
        for (controllers, path) in origin.cgroups_v1.iter().flat_map(|v| v.iter()) {
            for controller in controllers.split(',').filter(|c| !c.is_empty()) {
                v1.insert(controller.to_string(), path.to_string());
            }
        }
        let shown = Shown {
            cmdline: identity.map(|i| i.cmdline.to_string()),
            executable: identity.and_then(|i| Some(i.executable.as_deref()?.to_string())),
            main: identity.and_then(|i| {
                let (kind, name) = i.entry.as_ref()?;
                Some(Main {
                    kind: kind.name(),
                    name: name.to_string(),
                })
            }),
            cgroups: Cgroups {
                v2: origin.cgroup.as_deref().map(str::to_string),
                v1,
            },
        };
        (shown != Shown::default()).then_some(shown)
    }

    /// The command line cut to `width` characters for a table, `-` when
    /// not known.
    pub fn short_command(shown: Option<&Shown>, width: usize) -> String {
        cut_chars(
            shown.and_then(|s| s.cmdline.as_deref()).unwrap_or("-"),
            width,
        )
    }
}

impl Shown {
    /// Lines for a text answer's header: the command line, the executable
    /// and program, the cgroups.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(cmdline) = &self.cmdline {
            lines.push(format!("command: {cmdline}"));
        }
        let mut what = Vec::new();
        if let Some(exe) = &self.executable {
            what.push(format!("executable {exe}"));
        }
        if let Some(main) = &self.main {
            what.push(format!("{} {}", main.kind, main.name));
        }
        if !what.is_empty() {
            lines.push(format!("runs: {}", what.join(", ")));
        }
        let mut cgroups: Vec<String> = self.cgroups.v2.iter().map(|p| format!("v2 {p}")).collect();
        cgroups.extend(self.cgroups.v1.iter().map(|(c, p)| format!("{c} {p}")));
        if !cgroups.is_empty() {
            lines.push(format!("cgroups: {}", cgroups.join(", ")));
        }
        lines
    }
}

/// The newest identity of process `pid` in `window` that `sight` may see
/// (`None`: none recorded, or not the reader's to see).
pub fn of_process(store: &Snapshot, pid: u32, window: Window, sight: &Sight) -> Option<Shown> {
    let mut newest = None;
    for slice in store.within(window) {
        if let Some(origin) = slice.origins.get(&pid) {
            newest = sight.sees(pid, slice.start).then(|| origin.clone());
        }
    }
    newest.as_ref().and_then(Shown::of)
}

/// `s` cut to `width` characters (the last one `…` when cut), for a
/// table's column.
pub fn cut_chars(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let kept = s.chars().take(width.saturating_sub(1));
        kept.chain(['…']).collect()
    }
}

/// A `name=` value: what the process's names must contain, in lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(String);

impl Name {
    /// The value, or why it is refused (empty, or over [`MAX_NAME`]).
    pub fn parse(raw: &str) -> Result<Name, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.len() > MAX_NAME {
            return Err(format!("at most {MAX_NAME} bytes, got {}", raw.len()));
        }
        Ok(Name(raw.to_lowercase()))
    }
}

/// Whether a process's names contain `name`, ignoring case: its name
/// (`comm`), command line, executable, program, or its container's or
/// pod's name.
pub fn matches(
    name: &Name,
    comm: &str,
    shown: Option<&Shown>,
    container: Option<&Container>,
) -> bool {
    let has = |s: &str| s.to_lowercase().contains(&name.0);
    let identity = shown.into_iter().flat_map(|s| {
        [
            s.cmdline.as_deref(),
            s.executable.as_deref(),
            s.main.as_ref().map(|m| m.name.as_str()),
        ]
    });
    let container = container
        .into_iter()
        .flat_map(|c| [c.container.as_deref(), c.pod.as_deref()]);
    has(comm) || identity.chain(container).flatten().any(has)
}

/// Cuts `rows` to at most `limit` (none: all), returning how many were
/// cut.
pub fn cut<T>(rows: &mut Vec<T>, limit: Option<usize>) -> usize {
    let Some(limit) = limit else { return 0 };
    let omitted = rows.len().saturating_sub(limit);
    rows.truncate(limit);
    omitted
}

/// The line a text answer ends with when rows were cut.
pub fn omitted_line(omitted: usize, limit: usize) -> Option<String> {
    (omitted > 0).then(|| format!("… {omitted} more rows (limit={limit})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An origin of a process run as `args` from `exe`.
    fn origin_of(args: &[&str], exe: &str) -> Origin {
        use crate::process::identity::Identity;
        use std::sync::Arc;
        let raw = args.join("\0");
        Origin {
            parent: 1,
            cgroup: Some(Arc::from("/system.slice/app.service")),
            cgroups_v1: Some(Arc::new(crate::process::cgroups::V1Paths::in_file(
                "4:cpu,cpuacct:/app\n1:name=systemd:/system.slice/app.service\n",
            ))),
            identity: Identity::of(raw.as_bytes(), false, Some(std::path::Path::new(exe)))
                .map(Arc::new),
        }
    }

    #[test]
    fn an_origin_shows_its_identity_and_cgroups() {
        let origin = origin_of(&["python3", "-u", "/srv/Shop.py"], "/usr/bin/python3.11");
        let shown = Shown::of(&origin).unwrap();
        assert_eq!(shown.cmdline.as_deref(), Some("python3 -u /srv/Shop.py"));
        assert_eq!(shown.main.as_ref().unwrap().kind, "python_script");
        assert_eq!(shown.cgroups.v1["cpu"], "/app");
        assert_eq!(shown.cgroups.v1["cpuacct"], "/app");
        assert_eq!(
            shown.cgroups.v1["name=systemd"],
            "/system.slice/app.service"
        );
        let json = serde_json::to_value(&shown).unwrap();
        assert_eq!(json["cgroups"]["v2"], "/system.slice/app.service");
        assert_eq!(json["main"]["name"], "/srv/Shop.py");
        assert_eq!(Shown::of(&Origin::default()), None);
        let lines = shown.describe();
        assert_eq!(lines[0], "command: python3 -u /srv/Shop.py");
        assert_eq!(
            lines[1],
            "runs: executable /usr/bin/python3.11, python_script /srv/Shop.py"
        );
        assert!(lines[2].starts_with("cgroups: v2 /system.slice/app.service, cpu /app"));
        assert_eq!(Shown::short_command(Some(&shown), 10), "python3 -…");
        assert_eq!(Shown::short_command(None, 10), "-");
    }

    #[test]
    fn names_match_any_identity_field_ignoring_case() {
        let origin = origin_of(&["java", "-jar", "/srv/Billing-2.jar"], "/opt/jdk/bin/java");
        let shown = Shown::of(&origin);
        let m = |n: &str| matches(&Name::parse(n).unwrap(), "java", shown.as_ref(), None);
        assert!(m("billing") && m("JDK/BIN") && m("JAVA") && m("-jar /srv"));
        assert!(!m("python"));
        let container = Container {
            id: "ab".into(),
            runtime: "docker",
            cgroup: "/docker/ab".into(),
            pod_uid: None,
            namespace: None,
            pod: Some("checkout-7f".into()),
            container: Some("web".into()),
        };
        let name = Name::parse("Checkout").unwrap();
        assert!(matches(&name, "x", None, Some(&container)));
        assert!(!matches(&name, "x", None, None));
        assert!(Name::parse("").is_err());
        assert!(Name::parse(&"a".repeat(MAX_NAME + 1)).is_err());
    }

    /// Pid 5 was another user's `victim` (`/srv/victim.py`) until the
    /// reader's own `mine` took the pid; pid 6 exited after its slice.
    #[test]
    fn processes_are_found_by_name_and_shown_only_to_whom_may_see_them() {
        use crate::profile::{
            model::{counters::RawThread, state::State, store::Store, window::Window, Slice},
            report::{
                disclosure::{Reader, Sight},
                processes::{processes, SortBy},
            },
        };
        use std::{
            sync::Arc,
            time::{Duration, SystemTime},
        };
        let at = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let mut store = Store::new(Duration::from_secs(600));
        let slice = |end: u64, rows: &[(u32, &str, &[&str])]| {
            let mut slice = Slice::empty(at(end - 1), at(end));
            for (pid, comm, args) in rows {
                let mut thread = RawThread {
                    tid: *pid,
                    pid: *pid,
                    comm: comm.to_string(),
                    counters: Default::default(),
                };
                thread.counters.ns[State::Sleep as usize] = 1_000_000;
                slice.thread_totals.push(thread);
                slice.processes.insert(*pid, Arc::from(*comm));
                slice
                    .origins
                    .insert(*pid, origin_of(args, "/usr/bin/python3"));
            }
            slice
        };
        let victim: &[&str] = &["python3", "/srv/victim.py"];
        store.push(slice(
            91,
            &[
                (5, "python3", victim),
                (6, "python3", &["python3", "/srv/gone.py"]),
            ],
        ));
        store.push(slice(100, &[(5, "mine", &["mine", "--serve"])]));
        let window = Window::last(30, at(100));
        let find = |name: &str, sight: &Sight| {
            let name = Name::parse(name).unwrap();
            processes(
                &store.snapshot(),
                window,
                SortBy::Cpu,
                (None, Some(&name)),
                sight,
            )
        };
        // Root: the exited process keeps its identity; the newest program
        // of a pid is what it shows.
        let gone = find("GONE.PY", &Sight::all());
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].pid, 6);
        let shown = gone[0].identity.as_ref().unwrap();
        assert_eq!(shown.main.as_ref().unwrap().name, "/srv/gone.py");
        assert_eq!(find("serve", &Sight::all())[0].pid, 5);
        assert!(find("victim", &Sight::all()).is_empty());
        // A user who owns pid 5 since 95 s: its own program only, and no
        // count row when asking by name.
        let reader = Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(move |pid| (pid == 5).then_some((1000, at(95)))),
        };
        assert!(find("gone", &reader.sight()).is_empty());
        assert!(find("victim", &reader.sight()).is_empty());
        let mine = find("mine", &reader.sight());
        assert_eq!(mine.len(), 1);
        assert_eq!(
            mine[0].identity.as_ref().unwrap().cmdline.as_deref(),
            Some("mine --serve")
        );
        let all = processes(
            &store.snapshot(),
            window,
            SortBy::Cpu,
            (None, None),
            &reader.sight(),
        );
        assert!(
            all.iter().all(|r| r.pid == 5 || r.identity.is_none()),
            "{all:?}"
        );
    }

    #[test]
    fn limits_cut_and_say_so() {
        let mut rows: Vec<u32> = (0..10).collect();
        assert_eq!(cut(&mut rows, None), 0);
        assert_eq!(cut(&mut rows, Some(3)), 7);
        assert_eq!(rows, [0, 1, 2]);
        assert_eq!(omitted_line(7, 3).unwrap(), "… 7 more rows (limit=3)");
        assert_eq!(omitted_line(0, 3), None);
    }
}
