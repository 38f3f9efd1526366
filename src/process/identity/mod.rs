//! Who a process is, as a reader would look for it: its command line,
//! executable and, for a Java or Python launcher, the program it runs
//! ([`entry`]). Read with its [`super::Facts`], once per image, and made
//! fit to show at once ([`clean`]): every field is the process's own
//! text, bounded to [`MAX_SHOWN`] bytes, escaped, with secret-looking
//! values masked.

pub mod clean;
pub mod entry;

use std::path::Path;

pub use clean::MAX_SHOWN;
pub use entry::{is_class_or_jar_name, EntryKind};

/// A process's identity, cleaned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its arguments joined by spaces ([`clean::command_line`]).
    pub cmdline: Box<str>,
    /// The kernel's text of its `exe` link.
    pub executable: Option<Box<str>>,
    /// What its launcher runs (main class, jar, script, module).
    pub entry: Option<(EntryKind, Box<str>)>,
}

impl Identity {
    /// The identity of a process with command line `raw` (NUL-separated;
    /// `cut` when its read stopped at its bound) and executable `exe`;
    /// `None` when it has neither (a kernel thread).
    pub fn of(raw: &[u8], cut: bool, exe: Option<&Path>) -> Option<Identity> {
        if raw.is_empty() && exe.is_none() {
            return None;
        }
        let entry = entry::of(raw).map(|e| {
            let name = match e.kind {
                // A name that mimics a class needs no cleaning; a path does.
                EntryKind::JavaClass => e.name,
                _ => clean::text(&e.name),
            };
            (e.kind, name.into_boxed_str())
        });
        Some(Identity {
            cmdline: clean::command_line(raw, cut).into_boxed_str(),
            executable: exe.map(|p| clean::text(&p.to_string_lossy()).into_boxed_str()),
            entry,
        })
    }

    /// Bytes it holds, for the process table's and the store's bounds.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Identity>()
            + self.cmdline.len()
            + self.executable.as_ref().map_or(0, |e| e.len())
            + self.entry.as_ref().map_or(0, |(_, n)| n.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_service_and_a_kernel_thread() {
        let raw = b"/usr/bin/python3\0/srv/shop.py\0--password=x\0";
        let id = Identity::of(raw, false, Some(Path::new("/usr/bin/python3.11"))).unwrap();
        assert_eq!(&*id.cmdline, "/usr/bin/python3 /srv/shop.py --password=***");
        assert_eq!(id.executable.as_deref(), Some("/usr/bin/python3.11"));
        assert_eq!(
            id.entry,
            Some((EntryKind::PythonScript, "/srv/shop.py".into()))
        );
        assert!(id.bytes() > id.cmdline.len());
        assert_eq!(Identity::of(b"", false, None), None);
        // A hostile script path is cleaned like the command line.
        let raw = b"python3\0/tmp/\x1b]0;owned\x07.py\0";
        let id = Identity::of(raw, false, None).unwrap();
        let (_, script) = id.entry.unwrap();
        assert_eq!(&*script, "/tmp/\\x1b]0;owned\\x07.py");
    }
}
