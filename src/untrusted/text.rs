//! Text that other users control (process, thread and method names),
//! made safe to hold and to print: the daemon's text formats put one
//! stack on a line with `;` between frames.

use std::borrow::Cow;

/// `name` without `;`, newlines or other control characters, cut to `max`
/// bytes (at least 4) on a character boundary, ending in `…` when cut.
pub fn clean_to(name: &str, max: usize) -> Cow<'_, str> {
    let needs_cut = name.len() > max;
    let bad = |c: char| c == ';' || c.is_control();
    if !needs_cut && !name.contains(bad) {
        return Cow::Borrowed(name);
    }
    let mut end = if needs_cut {
        max.saturating_sub('…'.len_utf8())
    } else {
        name.len()
    };
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = name[..end]
        .chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    if needs_cut {
        out.push('…');
    }
    Cow::Owned(out)
}
