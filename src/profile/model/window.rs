//! The time window a query reads: the last N seconds, or an absolute
//! `from`..`until` range, so that two exports of one window are the same
//! data (as long as the store still holds it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A span of time `from..until` a query reads. A slice (a drain interval,
/// or a merged block) inside it counts whole, one its edge falls inside
/// pro rata: windows that tile time never count anything twice, and an
/// answer holds exactly the time asked for (where recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from: SystemTime,
    pub until: SystemTime,
    /// Whether the window was given as `from`/`until` (titles then show
    /// the range, not "last N s").
    pub absolute: bool,
    /// Slices that started before this are left out too (see
    /// [`Window::since`]).
    pub not_before: Option<SystemTime>,
}

/// How much of a slice a window covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    None,
    /// Part of it: cut to the window (see [`super::prorate`]).
    Part,
    Whole,
}

impl Window {
    /// The last `seconds` before `now`.
    pub fn last(seconds: u64, now: SystemTime) -> Window {
        Window {
            from: now
                .checked_sub(Duration::from_secs(seconds))
                .unwrap_or(UNIX_EPOCH),
            until: now,
            absolute: false,
            not_before: None,
        }
    }

    /// `from`..`until`, given as such.
    pub fn between(from: SystemTime, until: SystemTime) -> Window {
        Window {
            from,
            until,
            absolute: true,
            not_before: None,
        }
    }

    /// The window without anything from before `t`: no slice that started
    /// earlier. For a local user's query about their own process, so that
    /// an earlier process with the same pid (someone else's) is not shown.
    pub fn since(self, t: SystemTime) -> Window {
        Window {
            from: self.from.max(t),
            not_before: Some(t),
            ..self
        }
    }

    /// How much of a slice spanning `start..end` the window covers: an
    /// answer holds exactly its window, so a slice its edge falls inside
    /// counts pro rata (see [`super::prorate`]). A slice that started
    /// before [`Window::not_before`] is left out whole.
    pub fn overlap(&self, start: SystemTime, end: SystemTime) -> Overlap {
        if self.not_before.is_some_and(|t| start < t) || end <= self.from || start >= self.until {
            // An instant slice exactly at `until` is the window's.
            if start == end && end == self.until {
                return Overlap::Whole;
            }
            return Overlap::None;
        }
        if start >= self.from && end <= self.until {
            Overlap::Whole
        } else {
            Overlap::Part
        }
    }

    /// The window's length.
    pub fn length(&self) -> Duration {
        self.until.duration_since(self.from).unwrap_or_default()
    }

    /// Its length in whole seconds, rounded up (what reports show).
    pub fn seconds(&self) -> u64 {
        let d = self.length();
        d.as_secs() + u64::from(d.subsec_nanos() > 0)
    }

    /// Words for titles: `last 30 s`, or the range in RFC 3339.
    pub fn describe(&self) -> String {
        if self.absolute {
            format!("{} to {}", rfc3339(self.from), rfc3339(self.until))
        } else {
            format!("last {} s", self.seconds())
        }
    }
}

/// `t` in RFC 3339, UTC, to the second unless it has a fraction.
pub fn rfc3339(t: SystemTime) -> String {
    let precise = t
        .duration_since(UNIX_EPOCH)
        .is_ok_and(|d| d.subsec_nanos() != 0);
    if precise {
        humantime::format_rfc3339_millis(t).to_string()
    } else {
        humantime::format_rfc3339_seconds(t).to_string()
    }
}

/// `t` in RFC 3339, UTC, to the nanosecond: what an answer covers exactly.
pub fn rfc3339_nanos(t: SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// Unix seconds (digits, optional fraction) of `t`, as nanoseconds.
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn windows_take_slices_inside_whole_and_at_their_edges_in_part() {
        let w = Window::between(at(100), at(110));
        let of = |start: u64, end: u64| w.overlap(at(start), at(end));
        assert_eq!(of(99, 100), Overlap::None);
        assert_eq!(of(100, 101), Overlap::Whole);
        assert_eq!(of(109, 110), Overlap::Whole);
        assert_eq!(of(110, 111), Overlap::None);
        assert_eq!(of(95, 105), Overlap::Part);
        assert_eq!(of(105, 115), Overlap::Part);
        assert_eq!(of(90, 120), Overlap::Part);
        assert_eq!(w.seconds(), 10);
        assert_eq!(Window::last(30, at(1000)), {
            let mut l = Window::between(at(970), at(1000));
            l.absolute = false;
            l
        });
        assert_eq!(Window::last(30, at(1000)).describe(), "last 30 s");
        assert_eq!(
            Window::between(at(0), at(60)).describe(),
            "1970-01-01T00:00:00Z to 1970-01-01T00:01:00Z"
        );
    }

    #[test]
    fn since_leaves_out_slices_that_started_earlier() {
        let w = Window::last(60, at(1000)).since(at(990));
        let holds = |start: u64, end: u64| w.overlap(at(start), at(end)) != Overlap::None;
        assert!(!holds(989, 991), "started before, ended after");
        assert!(!holds(980, 985));
        assert!(holds(990, 991) && holds(995, 1000));
        assert_eq!(w.seconds(), 10);
        // Later than the window: nothing.
        let after = Window::last(60, at(1000)).since(at(2000));
        assert_eq!(after.overlap(at(999), at(1000)), Overlap::None);
        assert_eq!(after.seconds(), 0);
    }
}
