//! `/timeline`: each thread's (or pool's) time by state across a window.

use super::{unknown_pid, Answer, Refusal, Windowed};
use crate::profile::{
    model::{
        store::{Recorded, Snapshot},
        window::Window,
    },
    report::{
        host_facts::HostFacts,
        timeline::{self, Grouping, Timeline},
    },
};

impl Windowed for Timeline {
    fn recorded_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }
}

/// The timeline of `pid`: with no rows for a known process that recorded
/// nothing in `window`, not found for a pid never seen.
pub fn timeline(
    store: &Snapshot,
    host: &dyn HostFacts,
    pid: u32,
    window: Window,
    group: Grouping,
    limit: usize,
) -> Result<Answer<Timeline>, Refusal> {
    let body = match timeline::timeline(store, pid, window, group, limit) {
        Some(t) => t,
        None => match unknown_pid(store, host, pid) {
            Some(unknown) => return Err(Refusal::NotFound(unknown)),
            None => Timeline::empty(pid, window, group),
        },
    };
    Ok(Answer::report(store, window, body))
}
