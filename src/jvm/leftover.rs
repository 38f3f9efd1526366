//! Perf maps wallscope had a JVM write (`Compiler.perfmap`), removed when
//! that JVM exits: HotSpot leaves `/tmp/perf-<pid>.map` behind, and pids
//! recycle. Only the very file the JVM wrote goes: the JVM's `/tmp` is
//! held open from the moment it wrote it (so that its exit, or a change of
//! its mount namespace, cannot redirect the removal), and at exit the name
//! must still be a regular file of the JVM's user with the same identity.

use crate::untrusted::{Dir, What};

/// The perf map one JVM wrote, as last seen after a write.
pub struct WrittenMap {
    /// The JVM's `/tmp`, reached through `/proc/PID/root` when it wrote.
    tmp: Dir,
    name: String,
    uid: u32,
    dev: u64,
    ino: u64,
    /// Change time: an inode number freed and reused for a new file under
    /// the same name does not make it the same file.
    ctime: (i64, i64),
}

impl std::fmt::Debug for WrittenMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrittenMap({}, ino {})", self.name, self.ino)
    }
}

/// Whether `st` is a regular file owned by `uid` (not a link: the entry
/// itself is looked at).
fn written_by(st: &libc::stat, uid: u32) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == uid
}

impl WrittenMap {
    /// The map JVM `pid` (`ns_pid` in its own namespace, running as `uid`)
    /// just wrote, if the file there is a regular file of that user.
    pub fn after_write(pid: u32, ns_pid: u32, uid: u32) -> Option<WrittenMap> {
        let tmp = Dir::process_tmp(pid, What::PerfMap).ok()?;
        let name = format!("perf-{ns_pid}.map");
        let st = tmp.stat(&name).ok()?;
        written_by(&st, uid).then(|| WrittenMap {
            tmp,
            name,
            uid,
            dev: st.st_dev,
            ino: st.st_ino,
            ctime: (st.st_ctime, st.st_ctime_nsec),
        })
    }

    /// Removes the map if it is still the file the JVM wrote; whether it
    /// did. For when the JVM has exited.
    pub fn remove(self) -> bool {
        self.tmp.remove_if(&self.name, |st| {
            written_by(st, self.uid)
                && (st.st_dev, st.st_ino) == (self.dev, self.ino)
                && (st.st_ctime, st.st_ctime_nsec) == self.ctime
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Our own "perf map", under our own pid: as a JVM's would be.
    fn write_ours() -> (std::path::PathBuf, u32) {
        let me = std::process::id();
        let path = std::path::PathBuf::from(format!("/tmp/perf-{me}.map"));
        std::fs::write(&path, "1000 10 x\n").unwrap();
        let uid = std::fs::metadata(&path).unwrap().uid();
        (path, uid)
    }

    #[test]
    fn the_file_written_is_removed_and_a_replaced_one_is_not() {
        let me = std::process::id();
        let (path, uid) = write_ours();
        let map = WrittenMap::after_write(me, me, uid).expect("our map");
        assert!(map.remove());
        assert!(!path.exists());

        // Replaced by another file (a new inode: the old one is kept
        // alive under another name) under the same name.
        let (path, uid) = write_ours();
        let map = WrittenMap::after_write(me, me, uid).unwrap();
        let aside = path.with_extension("aside");
        std::fs::rename(&path, &aside).unwrap();
        std::fs::write(&path, "replaced\n").unwrap();
        assert!(!map.remove());
        assert!(path.exists());
        std::fs::remove_file(&aside).unwrap();

        // A symlink in its place.
        let map = WrittenMap::after_write(me, me, uid).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(!map.remove());
        assert!(std::fs::symlink_metadata(&path).is_ok());
        std::fs::remove_file(&path).unwrap();

        // Of another user than the JVM's: not the JVM's map at all.
        let (path, uid) = write_ours();
        assert!(WrittenMap::after_write(me, me, uid + 1).is_none());
        std::fs::remove_file(&path).unwrap();
    }
}
