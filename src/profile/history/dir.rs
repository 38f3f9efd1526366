//! The history directory, opened once and then used only through its
//! descriptor (`openat`, `unlinkat`): renaming or swapping a path component
//! afterwards cannot send the daemon's writes (as root) anywhere else.
//! Every file is opened `O_NOFOLLOW | O_CLOEXEC`.

use std::{
    fs::{DirBuilder, File},
    io,
    os::{fd::OwnedFd, unix::fs::DirBuilderExt},
    path::{Path, PathBuf},
};

use rustix::fs::{AtFlags, Dir, Mode, OFlags};

use super::HistoryError;

/// Segment files are named `seg-<16 hex digits>.wsh`; anything else in the
/// directory is left alone.
const PREFIX: &str = "seg-";
const SUFFIX: &str = ".wsh";

/// Allocation unit the byte bound charges each file in (its size rounded
/// up): a file's real use of the disk is whole blocks.
pub const DISK_BLOCK: u64 = 4096;

/// The opened, checked history directory.
pub struct HistoryDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// `len` as the byte bound counts it: rounded up to whole disk blocks.
pub fn charged(len: u64) -> u64 {
    len.div_ceil(DISK_BLOCK) * DISK_BLOCK
}

/// The file name of segment `id`.
pub fn segment_name(id: u64) -> String {
    format!("{PREFIX}{id:016x}{SUFFIX}")
}

/// The id of a segment file name, `None` for any other name.
pub fn segment_id(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Takes the directory's lock, waiting a little for a holder that is going
/// away: a process forked by whoever held it shares the lock until it
/// calls `exec` (which closes the descriptor, `O_CLOEXEC`).
fn lock(fd: &OwnedFd) -> rustix::io::Result<()> {
    let mut tries = 0;
    loop {
        match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            done => return done,
        }
    }
}

impl HistoryDir {
    /// Creates `path` (0700, with missing parents) unless it exists, then
    /// opens it and refuses it unless it is a real directory (not a
    /// symlink), writable by its owner only, and owned by the user the
    /// daemon runs as (root, as a service): anyone else able to write there
    /// could plant or swap the files root reads and deletes.
    pub fn open(path: &Path) -> Result<HistoryDir, HistoryError> {
        let io_err = |what: &'static str| {
            let path = path.to_path_buf();
            move |source: io::Error| HistoryError::Io { what, path, source }
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(HistoryError::Symlink(path.to_path_buf()))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(io_err("creating"))?,
            Err(e) => return Err(io_err("checking")(e)),
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => HistoryError::Symlink(path.to_path_buf()),
            rustix::io::Errno::NOTDIR => HistoryError::NotDir(path.to_path_buf()),
            e => io_err("opening")(e.into()),
        })?;
        // Checked on the open descriptor: nothing can swap it in between.
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("checking")(e.into()))?;
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(HistoryError::Exposed {
                path: path.to_path_buf(),
                mode,
            });
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if st.st_uid != euid {
            return Err(HistoryError::Owner {
                path: path.to_path_buf(),
                uid: st.st_uid,
                euid,
            });
        }
        // One daemon per directory: two would delete each other's
        // segments. Held while the descriptor is open; a killed daemon's
        // lock goes with it.
        lock(&fd).map_err(|e| match e {
            rustix::io::Errno::WOULDBLOCK => HistoryError::InUse(path.to_path_buf()),
            e => io_err("locking")(e.into()),
        })?;
        Ok(HistoryDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory's path, for messages and stats.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of a file in it, for messages.
    pub fn shown(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The ids of the segment files present, ascending.
    pub fn segment_ids(&self) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in Dir::read_from(&self.fd)? {
            let entry = entry?;
            if let Some(id) = entry.file_name().to_str().ok().and_then(segment_id) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Opens a segment for reading; a symlink or non-regular file is
    /// refused (an error, as a corrupt segment).
    pub fn open_read(&self, id: u64) -> io::Result<File> {
        self.open_at(id, OFlags::RDONLY, Mode::empty())
    }

    /// Opens an existing segment to cut a torn tail off it.
    pub fn open_write(&self, id: u64) -> io::Result<File> {
        self.open_at(id, OFlags::WRONLY, Mode::empty())
    }

    /// Creates a new segment (0600); fails if the name exists.
    pub fn create(&self, id: u64) -> io::Result<File> {
        self.open_at(
            id,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::APPEND,
            Mode::RUSR | Mode::WUSR,
        )
    }

    fn open_at(&self, id: u64, flags: OFlags, mode: Mode) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            segment_name(id),
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            mode,
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a regular file",
            ));
        }
        Ok(File::from(fd))
    }

    /// Deletes a segment.
    pub fn remove(&self, id: u64) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            &self.fd,
            segment_name(id),
            AtFlags::empty(),
        )?)
    }

    /// Makes created and deleted names durable.
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::fsync(&self.fd)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn names_round_trip_and_others_are_ignored() {
        assert_eq!(segment_id(&segment_name(0x1f)), Some(0x1f));
        assert_eq!(segment_id(&segment_name(u64::MAX)), Some(u64::MAX));
        for other in [
            "seg-1.wsh",
            "seg-000000000000001g.wsh",
            "x-0000000000000001.wsh",
            "seg-0000000000000001.tmp",
        ] {
            assert_eq!(segment_id(other), None, "{other}");
        }
    }

    #[test]
    fn charged_rounds_up_to_blocks() {
        assert_eq!(charged(0), 0);
        assert_eq!(charged(1), DISK_BLOCK);
        assert_eq!(charged(DISK_BLOCK), DISK_BLOCK);
        assert_eq!(charged(DISK_BLOCK + 1), 2 * DISK_BLOCK);
    }

    #[test]
    fn creates_a_private_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b");
        let dir = HistoryDir::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(dir.segment_ids().unwrap().is_empty());
        drop(dir.create(3).unwrap());
        std::fs::write(path.join("notes.txt"), b"x").unwrap();
        assert_eq!(dir.segment_ids().unwrap(), vec![3]);
        assert!(dir.create(3).is_err(), "create must not reuse a name");
        assert!(matches!(
            HistoryDir::open(&path),
            Err(HistoryError::InUse(_))
        ));
        drop(dir);
        assert!(HistoryDir::open(&path).is_ok(), "unlocked when closed");
    }

    #[test]
    fn refuses_symlinks_exposed_and_foreign_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            HistoryDir::open(&link),
            Err(HistoryError::Symlink(_))
        ));

        for mode in [0o770, 0o707, 0o777] {
            std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = HistoryDir::open(&real).err().unwrap();
            assert!(
                matches!(err, HistoryError::Exposed { .. }),
                "{mode:o}: {err}"
            );
        }
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(HistoryDir::open(&real).is_ok());

        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            HistoryDir::open(&file),
            Err(HistoryError::NotDir(_))
        ));

        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&real, Some(65534), None).unwrap();
            let err = HistoryDir::open(&real).err().unwrap();
            assert!(
                matches!(err, HistoryError::Owner { uid: 65534, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn refuses_a_symlinked_segment() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = HistoryDir::open(tmp.path()).unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, b"WSHSEG01").unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join(segment_name(7))).unwrap();
        assert_eq!(dir.segment_ids().unwrap(), vec![7]);
        assert!(dir.open_read(7).is_err());
        assert!(dir.open_write(7).is_err());
    }
}
