//! The slices of a store at one instant, readable without its lock: a
//! query takes one (a reference count per slice, microseconds under the
//! lock) and reads it while the store goes on.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::{
    super::{
        live::LiveView,
        prorate,
        window::{Overlap, Window},
        Slice,
    },
    open_block,
    sealed::Block,
};

/// One held slice as a snapshot sees it.
#[derive(Clone)]
pub(super) struct Entry {
    pub body: Arc<Block>,
    /// Seconds it spans at most (1, 10 or 60).
    pub step_s: u32,
    /// Whether its stack rows were folded into per-pool rows.
    pub folded: bool,
}

impl Entry {
    pub fn start(&self) -> SystemTime {
        self.body.start
    }

    pub fn end(&self) -> SystemTime {
        self.body.end
    }

    /// The slice, decoded.
    pub fn slice(&self) -> Arc<Slice> {
        Arc::new(open_block(&self.body))
    }
}

/// The store's slices, oldest first, and its live view, as of one instant.
#[derive(Clone, Default)]
pub struct Snapshot {
    pub(super) entries: Vec<Entry>,
    retention: Duration,
    live: Arc<LiveView>,
}

impl Snapshot {
    pub(super) fn new(entries: Vec<Entry>, retention: Duration, live: Arc<LiveView>) -> Self {
        Snapshot {
            entries,
            retention,
            live,
        }
    }

    /// What `window` holds, oldest first: each slice inside it whole, a
    /// slice its edge falls inside cut to the window pro rata (see
    /// [`prorate`]).
    pub fn within(&self, window: Window) -> impl Iterator<Item = Arc<Slice>> + '_ {
        self.entries
            .iter()
            .filter_map(move |e| match window.overlap(e.start(), e.end()) {
                Overlap::None => None,
                Overlap::Whole => Some(e.slice()),
                Overlap::Part => Some(Arc::new(prorate::prorated(
                    &e.slice(),
                    window.from,
                    window.until,
                ))),
            })
    }

    /// Every slice the store held.
    pub fn all(&self) -> impl Iterator<Item = Arc<Slice>> + '_ {
        self.entries.iter().map(Entry::slice)
    }

    /// The time span of each slice held, oldest first (no decoding).
    pub fn spans(&self) -> impl Iterator<Item = (SystemTime, SystemTime)> + '_ {
        self.entries.iter().map(|e| (e.start(), e.end()))
    }

    /// How much history the store keeps.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The part of `window` the store holds records of: from the later of
    /// its start and the oldest slice's start to the earlier of its end
    /// and the newest slice's end; `None` when they do not meet.
    pub fn covered(&self, window: Window) -> Option<(SystemTime, SystemTime)> {
        let spans = self
            .entries
            .iter()
            .filter(|e| window.overlap(e.start(), e.end()) != Overlap::None);
        let (mut from, mut until) = (None::<SystemTime>, None::<SystemTime>);
        for e in spans {
            from = Some(from.map_or(e.start(), |f| f.min(e.start())));
            until = Some(until.map_or(e.end(), |u| u.max(e.end())));
        }
        let from = from?.max(window.from);
        let until = until?.min(window.until);
        (from <= until).then_some((from, until))
    }

    /// Whole seconds of `window` the store holds records of (see
    /// [`Self::covered`]), rounded to the nearest.
    pub fn recorded_seconds(&self, window: Window) -> u64 {
        self.covered(window).map_or(0, |(from, until)| {
            until
                .duration_since(from)
                .map_or(0, |d| d.as_secs_f64().round() as u64)
        })
    }

    /// The threads off-CPU at the last drain (empty, without `as_of`,
    /// before the first).
    pub fn live(&self) -> &LiveView {
        &self.live
    }
}
