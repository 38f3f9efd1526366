//! I/O and downstream waits: the process's threads blocked on a socket,
//! a file, a pipe or a device, by the syscall, what it waits on and the
//! application frame it waits from.

use std::collections::{BTreeSet, HashMap};

use serde_json::json;

use super::{
    pct, secs, share_of_threads, strongest, threads,
    waits::{self, WaitClass},
    Ctx, Finding, Kind, Place,
};
use crate::profile::model::state::State;

/// Below this share of the waiting threads' wall time, I/O waits are not
/// a finding.
const MIN_WAIT_SHARE: f64 = 0.1;
/// Places listed.
const LISTED: usize = 3;

pub fn find(ctx: &Ctx) -> Vec<Finding> {
    let seen = ctx.seen;
    let mut places: HashMap<(State, Place), (u64, BTreeSet<u32>)> = HashMap::new();
    for r in &seen.rows {
        let class = waits::classify(r.state, &r.stack);
        if let WaitClass::Io(_) = class {
            let place = places
                .entry((r.state, Place::of(class, &r.stack)))
                .or_default();
            place.0 += r.ns;
            place.1.insert(r.tid);
        }
    }
    let found: Vec<Finding> = places
        .into_iter()
        .filter_map(|((state, place), (ns, tids))| {
            let share = share_of_threads(seen, &tids, ns);
            (share >= MIN_WAIT_SHARE).then(|| {
                Finding::new(
                    Kind::IoWait,
                    ns / 1000,
                    format!(
                        "{} waited {} in {} ({} of their wall time)",
                        threads(tids.len()),
                        secs(ns / 1000),
                        place.describe(),
                        pct(share)
                    ),
                    json!({
                        "wait": place.to_json(),
                        "state": state.name(),
                        "threads": tids.len(),
                        "tids": tids,
                        "wait_us": ns / 1000,
                        "wait_share": share,
                    }),
                    ctx.link("/folded", &format!("&kind={}", state.name())),
                )
            })
        })
        .collect();
    strongest(found, LISTED)
}
