//! A query's memory budget: what building one answer may hold, charged
//! before each allocation, so that rows a process can make without end
//! (a new stack every sample) cost a bounded table, not one copy each.

/// Bytes left to one query's tables.
#[derive(Debug)]
pub struct Budget {
    left: usize,
    exhausted: bool,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        Budget {
            left: bytes,
            exhausted: false,
        }
    }

    /// Takes `bytes` if they are left; once refused, stays exhausted.
    pub fn take(&mut self, bytes: usize) -> bool {
        if self.exhausted || bytes > self.left {
            self.exhausted = true;
            return false;
        }
        self.left -= bytes;
        true
    }

    /// Takes what one more entry costs in a vector or hash table of `len`
    /// entries within `capacity`, `slot` bytes each: nothing while there
    /// is room, the doubled allocation when it must grow.
    pub fn take_entry(&mut self, len: usize, capacity: usize, slot: usize) -> bool {
        if len < capacity {
            return !self.exhausted;
        }
        self.take(capacity.max(4).saturating_mul(2).saturating_mul(slot))
    }

    /// Whether some allocation was refused.
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }
}

/// Bytes of one slot of a hash table of `T` (hashbrown: one control byte
/// per bucket, ~8/7 buckets per entry).
pub const fn table_slot<T>() -> usize {
    (std::mem::size_of::<T>() + 1) * 8 / 7 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_bytes_and_stays_refused() {
        let mut b = Budget::new(100);
        assert!(b.take(60));
        assert!(!b.take(50));
        assert!(b.exhausted());
        assert!(!b.take(1), "exhausted stays exhausted");
    }

    #[test]
    fn entries_cost_only_when_their_table_grows() {
        let mut b = Budget::new(100);
        assert!(b.take_entry(3, 8, 1000), "room left: no allocation");
        assert!(b.take_entry(8, 8, 4), "grows to 16 slots of 4");
        assert!(!b.take_entry(16, 16, 4));
    }
}
