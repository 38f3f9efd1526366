//! Bounds on the size of a folded answer and on what building it holds. A
//! whole-host query over a long window can fold to hundreds of thousands
//! of stacks (tens of MB of text that no browser or flame graph can show),
//! and one process can make every sample a new stack of huge frames; past
//! the bounds the lightest stacks are merged, per process, into one
//! `[truncated: N smaller stacks]` frame, so widths and totals stay right
//! and nothing is dropped silently.

/// How much of a folded answer is kept, and what building it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Distinct stacks kept, heaviest first.
    pub stacks: usize,
    /// Bytes of folded text those stacks take.
    pub bytes: usize,
    /// Bytes of one folded line: past it, middle frames are elided
    /// ([`super::elide`]).
    pub line_bytes: usize,
    /// Bytes the fold by stack identity may hold (its table and the names
    /// it makes) before the rest of the rows merge into `[truncated]`.
    pub table_bytes: usize,
    /// Frames in all kept lines: what a flame graph draws from (inferno
    /// holds a few dozen bytes per frame, and the SVG a rectangle).
    pub frames: usize,
}

impl Limits {
    /// The API's bounds: 20,000 stacks and 8 MiB of folded text (plus one
    /// `[truncated]` line per process that lost stacks), lines of 32 KiB,
    /// 8 MiB of fold table (some 100,000 distinct stacks, five times
    /// the lines kept).
    pub const API: Limits = Limits {
        stacks: 20_000,
        bytes: 8 << 20,
        line_bytes: 32 << 10,
        table_bytes: 8 << 20,
        frames: usize::MAX,
    };

    /// The API's bounds for an SVG flame graph: those of [`Limits::API`]
    /// and 250,000 frames (8 MiB of one-letter frames would be 4 million).
    pub const GRAPH: Limits = Limits {
        frames: 250_000,
        ..Limits::API
    };

    /// No bounds: the command line's own recordings.
    pub const NONE: Limits = Limits {
        stacks: usize::MAX,
        bytes: usize::MAX,
        line_bytes: usize::MAX,
        table_bytes: usize::MAX,
        frames: usize::MAX,
    };

    /// What one query within these limits holds at most: its fold table,
    /// the kept lines, and the answer's text rendered from them (each line
    /// costs its bytes plus [`LINE_EXTRA`] in both).
    pub const fn memory(&self) -> usize {
        self.table_bytes
            .saturating_add(self.bytes)
            .saturating_add(self.bytes)
    }
}

/// What the bounds merged away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Truncation {
    /// Stacks merged into `[truncated]` frames.
    pub stacks: usize,
    /// Their time.
    pub ns: u64,
    /// Of those, rows merged unseen because the fold table was full
    /// ([`Limits::table_bytes`]): not necessarily the lightest.
    pub over_budget: usize,
    /// Kept lines whose middle frames were elided.
    pub elided_lines: usize,
}

/// Upper bound of a folded line's bytes beyond its stack: a space, the
/// value (at most 20 digits) and the newline.
pub const LINE_EXTRA: usize = 22;

/// How many lines, heaviest first, fit `limits` given each one's bytes
/// (without [`LINE_EXTRA`]) and frames: they stop at the first one that
/// does not.
pub fn kept(lines: impl Iterator<Item = (usize, usize)>, limits: Limits) -> usize {
    let (mut n, mut used, mut frames) = (0usize, 0usize, 0usize);
    for (len, f) in lines {
        let line = len.saturating_add(LINE_EXTRA);
        let over =
            used.saturating_add(line) > limits.bytes || frames.saturating_add(f) > limits.frames;
        if n >= limits.stacks || over {
            break;
        }
        (used, frames) = (used + line, frames + f);
        n += 1;
    }
    n
}

/// The frame under a process that carries the time of its `n` merged
/// stacks: `[truncated: N smaller stacks]`, or `[truncated: N stacks]`
/// when some were merged unseen (over the fold's budget).
pub fn merged_frame(n: usize, over_budget: bool) -> String {
    match over_budget {
        false => format!("[truncated: {n} smaller stacks]"),
        true => format!("[truncated: {n} stacks]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_stop_at_the_first_that_does_not_fit() {
        let limits = Limits {
            stacks: 100,
            bytes: 2 * (5 + LINE_EXTRA),
            ..Limits::API
        };
        let lines = |lens: [usize; 3]| lens.into_iter().map(|l| (l, 1));
        assert_eq!(kept(lines([5, 205, 5]), limits), 1, "not the short third");
        assert_eq!(kept(lines([5, 5, 5]), limits), 2);
        let frames = Limits {
            frames: 10,
            ..Limits::API
        };
        assert_eq!(kept([(1, 4), (1, 4), (1, 4)].into_iter(), frames), 2);
        let two = Limits {
            stacks: 2,
            ..Limits::API
        };
        assert_eq!(kept([(1, 1); 5].into_iter(), two), 2);
        assert_eq!(kept([(1, 1); 5].into_iter(), Limits::NONE), 5);
    }

    #[test]
    fn the_api_bounds_hold_a_fixed_memory() {
        assert_eq!(Limits::API.memory(), 24 << 20);
        assert_eq!(Limits::NONE.memory(), usize::MAX);
        assert_eq!(merged_frame(3, false), "[truncated: 3 smaller stacks]");
    }
}
