//! `/runqueue`: how long the host, a process, a cgroup or a container
//! waited for a CPU and was throttled, or every cgroup's (`cgroup=all`).

use super::{unknown_pid, Answer, Refusal, Windowed};
use crate::profile::{
    model::{
        store::{Recorded, Snapshot},
        window::Window,
    },
    report::{
        cgroup_list::{self, CgroupList},
        culprits,
        disclosure::Sight,
        host_facts::HostFacts,
        runqueue::{self, Owner, OwnerError, RunqueueReport},
        throttling,
    },
};

impl Windowed for RunqueueReport {
    fn recorded_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }

    fn note(&self) -> Option<String> {
        self.note.clone()
    }
}

impl Windowed for CgroupList {
    fn recorded_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }
}

/// Whose runqueue waits are asked for: a process, a cgroup (id or path),
/// a container (by id or name), or, with none, the host's.
#[derive(Debug, Clone, Default)]
pub struct Asked {
    pub pid: Option<u32>,
    pub cgroup: Option<String>,
    pub container: Option<String>,
}

/// Every cgroup with waits or throttled time in `window`.
pub fn cgroups(store: &Snapshot, host: &dyn HostFacts, window: Window) -> Answer<CgroupList> {
    Answer::report(store, window, cgroup_list::list(store, host, window))
}

/// The runqueue report of `asked` in `window`. A process that exists is
/// answered with zeros and a note; a pid never seen, or an owner with
/// nothing recorded, is not found.
pub fn runqueue(
    store: &Snapshot,
    host: &dyn HostFacts,
    asked: Asked,
    window: Window,
    sight: &Sight,
) -> Result<Answer<RunqueueReport>, Refusal> {
    let nothing = |who: &str| {
        Refusal::NotFound(format!(
            "no runqueue latency or throttling recorded for {who} in the {}",
            window.describe()
        ))
    };
    let Asked {
        pid,
        cgroup,
        container,
    } = asked;
    if pid.is_none() && cgroup.is_none() && container.is_none() {
        let report = runqueue::host_report(store, window).ok_or_else(|| {
            Refusal::NotFound(format!(
                "no runqueue latency or throttling recorded on the host in the {}",
                window.describe()
            ))
        })?;
        return Ok(Answer::report(store, window, report));
    }
    let cgroup = match container {
        Some(name) => Some(container_cgroup(store, &name)?),
        None => cgroup,
    };
    // A path only a v1 hierarchy has: its processes' histograms.
    if let Some(path) = cgroup.as_deref().filter(|c| c.starts_with('/')) {
        let pids = match host.cgroup_id(path) {
            Some(_) => Vec::new(),
            None => host.cgroup_v1_members(path),
        };
        if !pids.is_empty() {
            let owner = Owner::CgroupV1 {
                cgroup_v1: path.to_string(),
                processes: pids.len(),
            };
            let who = owner.describe();
            let mut report = runqueue::processes_report(store, owner, &pids, window)
                .ok_or_else(|| nothing(&who))?;
            report.throttled_by = throttling::of_path(store, host, window, path, sight);
            return Ok(Answer::report(store, window, report));
        }
    }
    let owner = runqueue::owner(host, pid, cgroup.as_deref()).map_err(|e| match e {
        OwnerError::Param(param, message) => Refusal::Bad(param, message),
        OwnerError::NoSuchCgroup(message) => Refusal::NotFound(message),
    })?;
    let mut report = match runqueue::report(store, host, owner, window) {
        Some(report) => report,
        None => {
            let who = Owner::resolve(host, owner);
            let note = format!(
                "no runqueue latency or throttling recorded for {} in the {}",
                who.describe(),
                window.describe()
            );
            // A process that exists is answered (zeros, a note): only a
            // pid never seen is "not found".
            match pid {
                Some(pid) => match unknown_pid(store, host, pid) {
                    Some(unknown) => return Err(Refusal::NotFound(unknown)),
                    None => runqueue::empty(who, window, note),
                },
                None => return Err(Refusal::NotFound(note)),
            }
        }
    };
    if let Some(pid) = pid {
        report.kept_off_cpu_by =
            culprits::kept_off(store, window, pid, None, culprits::LISTED, sight);
        report.throttled_by = throttling::of_pid(store, host, window, pid, sight);
    } else if let Some(path) = cgroup.as_deref().filter(|c| c.starts_with('/')) {
        report.throttled_by = throttling::of_path(store, host, window, path, sight);
    }
    Ok(Answer::report(store, window, report))
}

/// The cgroup path of the container `name` (see
/// [`crate::process::container::Container::is_named`]) among those seen
/// within the retention.
fn container_cgroup(store: &Snapshot, name: &str) -> Result<String, Refusal> {
    let mut found: Vec<String> = store
        .all()
        .flat_map(|s| {
            let named = s.containers.values().filter(|c| c.is_named(name));
            named.map(|c| c.cgroup.clone()).collect::<Vec<_>>()
        })
        .collect();
    found.sort();
    found.dedup();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] if name.len() < 12 && !name.contains('/') => Err(Refusal::Bad(
            "container",
            format!("expected a container id (at least 12 hex digits) or namespace/pod/container, got `{name}`"),
        )),
        [] => Err(Refusal::NotFound(format!(
            "no container `{name}` seen in the last {} min",
            store.retention().as_secs() / 60
        ))),
        _ => Err(Refusal::Bad(
            "container",
            format!("`{name}` names {} containers: give more of the id", found.len()),
        )),
    }
}
