//! What a mapped file's path, as `/proc/PID/maps` shows it, tells: the
//! path and whether the file was deleted since it was mapped (the one
//! reader of the kernel's ` (deleted)` mark), and whether it is HotSpot's
//! `libjvm.so` (the one libjvm rule).

use std::path::Path;

/// What the kernel appends to the path of a file unlinked since it was
/// mapped (a library replaced by an upgrade, a JIT's temporary file).
const DELETED_MARK: &str = " (deleted)";

/// A mapped file's path, read from how `/proc/PID/maps` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedPath<'a> {
    /// The path the file had when it was mapped.
    pub path: &'a str,
    /// Whether the file was deleted since.
    pub deleted: bool,
}

impl<'a> MappedPath<'a> {
    /// Reads `shown`, a path as `/proc/PID/maps` shows it.
    pub fn parse(shown: &'a str) -> MappedPath<'a> {
        match shown.strip_suffix(DELETED_MARK) {
            Some(path) => MappedPath {
                path,
                deleted: true,
            },
            None => MappedPath {
                path: shown,
                deleted: false,
            },
        }
    }

    /// The file's name: the last component of its path (none for `/`).
    pub fn file_name(&self) -> Option<&'a str> {
        Path::new(self.path).file_name()?.to_str()
    }
}

/// HotSpot's `libjvm.so` among the paths of a process's mapped files (as
/// `/proc/PID/maps` shows them): the position of the first, or `None`.
/// OpenJ9 ships a `libjvm.so` too, next to its `libj9vm*.so`; it has no
/// HotSpot structures to read and answers SIGQUIT with a javacore file,
/// not an attach socket, so a process mapping `libj9vm*.so` has none.
pub fn hotspot_libjvm<S: AsRef<str>>(paths: impl IntoIterator<Item = S>) -> Option<usize> {
    let mut libjvm = None;
    for (i, shown) in paths.into_iter().enumerate() {
        let Some(name) = MappedPath::parse(shown.as_ref()).file_name() else {
            continue;
        };
        if name.starts_with("libj9vm") {
            return None;
        }
        if name == "libjvm.so" {
            libjvm = libjvm.or(Some(i));
        }
    }
    libjvm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deleted_mark_is_read_once_from_the_end() {
        let live = MappedPath::parse("/usr/lib/libc.so.6");
        assert_eq!((live.path, live.deleted), ("/usr/lib/libc.so.6", false));
        let gone = MappedPath::parse("/usr/lib/libc.so.6 (deleted)");
        assert_eq!((gone.path, gone.deleted), ("/usr/lib/libc.so.6", true));
        assert_eq!(gone.file_name(), Some("libc.so.6"));
        // A file named with the mark, deleted: only the kernel's is taken.
        let named = MappedPath::parse("/tmp/x (deleted) (deleted)");
        assert_eq!((named.path, named.deleted), ("/tmp/x (deleted)", true));
        assert_eq!(MappedPath::parse("/").file_name(), None);
    }

    #[test]
    fn hotspot_maps_libjvm_and_openj9_does_not_count() {
        let hotspot = ["/usr/bin/java", "/opt/jdk/lib/server/libjvm.so"];
        assert_eq!(hotspot_libjvm(hotspot), Some(1));
        let upgraded = ["/opt/jdk/lib/server/libjvm.so (deleted)"];
        assert_eq!(hotspot_libjvm(upgraded), Some(0));
        let openj9 = [
            "/opt/j9/lib/default/libjvm.so",
            "/opt/j9/lib/default/libj9vm29.so",
        ];
        assert_eq!(hotspot_libjvm(openj9), None);
        assert_eq!(
            hotspot_libjvm(["/usr/lib/libjvm.so.1", "/x/notlibjvm.so"]),
            None
        );
    }
}
