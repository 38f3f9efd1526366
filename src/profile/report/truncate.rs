//! Bounds on the size of a folded answer. A whole-host query over a long
//! window can fold to hundreds of thousands of stacks (tens of MB of text
//! that no browser or flame graph can show); past the bounds the lightest
//! stacks are merged, per process, into one `[truncated: N smaller stacks]`
//! frame, so widths and totals stay right and nothing is dropped silently.

use std::collections::BTreeMap;

use super::query::Folded;

/// How much of a folded answer is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Distinct stacks kept, heaviest first.
    pub stacks: usize,
    /// Bytes of folded text those stacks take.
    pub bytes: usize,
}

impl Limits {
    /// The API's bounds: 20,000 stacks and 8 MiB of folded text (plus one
    /// `[truncated]` line per process that lost stacks).
    pub const API: Limits = Limits {
        stacks: 20_000,
        bytes: 8 << 20,
    };
}

/// What [`truncate`] merged away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Truncation {
    /// Stacks merged into `[truncated]` frames.
    pub stacks: usize,
    /// Their time.
    pub ns: u64,
}

/// Upper bound of a folded line's bytes beyond its stack: a space, the
/// value (at most 20 digits) and the newline.
const LINE_EXTRA: usize = 22;

/// Keeps the heaviest stacks of `folded` within `limits`; the others (all
/// of them lighter than any kept one) are summed per root frame (the
/// process) into `ROOT;[truncated: N smaller stacks]`. `None` when all fit.
pub fn truncate(folded: &mut Folded, limits: Limits) -> Option<Truncation> {
    let line = |stack: &str| stack.len() + LINE_EXTRA;
    let bytes: usize = folded.stacks.keys().map(|s| line(s)).sum();
    if folded.stacks.len() <= limits.stacks && bytes <= limits.bytes {
        return None;
    }
    let mut heaviest: Vec<(String, u64)> = std::mem::take(&mut folded.stacks).into_iter().collect();
    heaviest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let (mut used, mut full) = (0, false);
    let mut cut = Truncation::default();
    // Per root: stacks merged and their time.
    let mut merged: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for (stack, ns) in heaviest {
        full = full || folded.stacks.len() >= limits.stacks || used + line(&stack) > limits.bytes;
        if !full {
            used += line(&stack);
            folded.stacks.insert(stack, ns);
            continue;
        }
        let root = stack.split(';').next().unwrap_or_default();
        let entry = merged.entry(root.to_string()).or_default();
        entry.0 += 1;
        entry.1 += ns;
        cut.stacks += 1;
        cut.ns += ns;
    }
    for (root, (n, ns)) in merged {
        let frame = format!("{root};[truncated: {n} smaller stacks]");
        *folded.stacks.entry(frame).or_default() += ns;
    }
    Some(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(stacks: &[(&str, u64)]) -> Folded {
        Folded {
            stacks: stacks.iter().map(|(s, ns)| (s.to_string(), *ns)).collect(),
            total_ns: stacks.iter().map(|s| s.1).sum(),
            processes: BTreeMap::new(),
        }
    }

    #[test]
    fn within_limits_nothing_changes() {
        let mut f = folded(&[("a;x", 5), ("b;y", 3)]);
        let before = f.clone();
        assert_eq!(truncate(&mut f, Limits::API), None);
        assert_eq!(f, before);
    }

    #[test]
    fn lightest_stacks_merge_per_process_keeping_totals() {
        let mut f = folded(&[
            ("a;big", 100),
            ("a;small1", 2),
            ("a;small2", 1),
            ("b;mid", 50),
            ("b;tiny", 1),
        ]);
        let limits = Limits {
            stacks: 2,
            bytes: usize::MAX,
        };
        let cut = truncate(&mut f, limits).unwrap();
        assert_eq!(cut, Truncation { stacks: 3, ns: 4 });
        assert_eq!(f.stacks["a;big"], 100);
        assert_eq!(f.stacks["b;mid"], 50);
        assert_eq!(f.stacks["a;[truncated: 2 smaller stacks]"], 3);
        assert_eq!(f.stacks["b;[truncated: 1 smaller stacks]"], 1);
        assert_eq!(f.stacks.values().sum::<u64>(), f.total_ns, "no time lost");
    }

    #[test]
    fn byte_limit_stops_at_the_first_stack_that_does_not_fit() {
        let long = format!("a;{}", "f;".repeat(100));
        let mut f = folded(&[("a;one", 10), (&long, 5), ("a;two", 1)]);
        let limits = Limits {
            stacks: 100,
            bytes: 2 * ("a;one".len() + LINE_EXTRA),
        };
        let cut = truncate(&mut f, limits).unwrap();
        assert_eq!(
            cut.stacks, 2,
            "the short `a;two` is lighter than the long one"
        );
        assert_eq!(f.stacks["a;[truncated: 2 smaller stacks]"], 6);
        assert_eq!(f.stacks.len(), 2);
    }
}
