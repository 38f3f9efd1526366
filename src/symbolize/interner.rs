//! Frame names, interned: equal names share one allocation. Names come
//! from files other users write (ELF symbols, perf maps), so each is cut
//! to [`MAX_FRAME_BYTES`], and the set is pruned of names that nothing
//! else holds any more (the store drops slices as they age out).

use std::{borrow::Cow, sync::Arc};

use rustc_hash::FxHashSet;

use crate::profile::Frame;

/// Longest frame name kept; longer ones are cut and end in `…`. Demangled
/// C++ templates can run to a few KiB; 2 KiB keeps them recognisable.
pub const MAX_FRAME_BYTES: usize = 2048;

/// The interned names and the bytes they hold.
#[derive(Default)]
pub struct Interner {
    set: FxHashSet<Frame>,
    bytes: usize,
}

impl Interner {
    /// The shared copy of `name`, made safe for folded output and cut to
    /// [`MAX_FRAME_BYTES`].
    pub fn get(&mut self, name: &str) -> Frame {
        let name = clean(name);
        if let Some(f) = self.set.get(name.as_ref()) {
            return f.clone();
        }
        let f: Frame = Arc::from(name.as_ref());
        self.bytes += f.len();
        self.set.insert(f.clone());
        f
    }

    /// Drops the names only the interner holds.
    pub fn prune(&mut self) {
        self.set.retain(|f| Arc::strong_count(f) > 1);
        self.bytes = self.set.iter().map(|f| f.len()).sum();
    }

    /// Bytes of names held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `name` without what would break folded stacks (`;` between frames, one
/// stack a line) and cut to [`MAX_FRAME_BYTES`] on a character boundary.
pub fn clean(name: &str) -> Cow<'_, str> {
    let needs_cut = name.len() > MAX_FRAME_BYTES;
    if !needs_cut && !name.contains([';', '\n', '\r']) {
        return Cow::Borrowed(name);
    }
    let mut end = if needs_cut {
        MAX_FRAME_BYTES - '…'.len_utf8()
    } else {
        name.len()
    };
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = name[..end].replace(';', ":").replace(['\n', '\r'], " ");
    if needs_cut {
        out.push('…');
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_cut_and_pruned() {
        let mut names = Interner::default();
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
        assert_eq!(names.bytes(), a.len() + cut.len());
        drop(cut);
        names.prune();
        assert_eq!(names.bytes(), a.len(), "only `a` is still held");
        assert!(Arc::ptr_eq(&a, &names.get("a:b c")));
    }
}
