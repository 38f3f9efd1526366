//! Time Python threads spent waiting for the GIL: their futex waits whose
//! stack the walk marked `[GIL]` (the futex word lay in the interpreter's
//! GIL), per thread.
//!
//! Stack rows of short waits are drawn, each standing for the time of
//! those left out, so their sums are estimates; a thread's futex total is
//! exact. The GIL's part of the rows, applied to that total, keeps the
//! answer within it.

use std::collections::HashMap;

use crate::{
    profile::model::state::State,
    profile::{model::store::Snapshot, model::window::Window, model::GIL_FRAME},
};

/// Of each thread of `pid` that waited for the GIL in `window`, the part
/// of its futex rows' time that was such waits (0..=1).
pub fn share_by_thread(store: &Snapshot, window: Window, pid: u32) -> HashMap<u32, f64> {
    let mut ns: HashMap<u32, (u64, u64)> = HashMap::new();
    for slice in store.within(window) {
        for s in slice
            .samples
            .iter()
            .filter(|s| s.pid == pid && s.state == State::Futex)
        {
            let (gil, all) = ns.entry(s.tid).or_default();
            if s.stack.iter().any(|f| &**f == GIL_FRAME) {
                *gil += s.ns;
            }
            *all += s.ns;
        }
    }
    ns.into_iter()
        .filter(|&(_, (gil, all))| gil > 0 && all > 0)
        .map(|(tid, (gil, all))| (tid, gil as f64 / all as f64))
        .collect()
}
