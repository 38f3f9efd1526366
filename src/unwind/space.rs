//! The row array's space: free ranges (first fit), and, when a table does
//! not fit, which loaded tables to evict to make a contiguous room.

use std::ops::{Add, Sub};

/// Free ranges of the row array: first fit, neighbours merged on release.
#[derive(Debug)]
pub(super) struct RowSpace {
    /// (start, len), sorted by start.
    pub free: Vec<(u32, u32)>,
}

impl RowSpace {
    pub fn new(capacity: u32) -> RowSpace {
        RowSpace {
            free: vec![(0, capacity)],
        }
    }

    pub fn allocate(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    pub fn release(&mut self, start: u32, len: u32) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge neighbours.
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.free.len());
        for &(s, l) in &self.free {
            match merged.last_mut() {
                Some((ps, pl)) if *ps + *pl == s => *pl += l,
                _ => merged.push((s, l)),
            }
        }
        self.free = merged;
    }
}

/// What evicting a table costs, compared in order: whether it is the
/// asking users' own (other users' excess goes first, see
/// [`super::fair`]), whether it is some process's main executable or
/// runtime library, the processes that lose it, whether they ran lately,
/// its rows (rebuilding it later).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Cost {
    pub own: u64,
    pub vital: u64,
    pub users: u64,
    pub active: u64,
    pub rows: u64,
}

impl Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            own: self.own + o.own,
            vital: self.vital + o.vital,
            users: self.users + o.users,
            active: self.active + o.active,
            rows: self.rows + o.rows,
        }
    }
}

impl Sub for Cost {
    type Output = Cost;
    fn sub(self, o: Cost) -> Cost {
        Cost {
            own: self.own - o.own,
            vital: self.vital - o.vital,
            users: self.users - o.users,
            active: self.active - o.active,
            rows: self.rows - o.rows,
        }
    }
}

/// A loaded table as the eviction search sees it: where it is, and what
/// evicting it costs (`None`: it may not be evicted for this table).
pub(super) struct Placed<K> {
    pub start: u32,
    pub len: u32,
    pub key: K,
    pub cost: Option<Cost>,
}

/// The cheapest run of adjacent stretches of the array, each free or a
/// table that may be evicted, with room for `len` rows: the tables to
/// evict (empty when a free range is large enough). `None` when no such
/// run exists, so that nothing is evicted in vain.
pub(super) fn cheapest_room<K: Copy>(
    free: &[(u32, u32)],
    tables: &[Placed<K>],
    len: u32,
) -> Option<Vec<K>> {
    // Stretches sorted by start: (start, len, Some(cost) if usable, key).
    let mut parts: Vec<(u32, u32, Option<Cost>, Option<K>)> = free
        .iter()
        .map(|&(s, l)| (s, l, Some(Cost::default()), None))
        .chain(tables.iter().map(|t| (t.start, t.len, t.cost, Some(t.key))))
        .collect();
    parts.sort_by_key(|p| p.0);
    let mut best: Option<(Cost, usize, usize)> = None;
    let (mut from, mut rows, mut cost) = (0, 0u64, Cost::default());
    for to in 0..parts.len() {
        let (start, l, c, _) = parts[to];
        let gap = to > 0 && {
            let (ps, pl, ..) = parts[to - 1];
            ps + pl != start
        };
        if gap {
            (from, rows, cost) = (to, 0, Cost::default());
        }
        let Some(c) = c else {
            // A table that must stay: start again after it.
            (from, rows, cost) = (to + 1, 0, Cost::default());
            continue;
        };
        rows += u64::from(l);
        cost = cost + c;
        // Record the window, then try it without its first stretch.
        while rows >= u64::from(len) && from <= to {
            if best.is_none_or(|b| cost < b.0) {
                best = Some((cost, from, to));
            }
            let (_, fl, fc, _) = parts[from];
            rows -= u64::from(fl);
            cost = cost - fc.unwrap_or_default();
            from += 1;
        }
    }
    let (_, from, to) = best?;
    Some(parts[from..=to].iter().filter_map(|p| p.3).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_space_reuses_released_ranges_and_merges_them() {
        let mut space = RowSpace::new(100);
        assert_eq!(space.allocate(40), Some(0));
        assert_eq!(space.allocate(40), Some(40));
        assert_eq!(space.allocate(30), None, "20 rows left");
        space.release(0, 40);
        assert_eq!(space.allocate(30), Some(0), "first fit");
        space.release(0, 30);
        space.release(40, 40);
        assert_eq!(space.free, vec![(0, 100)], "merged back into one range");
        assert_eq!(space.allocate(100), Some(0));
        assert_eq!(space.allocate(1), None);
    }

    fn cost(users: u64) -> Option<Cost> {
        Some(Cost {
            users,
            rows: 10,
            ..Cost::default()
        })
    }

    fn table(key: u32, start: u32, len: u32, cost: Option<Cost>) -> Placed<u32> {
        Placed {
            start,
            len,
            key,
            cost,
        }
    }

    #[test]
    fn room_is_made_by_evicting_the_least_used_neighbours() {
        // [0,10) a (1 user) [10,20) b (50 users) [20,30) free [30,40) c (1 user)
        let free = [(20, 10)];
        let tables = [
            table(1, 0, 10, cost(1)),
            table(2, 10, 10, cost(50)),
            table(3, 30, 10, cost(1)),
        ];
        assert_eq!(cheapest_room(&free, &tables, 10), Some(vec![]));
        // 20 rows: free + c beats a + b.
        assert_eq!(cheapest_room(&free, &tables, 20), Some(vec![3]));
        // 30 rows: b must go (with a, or with the free range and c).
        let picked = cheapest_room(&free, &tables, 30).unwrap();
        assert!(picked.contains(&2), "{picked:?}");
        assert_eq!(cheapest_room(&free, &tables, 50), None);
    }

    #[test]
    fn other_users_excess_goes_before_own_tables_and_main_binaries_last() {
        let of = |own, vital, users| {
            Some(Cost {
                own,
                vital,
                users,
                active: 1,
                rows: 10,
            })
        };
        // [0,10) the asker's own plugin, [10,20) another user's program
        // over its share, [20,30) its idle library, [30,40) a free range.
        let free = [(30, 10)];
        let tables = [
            table(1, 0, 10, of(1, 0, 1)),
            table(2, 10, 10, of(0, 1, 1)),
            table(3, 20, 10, of(0, 0, 5)),
        ];
        // 20 rows: the excess library, however many processes map it.
        assert_eq!(cheapest_room(&free, &tables, 20), Some(vec![3]));
        // 30 rows: the excess program rather than the asker's own plugin.
        assert_eq!(cheapest_room(&free, &tables, 30), Some(vec![2, 3]));
        // A main binary (one process) goes after a library nine map.
        let free = [(10, 10)];
        let tables = [
            table(1, 0, 10, of(0, 1, 1)),
            table(2, 20, 10, of(0, 0, 9)),
            table(3, 30, 10, of(0, 0, 9)),
        ];
        assert_eq!(cheapest_room(&free, &tables, 20), Some(vec![2]));
    }

    #[test]
    fn tables_that_must_stay_split_the_array() {
        // glibc in the middle may not go: 15 rows fit on neither side.
        let free = [(0, 10)];
        let tables = [table(1, 10, 10, None), table(2, 20, 10, cost(1))];
        assert_eq!(cheapest_room(&free, &tables, 15), None);
        assert_eq!(cheapest_room(&free, &tables, 10), Some(vec![]));
        let tables = [table(1, 10, 10, None), table(2, 20, 20, cost(1))];
        assert_eq!(cheapest_room(&free, &tables, 15), Some(vec![2]));
    }
}
