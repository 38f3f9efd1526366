//! `/explain`: one process's findings, ranked, or host-wide the processes
//! that lost the most time waiting, each with its top finding.

use std::{collections::HashMap, time::SystemTime};

use super::{unknown_pid, Answer, Refusal, Windowed};
use crate::profile::{
    model::{
        store::{Recorded, Snapshot},
        window::Window,
    },
    report::{
        disclosure::Sight,
        explain::{
            self,
            host::{self, HostExplanation},
            seen::Seen,
            Ctx, Explanation,
        },
        host_facts::HostFacts,
        stuck::WaitFacts,
    },
};

impl Windowed for Explanation {
    fn recorded_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }

    fn note(&self) -> Option<String> {
        self.note.clone()
    }
}

impl Windowed for HostExplanation {
    fn recorded_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }
}

/// What an explanation reads beside the store: the live host, who holds
/// the mutexes blocked threads wait for, the reader, the time, and the
/// daemon's own pid.
pub struct Around<'a> {
    pub host: &'a dyn HostFacts,
    pub facts: &'a WaitFacts,
    pub sight: &'a Sight,
    pub now: SystemTime,
    pub own_pid: u32,
}

fn explain_seen(store: &Snapshot, window: Window, around: &Around, seen: &Seen) -> Explanation {
    explain::explain(&Ctx {
        seen,
        store,
        host: around.host,
        window,
        live: store.live(),
        facts: around.facts,
        sight: around.sight,
        now: around.now,
        own_pid: around.own_pid,
    })
}

/// The findings of `pid` in `window`. A known process that recorded
/// nothing is answered with none and a note; a pid never seen is not
/// found.
pub fn process(
    store: &Snapshot,
    pid: u32,
    window: Window,
    around: &Around,
) -> Result<Answer<Explanation>, Refusal> {
    let report = match Seen::read(store, pid, window) {
        Some(seen) => explain_seen(store, window, around, &seen),
        None => {
            if let Some(unknown) = unknown_pid(store, around.host, pid) {
                return Err(Refusal::NotFound(unknown));
            }
            Explanation {
                pid,
                process: around.host.comm(pid, None).unwrap_or_default(),
                seconds: window.seconds(),
                window: window.describe(),
                recorded: Recorded::default(),
                wall_us: 0,
                waiting_us: 0,
                findings: Vec::new(),
                note: Some(format!(
                    "nothing recorded for pid {pid} in the {}: it started later, or the daemon did",
                    window.describe()
                )),
            }
        }
    };
    Ok(Answer::report_of(store, (window, Some(pid)), report))
}

/// Time each process `sight` may see lost waiting in `window`, by pid:
/// what the host's answer ranks by (see [`host::waiting_by_pid`]).
pub fn ranked(store: &Snapshot, window: Window, sight: &Sight) -> HashMap<u32, u64> {
    let mut ranked = host::waiting_by_pid(store, window);
    ranked.retain(|pid, _| sight.sees(*pid, window.until));
    ranked
}

/// The `limit` processes of `ranked` ([`ranked`]) that lost the most time,
/// each with its top finding.
pub fn host(
    store: &Snapshot,
    window: Window,
    (ranked, limit): (HashMap<u32, u64>, usize),
    around: &Around,
) -> Answer<HostExplanation> {
    let report = host::explain_host(store, window, ranked, limit, |seen| {
        explain_seen(store, window, around, seen)
    });
    Answer::report(store, window, report)
}
