//! Which processes an interval pushes, the same for every sink: the
//! busiest, kernel threads left out, a fair share per user, each with its
//! service name and container; and how their profiles are spread over an
//! interval's requests.

use std::{
    collections::HashMap,
    time::{Instant, SystemTime},
};

use super::service::ServiceNames;
use crate::profile::{
    model::{store::Snapshot, window::Window},
    report::{fair, query, rows::Names},
};

/// Processes pushed per interval by default, busiest (time on or waiting
/// for a CPU, then wall time, in the interval) first, a fair share per
/// user; kernel threads are left out.
pub const DEFAULT_TOP: usize = 32;

/// A process pushed for an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub pid: u32,
    pub service: String,
    /// Its container's labels (none outside a container).
    pub container: Vec<(&'static str, String)>,
}

/// What it takes to choose an interval's processes.
pub struct Chooser {
    /// Processes per interval.
    pub top: usize,
    pub services: ServiceNames,
    /// The user a process runs as, `None` once it exited (the process
    /// table's [`user_of`](crate::process::ProcessTable::user_of); tests
    /// give others).
    pub user_of: Box<dyn FnMut(u32) -> Option<u32> + Send>,
}

impl Chooser {
    /// The processes pushed for `window`: the busiest, kernel threads
    /// left out, a fair share per user, each with its service name.
    pub fn choose(&mut self, store: &Snapshot, window: Window) -> Vec<Chosen> {
        let names = Names::of(store.within(window));
        self.services.forget_ended();
        // The window's start on the monotonic clock the process table keeps.
        let ago = SystemTime::now()
            .duration_since(window.from)
            .unwrap_or_default();
        let since = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        let mut looked_at = Vec::new();
        let mut services = HashMap::new();
        for pid in query::busiest(store, window, fair::MAX_LOOKED_AT) {
            looked_at.push(pid);
            if let Some(service) = self.services.get(pid, names.process(pid), since) {
                services.insert(pid, service);
            }
        }
        let pushable: Vec<u32> = looked_at
            .iter()
            .copied()
            .filter(|pid| services.contains_key(pid))
            .collect();
        fair::top(&pushable, self.top, &mut self.user_of)
            .into_iter()
            .filter_map(|pid| {
                Some(Chosen {
                    pid,
                    service: services.remove(&pid)?,
                    container: names.container(pid).map(|c| c.labels()).unwrap_or_default(),
                })
            })
            .collect()
    }
}

/// Groups the processes' encoded parts (`(part, bytes)`, in order) into
/// requests: `chosen` processes over about `senders` requests, so that
/// they all go out together, each request at most `max_bytes` (a part
/// larger than that goes alone).
pub fn spread<T>(
    parts: impl IntoIterator<Item = (T, usize)>,
    chosen: usize,
    senders: usize,
    max_bytes: usize,
) -> Vec<Vec<T>> {
    let per_request = chosen.div_ceil(senders.max(1)).max(1);
    let mut packs: Vec<(Vec<T>, usize)> = Vec::new();
    for (part, bytes) in parts {
        match packs.last_mut() {
            Some((pack, size)) if pack.len() < per_request && *size + bytes <= max_bytes => {
                pack.push(part);
                *size += bytes;
            }
            _ => packs.push((vec![part], bytes)),
        }
    }
    packs.into_iter().map(|(pack, _)| pack).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_spread_over_the_senders_within_the_bytes() {
        let parts = (0..10).map(|i| (i, 10));
        let packs = spread(parts, 10, 4, 1000);
        assert_eq!(
            packs,
            [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
        );
        // Past the bytes a request ends early; a part too large goes alone.
        let packs = spread([(0, 10), (1, 10), (2, 50), (3, 10)], 4, 1, 30);
        assert_eq!(packs, [vec![0, 1], vec![2], vec![3]]);
        assert!(spread(Vec::<(u8, usize)>::new(), 0, 4, 10).is_empty());
    }
}
