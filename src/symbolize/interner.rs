//! Frame names, interned: equal names share one allocation. Names come
//! from files other users write (ELF symbols, perf maps), so each is cut
//! to [`MAX_FRAME_BYTES`], and the set is pruned of names that nothing
//! else holds any more (the store drops slices as they age out).
//!
//! Every name is counted when it is inserted, against the whole set's
//! bound ([`max_bytes`]) and against the share of the process that brought
//! it ([`share_bytes`]) and of its user ([`user_share_bytes`], so that many
//! processes of one user cannot fill the set together): a process past a
//! share gets [`OVER_BUDGET`] for its new names (counted,
//! `names`/`budget`), so it can degrade only its own (and its user's)
//! frames until the store lets go of their old ones.

use std::{borrow::Cow, sync::Arc};

use rustc_hash::FxHashMap;

use crate::{
    process::ProcessTable,
    profile::model::Frame,
    untrusted::{
        refusals::{self, Reason, What},
        text::clean_to,
    },
};

/// Longest frame name kept; longer ones are cut and end in `…`. Demangled
/// C++ templates can run to a few KiB; 2 KiB keeps them recognisable.
pub const MAX_FRAME_BYTES: usize = 2048;
/// Bytes of names the interner ever holds: three fifths of the budget's
/// `names` part (the address caches that hand them out take the rest).
pub fn max_bytes() -> usize {
    crate::budget::bytes(crate::budget::Part::Names) / 5 * 3
}
/// Bytes of names one process may have brought among those held.
pub fn share_bytes() -> usize {
    max_bytes() / 8
}
/// Bytes of names all processes of one user may have brought among those
/// held: four users' worth fill the set, root's processes being one user.
pub fn user_share_bytes() -> usize {
    max_bytes() / 4
}
/// The user names are charged to when a process's user cannot be read
/// (it has exited).
const UNKNOWN_USER: u32 = u32::MAX;
/// The frame a name refused for want of room becomes.
pub const OVER_BUDGET: &str = "[names over budget]";

/// The interned names, which process brought each, and the bytes held.
pub struct Interner {
    /// Each name with the pid that brought it (0: the daemon's own).
    /// Names are what processes wrote (symbols, perf maps): a seeded hash,
    /// since Fx collisions can be computed ahead and the shares bound the
    /// bytes of a process's names, not how many collide.
    names: hashbrown::HashMap<Frame, u32>,
    bytes: usize,
    by_pid: FxHashMap<u32, usize>,
    by_user: FxHashMap<u32, usize>,
    /// Each charged process's effective user, read once per prune round
    /// (a pid reused meanwhile is charged to the old user until then).
    users: FxHashMap<u32, u32>,
    /// A process's effective user (the process table's; tests give
    /// their own).
    read_user: Box<dyn Fn(u32) -> Option<u32> + Send>,
    over_budget: Frame,
    /// A name was refused because the whole set was full.
    full: bool,
}

impl Interner {
    /// An empty interner charging names to the users `table` tells.
    pub fn new(table: Arc<ProcessTable>) -> Self {
        let over_budget: Frame = Arc::from(OVER_BUDGET);
        let mut names = hashbrown::HashMap::default();
        names.insert(over_budget.clone(), 0);
        Interner {
            names,
            bytes: over_budget.len(),
            by_pid: FxHashMap::default(),
            by_user: FxHashMap::default(),
            users: FxHashMap::default(),
            read_user: Box::new(move |pid| table.user_of(pid)),
            over_budget,
            full: false,
        }
    }

    /// The shared copy of `name`, for no process in particular (fixed
    /// markers, kernel symbols, JVM method names): counted against the
    /// whole bound only ([`OVER_BUDGET`] once that is full).
    pub fn get(&mut self, name: &str) -> Frame {
        self.insert(0, name).unwrap_or_else(|f| f)
    }

    /// The shared copy of `name`, made safe for folded output and cut to
    /// [`MAX_FRAME_BYTES`], for process `pid`: [`OVER_BUDGET`] when it is
    /// new and there is no room for it (in `pid`'s share or at all).
    pub fn get_for(&mut self, pid: u32, name: &str) -> Frame {
        self.try_get_for(pid, name).unwrap_or_else(|f| f)
    }

    /// As [`Interner::get_for`], but `Err(OVER_BUDGET)` when refused, so
    /// that callers caching across processes do not keep the refusal.
    pub fn try_get_for(&mut self, pid: u32, name: &str) -> Result<Frame, Frame> {
        self.insert(pid, name)
    }

    fn insert(&mut self, pid: u32, name: &str) -> Result<Frame, Frame> {
        let name = clean(name);
        if let Some((f, _)) = self.names.get_key_value(name.as_ref()) {
            return Ok(f.clone());
        }
        let len = name.len();
        let room = self.bytes + len <= max_bytes();
        let over_share = pid != 0 && {
            let user = self.user_of(pid);
            self.by_pid.get(&pid).copied().unwrap_or(0) + len > share_bytes()
                || self.by_user.get(&user).copied().unwrap_or(0) + len > user_share_bytes()
        };
        if !room || over_share {
            self.full |= !room;
            refusals::count_for(What::Names, Reason::Budget, pid);
            return Err(self.over_budget.clone());
        }
        if pid != 0 {
            self.charge(pid, len);
        }
        let f: Frame = Arc::from(name.as_ref());
        self.bytes += len;
        self.names.insert(f.clone(), pid);
        Ok(f)
    }

    /// `pid`'s effective user, read once per prune round.
    fn user_of(&mut self, pid: u32) -> u32 {
        let read = &self.read_user;
        *self
            .users
            .entry(pid)
            .or_insert_with(|| read(pid).unwrap_or(UNKNOWN_USER))
    }

    fn charge(&mut self, pid: u32, len: usize) {
        let user = self.user_of(pid);
        *self.by_pid.entry(pid).or_default() += len;
        *self.by_user.entry(user).or_default() += len;
    }

    /// Drops the names only the interner holds; what each process and
    /// user brought is counted again from those kept.
    pub fn prune(&mut self) {
        self.names.retain(|f, _| Arc::strong_count(f) > 1);
        self.bytes = self.names.keys().map(|f| f.len()).sum();
        let kept: Vec<(u32, usize)> = self
            .names
            .iter()
            .filter(|(_, pid)| **pid != 0)
            .map(|(f, pid)| (*pid, f.len()))
            .collect();
        let users = std::mem::take(&mut self.users);
        self.by_pid.clear();
        self.by_user.clear();
        for (pid, len) in kept {
            // Users of processes still holding names are kept: reading
            // them again would charge a pid reused since to its new user.
            if let Some(&user) = users.get(&pid) {
                self.users.insert(pid, user);
            }
            self.charge(pid, len);
        }
        self.full = false;
    }

    /// Bytes of names held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a name was refused because the whole set was full since the
    /// last [`Interner::prune`].
    pub fn full(&self) -> bool {
        self.full
    }

    /// Bytes of names held that `pid` brought.
    #[cfg(test)]
    pub fn bytes_of(&self, pid: u32) -> usize {
        self.by_pid.get(&pid).copied().unwrap_or(0)
    }
}

/// `name` without what would break folded stacks (`;` between frames, one
/// stack a line) and cut to [`MAX_FRAME_BYTES`] on a character boundary.
pub fn clean(name: &str) -> Cow<'_, str> {
    clean_to(name, MAX_FRAME_BYTES)
}

impl crate::runtime::FrameNames for Interner {
    fn get(&mut self, name: &str) -> Frame {
        Interner::get(self, name)
    }

    fn get_for(&mut self, pid: u32, name: &str) -> Frame {
        Interner::get_for(self, pid, name)
    }

    fn try_get_for(&mut self, pid: u32, name: &str) -> Result<Frame, Frame> {
        Interner::try_get_for(self, pid, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interner where process `pid` is user `pid / 100`.
    fn interner() -> Interner {
        Interner {
            read_user: Box::new(|pid| Some(pid / 100)),
            ..Interner::new(Arc::default())
        }
    }

    #[test]
    fn names_are_cleaned_cut_and_pruned() {
        let mut names = Interner::new(Arc::default());
        let base = names.bytes();
        let a = names.get("a;b\nc");
        assert_eq!(&*a, "a:b c");
        assert!(Arc::ptr_eq(&a, &names.get("a;b\nc")));
        let long = "é".repeat(MAX_FRAME_BYTES);
        let cut = names.get(&long);
        assert!(
            cut.len() <= MAX_FRAME_BYTES && cut.ends_with('…'),
            "{}",
            cut.len()
        );
        assert_eq!(names.bytes(), base + a.len() + cut.len());
        drop(cut);
        names.prune();
        assert_eq!(names.bytes(), base + a.len(), "only `a` is still held");
        assert!(Arc::ptr_eq(&a, &names.get("a:b c")));
    }

    #[test]
    fn a_process_past_its_share_gets_the_marker_until_its_names_go() {
        let before = refusals::get(What::Names, Reason::Budget);
        let mut names = interner();
        let name = |i: usize| format!("{i:0>2000}");
        let mut held = Vec::new();
        let mut i = 0;
        while held.len() < share_bytes() / 2000 {
            held.push(names.get_for(7, &name(i)));
            i += 1;
        }
        assert!(names.bytes_of(7) <= share_bytes());
        let refused = names.try_get_for(7, &name(i));
        assert_eq!(refused.as_deref().map_err(|f| &**f), Err(OVER_BUDGET));
        assert!(refusals::get(What::Names, Reason::Budget) > before);
        assert!(Arc::ptr_eq(&held[0], &names.get_for(7, &name(0))), "known");
        let other = names.get_for(8, &name(i));
        assert_eq!(&*other, name(i), "another process is not affected");
        held.clear();
        names.prune();
        assert_eq!(&*names.get_for(7, &name(i + 1)), name(i + 1), "room again");
    }

    #[test]
    fn the_whole_bound_holds_whatever_the_processes() {
        let mut names = interner();
        let mut held = Vec::new();
        let per_pid = share_bytes() / 2000;
        for i in 0..(max_bytes() / 2000 + 10) {
            let pid = (i / per_pid) as u32 * 100 + 1;
            held.push(names.get_for(pid, &format!("{i:0>2000}")));
            assert!(names.bytes() <= max_bytes());
        }
        assert!(names.full());
        assert_eq!(
            &*names.get(&"k".repeat(2000)),
            OVER_BUDGET,
            "kernel names too"
        );
        assert_eq!(&*held.pop().unwrap(), OVER_BUDGET);
        held.clear();
        names.prune();
        assert!(!names.full() && names.bytes() < 100);
    }

    #[test]
    fn many_processes_of_one_user_fill_only_that_users_share() {
        let mut names = interner();
        let mut held = Vec::new();
        let per_pid = share_bytes() / 2000;
        // Eight processes of user 5, each up to its own share: together
        // they stop at the user's share.
        for i in 0..8 * per_pid {
            let pid = 500 + (i / per_pid) as u32;
            let f = names.get_for(pid, &format!("{i:0>2000}"));
            if &*f != OVER_BUDGET {
                held.push(f);
            }
        }
        let of_user: usize = (500..508).map(|pid| names.bytes_of(pid)).sum();
        assert!(of_user <= user_share_bytes(), "{of_user}");
        assert!(of_user + 2000 > user_share_bytes(), "{of_user}");
        let other = names.get_for(601, &"x".repeat(2000));
        assert_ne!(&*other, OVER_BUDGET, "another user is not affected");
        drop(other);
        // Pruning keeps the charge of the names still held.
        names.prune();
        assert_eq!(&*names.get_for(509, &"y".repeat(2000)), OVER_BUDGET);
    }

    #[test]
    fn control_characters_and_semicolons_go_and_cuts_hold() {
        assert_eq!(clean_to("a;b\tc\u{1b}[1m", 64), "a:b c [1m");
        let cut = clean_to("abcdefghij", 8);
        assert_eq!(cut, "abcde…");
        assert!(cut.len() <= 8);
    }
}
