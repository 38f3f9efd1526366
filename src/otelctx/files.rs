//! What each mapped file says of `otel_thread_ctx_v1`, read once per file
//! (by device and inode) and shared by every process that maps it: at
//! most [`MAX_FILES`] kept. Files are opened as the unwinder opens them
//! ([`ExecMapping::open`]: the very file mapped, checked, bounded); the
//! lock is not held while one is read.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use super::elf_tls::{self, TlsFacts};
use crate::process::files::{ExecMapping, FileKey};

/// Files whose facts are kept.
pub const MAX_FILES: usize = 4096;

/// The facts of the files processes map.
#[derive(Default)]
pub struct FactsCache {
    files: Mutex<HashMap<FileKey, Arc<TlsFacts>>>,
    refused: AtomicU64,
}

impl FactsCache {
    /// The facts of the file behind `m`, a mapping of `pid`; a file that
    /// cannot be opened or parsed has none (counted).
    pub fn get(&self, pid: u32, m: &ExecMapping) -> Arc<TlsFacts> {
        let cached = self.locked().get(&m.key).cloned();
        if let Some(f) = cached {
            return f;
        }
        let read = m
            .open(pid)
            .ok()
            .and_then(|file| elf_tls::facts(&object::ReadCache::new(file)).ok());
        let facts = Arc::new(read.unwrap_or_else(|| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            TlsFacts::default()
        }));
        let mut files = self.locked();
        if files.len() >= MAX_FILES {
            files.clear();
        }
        files.insert(m.key, facts.clone());
        facts
    }

    /// Files that could not be opened or parsed.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<FileKey, Arc<TlsFacts>>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
}
