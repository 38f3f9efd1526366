//! Folding a query's rows by stack identity: the store interns stacks, so
//! a row's stack address, with ids of its process, thread, state and leaf
//! frames, names its folded line without writing it. Time is summed per
//! identity in a table charged to the query's [`Budget`]; only the
//! heaviest lines within [`Limits`] are ever rendered, each capped
//! ([`super::elide`]). A process whose every sample is a new stack of huge
//! frames costs a table entry per row, not a copy of its frames.

use std::{cmp::Ordering, collections::BTreeMap, mem::size_of, sync::Arc};

use rustc_hash::FxHashMap;

use super::{
    budget::{table_slot, Budget},
    elide,
    filter::Filter,
    query::Folded,
    rows::{Names, Row, OTHER_PROCESS},
    truncate::{self, Limits, Truncation},
};
use crate::{
    profile::model::{
        kind::{pool_name, state_frame, thread_frame, Group, Kind},
        Frame, Stack,
    },
    untrusted::refusals::{self, Reason, What},
};

/// No word in this place of the line.
const NONE: u32 = u32::MAX;

/// One folded line: its words (root, thread or pool, state, leaf; each an
/// id or [`NONE`]) and its stack's address (0 for an empty stack: empty
/// stacks are not interned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    words: [u32; 4],
    stack: usize,
}

#[derive(Debug)]
struct Entry {
    key: Key,
    stack: Stack,
    ns: u64,
}

/// The distinct words (frames that are not the stack's) of one query.
#[derive(Default)]
struct Words {
    ids: FxHashMap<Arc<str>, u32>,
    list: Vec<Arc<str>>,
}

/// Heap bytes of an `Arc<str>` beyond its text: two counters.
const ARC_HEADER: usize = 2 * size_of::<usize>();

impl Words {
    /// The id of `word`, a new `Arc` made (and charged) only when new.
    fn of(&mut self, word: &str, budget: &mut Budget) -> Option<u32> {
        match self.ids.get(word) {
            Some(id) => Some(*id),
            None if budget.take(word.len() + ARC_HEADER) => self.add(Arc::from(word), budget),
            None => None,
        }
    }

    /// The id of a word the caller holds already (shared, not copied).
    fn of_shared(&mut self, word: &Arc<str>, budget: &mut Budget) -> Option<u32> {
        match self.ids.get(&**word) {
            Some(id) => Some(*id),
            None => self.add(word.clone(), budget),
        }
    }

    fn add(&mut self, word: Arc<str>, budget: &mut Budget) -> Option<u32> {
        let (ids, list) = (self.ids.len(), self.list.len());
        let fits = budget.take_entry(ids, self.ids.capacity(), table_slot::<(Arc<str>, u32)>())
            && budget.take_entry(list, self.list.capacity(), size_of::<Arc<str>>());
        if !fits {
            return None;
        }
        let id = list as u32;
        self.ids.insert(word.clone(), id);
        self.list.push(word);
        Some(id)
    }

    fn get(&self, id: u32) -> Option<&str> {
        self.list.get(id as usize).map(|w| &**w)
    }
}

/// Rows folded by identity, within a budget.
struct Table {
    words: Words,
    index: FxHashMap<Key, u32>,
    entries: Vec<Entry>,
    /// Rows that found the budget spent, per root word ([`NONE`]: their
    /// root did not fit either): how many, and their time.
    over: BTreeMap<u32, (usize, u64)>,
    budget: Budget,
}

impl Table {
    fn new(bytes: usize) -> Table {
        Table {
            words: Words::default(),
            index: FxHashMap::default(),
            entries: Vec::new(),
            over: BTreeMap::new(),
            budget: Budget::new(bytes),
        }
    }

    /// The words of `row`'s line, the root first; `Err` with the root's id
    /// (or [`NONE`]) when the budget is spent.
    fn words(&mut self, row: &Row, names: &Names, filter: &Filter) -> Result<[u32; 4], u32> {
        let b = &mut self.budget;
        let w = &mut self.words;
        let own = row.interrupt.is_none() && !row.is_other_process();
        let root = match (row.interrupt, &row.process) {
            // Not the interrupted thread, nor pid 0's name: the
            // interrupt's kernel path is the whole story.
            (Some(irq), _) => w.of(irq.frame(), b),
            // Nor a hidden process's thread: that it woke, not who.
            _ if !own => w.of(OTHER_PROCESS, b),
            (None, Some(name)) => w.of_shared(name, b),
            (None, None) => w.of(names.process(row.pid), b),
        }
        .ok_or(NONE)?;
        let tid = row.tid;
        let mid = match filter.group {
            _ if !own => None,
            Group::Process => None,
            Group::Thread => Some(thread_frame(names.thread(tid), tid)),
            Group::Pool => Some(pool_name(names.thread(tid))),
        };
        let state = row.state.filter(|_| filter.kind == Kind::Wall);
        let mut words = [root, NONE, NONE, NONE];
        if let Some(mid) = mid {
            words[1] = w.of(&mid, b).ok_or(root)?;
        }
        if let Some(state) = state {
            words[2] = w.of(&state_frame(state), b).ok_or(root)?;
        }
        if let Some(leaf) = &row.leaf {
            words[3] = w.of_shared(leaf, b).ok_or(root)?;
        }
        Ok(words)
    }

    fn add(&mut self, row: &Row, names: &Names, filter: &Filter) {
        let key = match self.words(row, names, filter) {
            Ok(words) => Key {
                words,
                stack: match row.stack.is_empty() {
                    true => 0,
                    false => Arc::as_ptr(&row.stack) as *const Frame as usize,
                },
            },
            Err(root) => return self.overflow(root, row.ns),
        };
        if let Some(&i) = self.index.get(&key) {
            self.entries[i as usize].ns += row.ns;
            return;
        }
        let b = &mut self.budget;
        let n = self.entries.len();
        // An entry later has its line's plan and a place in the order too.
        let entry = size_of::<Entry>() + size_of::<elide::Plan>() + size_of::<usize>();
        let fits = b.take_entry(n, self.index.capacity(), table_slot::<(Key, u32)>())
            && b.take_entry(n, self.entries.capacity(), entry);
        if !fits {
            return self.overflow(key.words[0], row.ns);
        }
        self.index.insert(key, n as u32);
        self.entries.push(Entry {
            key,
            stack: row.stack.clone(),
            ns: row.ns,
        });
    }

    fn overflow(&mut self, root: u32, ns: u64) {
        let o = self.over.entry(root).or_default();
        o.0 += 1;
        o.1 += ns;
    }

    /// The frames of `e`'s line, root first.
    fn frames<'s>(&'s self, e: &'s Entry) -> Vec<&'s str> {
        let word = |i: usize| self.words.get(e.key.words[i]);
        let mut out = Vec::with_capacity(e.stack.len() + 4);
        out.extend((0..3).filter_map(word));
        out.extend(e.stack.iter().map(|f| &**f));
        out.extend(word(3));
        out
    }
}

/// Folds `rows` (see [`super::rows::select`]) into at most `limits`:
/// the heaviest lines, the others merged per root into
/// `ROOT;[truncated: N smaller stacks]`. The truncation is `None` when
/// everything fits whole, lines included. Counts what the bounds refused.
pub fn fold(
    rows: &[Row],
    names: &Names,
    filter: &Filter,
    limits: Limits,
) -> (Folded, Option<Truncation>) {
    let mut table = Table::new(limits.table_bytes);
    let mut out = Folded::default();
    for row in rows.iter().filter(|r| r.ns > 0) {
        table.add(row, names, filter);
        out.total_ns += row.ns;
    }
    let plans: Vec<elide::Plan> = table
        .entries
        .iter()
        .map(|e| elide::plan(&table.frames(e), limits.line_bytes))
        .collect();
    let mut order: Vec<usize> = (0..table.entries.len()).collect();
    let all = truncate::kept(plans.iter().map(|p| (p.len, p.frames())), limits);
    let cut = all < order.len() || !table.over.is_empty();
    if cut {
        order.sort_unstable_by(|&a, &b| heavier(&table, a, b));
    }
    let kept = truncate::kept(
        order.iter().map(|&i| (plans[i].len, plans[i].frames())),
        limits,
    );
    let mut truncation = Truncation::default();
    for &i in &order[..kept] {
        let e = &table.entries[i];
        truncation.elided_lines += usize::from(plans[i].elided > 0);
        let line = elide::render(&table.frames(e), plans[i]);
        *out.stacks.entry(line).or_default() += e.ns;
    }
    // Per root: stacks merged, their time, and how many of them unseen.
    let mut merged: BTreeMap<u32, (usize, u64, usize)> = std::mem::take(&mut table.over)
        .into_iter()
        .map(|(root, (n, ns))| (root, (n, ns, n)))
        .collect();
    for &i in &order[kept..] {
        let e = &table.entries[i];
        let m = merged.entry(e.key.words[0]).or_default();
        m.0 += 1;
        m.1 += e.ns;
    }
    for (root, (n, ns, unseen)) in merged {
        truncation.over_budget += unseen;
        let root = table.words.get(root).unwrap_or("[unknown]");
        let frame = truncate::merged_frame(n, unseen > 0);
        *out.stacks.entry(format!("{root};{frame}")).or_default() += ns;
        truncation.stacks += n;
        truncation.ns += ns;
    }
    count(&truncation, table.budget.exhausted());
    let marked = cut || truncation.elided_lines > 0;
    (out, marked.then_some(truncation))
}

/// Counts the bounds one query hit, once each.
fn count(t: &Truncation, exhausted: bool) {
    let hits = [
        (exhausted, Reason::Budget),
        (t.stacks > t.over_budget, Reason::TooManyEntries),
        (t.elided_lines > 0, Reason::LongLine),
    ];
    for (hit, reason) in hits {
        if hit {
            refusals::count(What::Query, reason);
        }
    }
}

/// Heavier first; equal times in the order of their text (as folded text
/// sorts), compared frame by frame without writing it.
fn heavier(table: &Table, a: usize, b: usize) -> Ordering {
    let (x, y) = (&table.entries[a], &table.entries[b]);
    y.ns.cmp(&x.ns)
        .then_with(|| text_order(&table.frames(x), &table.frames(y)))
}

/// The bytes of `frames` joined with `;`, lazily.
fn joined<'s>(frames: &'s [&'s str]) -> impl Iterator<Item = &'s u8> + 's {
    frames
        .iter()
        .enumerate()
        .flat_map(|(i, f)| b";"[..usize::from(i > 0)].iter().chain(f.as_bytes()))
}

/// The order of two lines' joined text: interned frames equal by address
/// are skipped, and the bytes compared from the first that differs.
fn text_order(a: &[&str], b: &[&str]) -> Ordering {
    let same = |(x, y): (&&str, &&str)| std::ptr::eq(*x, *y) || x == y;
    let skip = a.iter().zip(b).take_while(|p| same(*p)).count();
    joined(&a[skip..]).cmp(joined(&b[skip..]))
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::{profile::model::state::State, profile::model::window::Window};

    fn row(process: &str, frames: &[&str], ns: u64) -> Row {
        Row {
            pid: 1,
            process: Some(Arc::from(process)),
            tid: 0,
            state: Some(State::Cpu),
            interrupt: None,
            stack: frames.iter().map(|f| Arc::<str>::from(*f)).collect(),
            leaf: None,
            ns,
            count: 1,
        }
    }

    fn fold_rows(rows: &[Row], limits: Limits) -> (Folded, Option<Truncation>) {
        let filter = Filter::cpu(None, None, Window::last(30, UNIX_EPOCH));
        fold(rows, &Names::default(), &filter, limits)
    }

    fn stacks(f: &Folded) -> Vec<(&str, u64)> {
        f.stacks.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn equal_lines_sum_and_within_limits_nothing_is_cut() {
        // Two rows of one text (stacks not shared: they merge as text).
        let rows = [
            row("a", &["x"], 5),
            row("a", &["x"], 2),
            row("b", &["y"], 3),
        ];
        let (f, cut) = fold_rows(&rows, Limits::API);
        assert_eq!(cut, None);
        assert_eq!(stacks(&f), [("a;x", 7), ("b;y", 3)]);
        assert_eq!(f.total_ns, 10);
    }

    #[test]
    fn lightest_stacks_merge_per_process_keeping_totals() {
        let rows = [
            row("a", &["big"], 100),
            row("a", &["small1"], 2),
            row("a", &["small2"], 1),
            row("b", &["mid"], 50),
            row("b", &["tiny"], 1),
        ];
        let limits = Limits {
            stacks: 2,
            ..Limits::API
        };
        let (f, cut) = fold_rows(&rows, limits);
        let cut = cut.unwrap();
        assert_eq!((cut.stacks, cut.ns, cut.over_budget), (3, 4, 0));
        assert_eq!(
            stacks(&f),
            [
                ("a;[truncated: 2 smaller stacks]", 3),
                ("a;big", 100),
                ("b;[truncated: 1 smaller stacks]", 1),
                ("b;mid", 50)
            ]
        );
        assert_eq!(f.stacks.values().sum::<u64>(), f.total_ns, "no time lost");
    }

    #[test]
    fn equal_times_keep_the_lines_that_sort_first_as_text() {
        // `a!` sorts before `a;z` as text (`!` < `;`), after it frame by frame.
        let rows = [row("p", &["a", "z"], 1), row("p", &["a!"], 1)];
        let limits = Limits {
            stacks: 1,
            ..Limits::API
        };
        let (f, _) = fold_rows(&rows, limits);
        assert!(f.stacks.contains_key("p;a!"), "{f:?}");
    }

    #[test]
    fn rows_past_the_table_budget_merge_unseen_and_keep_their_time() {
        let rows: Vec<Row> = (0..1000)
            .map(|i| row("a", &[&format!("f{i}")], 1))
            .collect();
        let limits = Limits {
            table_bytes: 4096,
            ..Limits::API
        };
        let (f, cut) = fold_rows(&rows, limits);
        let cut = cut.unwrap();
        assert!(cut.over_budget > 900, "{cut:?}");
        assert!(f.stacks.len() < 100, "{}", f.stacks.len());
        let merged = format!("a;[truncated: {} stacks]", cut.stacks);
        assert_eq!(f.stacks[&merged], cut.ns);
        assert_eq!(f.stacks.values().sum::<u64>(), 1000, "no time lost");
    }

    #[test]
    fn long_lines_are_capped_and_counted() {
        let names: Vec<String> = (0..127)
            .map(|i| format!("{i}{}", "n".repeat(2047)))
            .collect();
        let frames: Vec<&str> = names.iter().map(String::as_str).collect();
        let (f, cut) = fold_rows(&[row("a", &frames, 9)], Limits::API);
        let (line, ns) = f.stacks.iter().next().unwrap();
        assert!(line.len() <= Limits::API.line_bytes, "{}", line.len());
        assert!(line.starts_with("a;0n") && line.contains(" frames];"));
        assert_eq!(*ns, 9);
        let cut = cut.unwrap();
        assert_eq!(
            (cut.elided_lines, cut.stacks),
            (1, 0),
            "elided, nothing merged"
        );
    }

    #[test]
    fn text_order_is_the_joined_text_order() {
        let cases: [(&[&str], &[&str]); 5] = [
            (&["a", "z"], &["a!"]),
            (&["a"], &["a", "b"]),
            (&["ab"], &["a", "b"]),
            (&["x", "y"], &["x", "y"]),
            (&["b"], &["a", "c"]),
        ];
        for (a, b) in cases {
            assert_eq!(
                text_order(a, b),
                a.join(";").cmp(&b.join(";")),
                "{a:?} {b:?}"
            );
        }
    }
}
