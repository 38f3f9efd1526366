//! Per process: its process context and how its threads reach
//! `otel_thread_ctx_v1`, found when the process is registered for the
//! walk (after exec, and again each time the table reads its maps anew:
//! a writer's library may be `dlopen`ed later), retried while a TLS
//! descriptor is not resolved yet, the context polled while it is
//! published. What is found goes to BPF through [`OtelProcsSink`]; the
//! key maps are kept for the collector ([`SpanKeyNames`]).
//!
//! Bounded: per discovery a read budget of [`READ_CALLS`] calls and
//! [`READ_BYTES`] bytes; a forged context costs at most
//! [`super::process_ctx::MAX_ATTEMPTS`] reads per poll, and polls back off
//! to [`MAX_POLL`] while it keeps failing; at most [`MAX_PROCS`] processes
//! and [`CONTEXT_BYTES`] of contexts kept (a context past it is refused,
//! counted). Reads of files and processes happen with no lock held: the
//! collector asks [`SpanKeyNames`] at every drain.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{
    elf_tls::TlsFacts,
    files::FactsCache,
    process_ctx::{self, ProcessContext, Refused, MAPPING_NAMES},
    resolve::{resolve, Loaded, Unresolved},
};
use crate::{
    bpf::otel::OtelTls,
    collect::spans::SpanKeyNames,
    process::{
        files::ExecMapping,
        live,
        remote::{Budget, Remote},
    },
    runtime::{Attach, Runtime, WalkEntry},
};

/// Read calls one discovery may make.
pub const READ_CALLS: u64 = 64;
/// Bytes one discovery may read (a payload at its bound, and slots).
pub const READ_BYTES: u64 = 3 * process_ctx::MAX_PAYLOAD as u64 + 4096;
/// Processes tracked (as `otel_procs` holds).
pub const MAX_PROCS: usize = 8192;
/// Bytes of the contexts kept, together (a full key map is ~40 KiB; real
/// ones are under 1 KiB).
pub const CONTEXT_BYTES: usize = 4 << 20;
/// First poll of a published context, and after each change read.
pub const POLL: Duration = Duration::from_secs(1);
/// Slowest poll (a context refused again and again).
pub const MAX_POLL: Duration = Duration::from_secs(60);
/// Retries of an unresolved TLS descriptor, or of a process with a
/// context and no variable yet (its library not loaded yet), before giving
/// up until its maps change: 1 s apart, then doubling up to [`MAX_POLL`].
pub const MAX_RETRIES: u32 = 10;

/// Where each process's access is written for BPF (`otel_procs`).
pub trait OtelProcsSink: Send + Sync {
    fn set(&self, pid: u32, access: OtelTls);
    fn remove(&self, pid: u32);
}

/// What was found and refused (`/healthz`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OtelStats {
    /// Processes tracked, with a context, with an access written.
    pub processes: u64,
    pub contexts: u64,
    pub accesses: u64,
    /// Contexts refused (each read), by reason.
    pub ctx_refused: u64,
    pub ctx_too_big: u64,
    pub ctx_unstable: u64,
    /// Contexts not kept: [`CONTEXT_BYTES`] reached.
    pub ctx_over_budget: u64,
    /// Contexts read again after `published_at_ns` changed.
    pub ctx_rereads: u64,
    /// TLS slots found implausible, or not resolved yet (each attempt).
    pub tls_implausible: u64,
    pub tls_pending: u64,
    /// Files that could not be opened or parsed.
    pub files_refused: u64,
    /// Processes not tracked for want of room.
    pub procs_dropped: u64,
}

impl OtelStats {
    fn count_read(&mut self, read: &Result<ProcessContext, Refused>) {
        match read {
            Ok(_) => {}
            Err(Refused::TooBig) => self.ctx_too_big += 1,
            Err(Refused::Unstable) => self.ctx_unstable += 1,
            Err(_) => self.ctx_refused += 1,
        }
    }
}

/// One process as discovered.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub access: Option<OtelTls>,
    pub unresolved: Option<Unresolved>,
    /// Where its `OTEL_CTX` header is.
    pub ctx_at: Option<u64>,
    pub context: Option<Arc<ProcessContext>>,
    pub ctx_refused: Option<Refused>,
}

struct Proc {
    found: Found,
    retries: u32,
    retry_at: Option<Instant>,
    poll_at: Instant,
    poll_every: Duration,
}

#[derive(Default)]
struct State {
    procs: HashMap<u32, Proc>,
    /// Bytes of the contexts in `procs`.
    ctx_bytes: usize,
    stats: OtelStats,
}

impl State {
    /// Keeps what `read` found as the context of `found`, or `old` (whose
    /// bytes are not counted now) when it was refused or the budget is
    /// spent; counts the kept context's bytes.
    fn keep_context(
        &mut self,
        found: &mut Found,
        old: Option<Arc<ProcessContext>>,
        read: Result<ProcessContext, Refused>,
    ) {
        self.stats.count_read(&read);
        found.context = match read {
            Err(e) => {
                found.ctx_refused = Some(e);
                old
            }
            Ok(ctx) if self.ctx_bytes + ctx.bytes() > CONTEXT_BYTES => {
                self.stats.ctx_over_budget += 1;
                old
            }
            Ok(ctx) => Some(Arc::new(ctx)),
        };
        self.ctx_bytes += found.context.as_ref().map_or(0, |c| c.bytes());
    }

    /// Forgets `pid`, its context's bytes with it.
    fn remove(&mut self, pid: u32) -> Option<Proc> {
        let p = self.procs.remove(&pid)?;
        self.ctx_bytes -= p.found.context.as_ref().map_or(0, |c| c.bytes());
        Some(p)
    }
}

/// The processes' OpenTelemetry contexts: a [`Runtime`] (it needs the
/// walk's registration events), a [`SpanKeyNames`].
pub struct OtelContexts {
    sink: Arc<dyn OtelProcsSink>,
    files: FactsCache,
    state: Mutex<State>,
}

fn locked(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl OtelContexts {
    pub fn new(sink: Arc<dyn OtelProcsSink>) -> Arc<OtelContexts> {
        Arc::new(OtelContexts {
            sink,
            files: FactsCache::default(),
            state: Mutex::new(State::default()),
        })
    }

    /// What was found of `pid`.
    pub fn found(&self, pid: u32) -> Option<Found> {
        locked(&self.state).procs.get(&pid).map(|p| p.found.clone())
    }

    /// Counts so far.
    pub fn stats(&self) -> OtelStats {
        let s = locked(&self.state);
        let mut out = s.stats.clone();
        out.processes = s.procs.len() as u64;
        let found = s.procs.values().map(|p| &p.found);
        out.contexts = found.clone().filter(|f| f.context.is_some()).count() as u64;
        out.accesses = found.filter(|f| f.access.is_some()).count() as u64;
        out.files_refused = self.files.refused();
        out
    }

    /// Discovers `pid` from its executable file `mappings` (`program`: the
    /// path of its executable, if known) and writes the result.
    pub fn discover(
        &self,
        pid: u32,
        mappings: &[ExecMapping],
        program: Option<&str>,
        now: Instant,
    ) {
        {
            let mut s = locked(&self.state);
            if !s.procs.contains_key(&pid) && s.procs.len() >= MAX_PROCS {
                s.stats.procs_dropped += 1;
                return;
            }
        }
        let remote = Remote::with_budget(pid, Budget::new(READ_CALLS, READ_BYTES));
        let ctx_at = live::regions_named(pid, MAPPING_NAMES)
            .ok()
            .and_then(|r| r.first().map(|r| r.start));
        let read = ctx_at.map(|at| process_ctx::read(&remote, at));
        let (access, unresolved) = match self.access(pid, mappings, program, &remote) {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(e)),
        };
        let mut s = locked(&self.state);
        match unresolved {
            Some(Unresolved::Pending) => s.stats.tls_pending += 1,
            Some(Unresolved::Implausible) => s.stats.tls_implausible += 1,
            _ => {}
        }
        let before = s.remove(pid);
        let retries = before.as_ref().map_or(0, |p| p.retries);
        let had = before.as_ref().and_then(|p| p.found.access);
        let mut found = Found {
            access,
            unresolved,
            ctx_at,
            ..Found::default()
        };
        if let Some(read) = read {
            let old = before.as_ref().and_then(|p| p.found.context.clone());
            s.keep_context(&mut found, old, read);
        }
        // Again later: a descriptor not resolved yet, or a process that
        // publishes a context but has not loaded the variable's library
        // yet (its maps are read anew then, see `walk_entry`).
        let again = match unresolved {
            Some(Unresolved::Pending) => true,
            Some(Unresolved::Absent) => ctx_at.is_some(),
            _ => false,
        };
        let pending = again && retries < MAX_RETRIES;
        if access.is_some() || ctx_at.is_some() {
            s.procs.insert(
                pid,
                Proc {
                    found,
                    retries: retries + u32::from(pending),
                    retry_at: pending.then(|| now + (POLL * 2u32.pow(retries)).min(MAX_POLL)),
                    poll_at: now + POLL,
                    poll_every: POLL,
                },
            );
        }
        drop(s);
        match access {
            Some(a) if had != Some(a) => self.sink.set(pid, a),
            None if had.is_some() => self.sink.remove(pid),
            _ => {}
        }
    }

    /// How `pid`'s threads reach the variable, from the files it maps.
    fn access(
        &self,
        pid: u32,
        mappings: &[ExecMapping],
        program: Option<&str>,
        remote: &Remote,
    ) -> Result<OtelTls, Unresolved> {
        let mut loaded: Vec<(Arc<TlsFacts>, u64)> = Vec::new();
        for m in mappings {
            let facts = self.files.get(pid, m);
            let Some(bias) = facts.bias(m.start, m.offset).filter(|_| facts.any()) else {
                continue;
            };
            // The program (module 1) is the process's executable; failing
            // that, the file that says it is one.
            let facts = match program {
                Some(path) if facts.executable != (&*m.path == path) => {
                    let mut f = (*facts).clone();
                    f.executable = !f.executable;
                    Arc::new(f)
                }
                _ => facts,
            };
            if !loaded.iter().any(|(f, b)| **f == *facts && *b == bias) {
                loaded.push((facts, bias));
            }
        }
        let views: Vec<Loaded<'_>> = loaded
            .iter()
            .map(|(facts, bias)| Loaded { facts, bias: *bias })
            .collect();
        let regions = std::cell::OnceCell::new();
        let mapped = |addr: u64| {
            regions
                .get_or_init(|| live::regions(pid).unwrap_or_default())
                .iter()
                .any(|r| r.start <= addr && addr < r.end)
        };
        resolve(&views, remote, &mapped)
    }

    /// Polls the published contexts due among `pids` until `deadline`: one
    /// header read each, the whole context again when `published_at_ns`
    /// changed.
    fn poll(&self, pids: &HashSet<u32>, now: Instant, deadline: Instant) {
        let due: Vec<(u32, u64, Option<u64>)> = locked(&self.state)
            .procs
            .iter()
            .filter(|(pid, p)| pids.contains(pid) && p.poll_at <= now)
            .filter_map(|(&pid, p)| {
                let known = p.found.context.as_ref().map(|c| c.published_at_ns);
                Some((pid, p.found.ctx_at?, known))
            })
            .collect();
        for (pid, at, known) in due {
            if Instant::now() >= deadline {
                break;
            }
            let remote = Remote::with_budget(pid, Budget::new(READ_CALLS, READ_BYTES));
            let published = remote.u64(at + 16).ok();
            let read =
                (published.is_none() || published != known).then(|| process_ctx::read(&remote, at));
            let mut s = locked(&self.state);
            let Some(mut p) = s.remove(pid) else {
                continue;
            };
            if let Some(read) = read {
                s.stats.ctx_rereads += 1;
                let ok = read.is_ok();
                let old = p.found.context.take();
                s.keep_context(&mut p.found, old, read);
                p.poll_every = if ok {
                    POLL
                } else {
                    (p.poll_every * 2).min(MAX_POLL)
                };
            } else {
                s.ctx_bytes += p.found.context.as_ref().map_or(0, |c| c.bytes());
            }
            p.poll_at = now + p.poll_every;
            s.procs.insert(pid, p);
        }
    }
}

impl SpanKeyNames for OtelContexts {
    fn names(&self, pid: u32) -> Option<Arc<[Arc<str>]>> {
        let s = locked(&self.state);
        let ctx = s.procs.get(&pid)?.found.context.as_ref()?;
        Some(ctx.key_names.clone())
    }
}

impl Runtime for OtelContexts {
    fn name(&self) -> &'static str {
        "otel"
    }

    fn walk_entry(&self, proc: &Attach<'_>, _entry: &mut WalkEntry) {
        let program = proc
            .image
            .facts
            .as_ref()
            .and_then(|f| f.executable.as_ref());
        let program = program.and_then(|p| p.to_str());
        // A retry reads the maps now: the table's may predate a dlopen.
        let retrying = locked(&self.state)
            .procs
            .get(&proc.pid)
            .is_some_and(|p| p.retry_at.is_some());
        let now_mapped = retrying
            .then(|| live::exec_mappings(proc.pid).ok())
            .flatten();
        let mappings = now_mapped.as_deref().unwrap_or(proc.mappings);
        self.discover(proc.pid, mappings, program, proc.now);
    }

    fn retry_due(&self, pid: u32, now: Instant) -> bool {
        let s = locked(&self.state);
        let due = s.procs.get(&pid).and_then(|p| p.retry_at);
        due.is_some_and(|at| at <= now)
    }

    fn synchronize(&self, pids: &HashSet<u32>, now: Instant, deadline: Instant) -> Vec<u32> {
        self.poll(pids, now, deadline);
        Vec::new()
    }

    fn detach(&self, pid: u32) {
        let gone = locked(&self.state).remove(pid);
        if gone.is_some_and(|p| p.found.access.is_some()) {
            self.sink.remove(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otelctx::process_ctx::tests::{header, payload};

    #[derive(Default)]
    struct Sink(Mutex<Vec<(u32, Option<OtelTls>)>>);
    impl OtelProcsSink for Sink {
        fn set(&self, pid: u32, access: OtelTls) {
            self.0.lock().unwrap().push((pid, Some(access)));
        }
        fn remove(&self, pid: u32) {
            self.0.lock().unwrap().push((pid, None));
        }
    }

    /// Publishes a context in this process, in a mapping named as writers
    /// name it (a memfd `OTEL_CTX`).
    fn publish(names: &[&str], at_ns: u64) -> *mut u8 {
        let body = payload(names);
        // SAFETY: plain system calls; the mapping is ours, never unmapped
        // (the test process ends).
        unsafe {
            let fd = libc::memfd_create(c"OTEL_CTX".as_ptr(), 0);
            assert!(fd >= 0 && libc::ftruncate(fd, 65536) == 0);
            let m = libc::mmap(
                std::ptr::null_mut(),
                65536,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            ) as *mut u8;
            libc::close(fd);
            assert!(m as isize != -1);
            let h = header(b"OTEL_CTX", 2, body.len() as u32, at_ns, m as u64 + 32);
            std::ptr::copy_nonoverlapping(h.as_ptr(), m, 32);
            std::ptr::copy_nonoverlapping(body.as_ptr(), m.add(32), body.len());
            m
        }
    }

    #[test]
    fn a_context_is_kept_polled_and_its_bytes_counted() {
        let me = std::process::id();
        let m = publish(&["http_route"], 5);
        let sink = Arc::new(Sink::default());
        let ctx = OtelContexts::new(sink.clone());
        let now = Instant::now();
        let mappings = live::exec_mappings(me).unwrap();
        ctx.discover(me, &mappings, None, now);
        let names = ctx.names(me).expect("our context");
        assert_eq!(names.len(), 1);
        let found = ctx.found(me).unwrap();
        assert_eq!(
            found.unresolved,
            Some(Unresolved::Absent),
            "no variable here"
        );
        assert!(sink.0.lock().unwrap().is_empty(), "nothing written for BPF");
        // Asked again later: its library may not be loaded yet.
        assert!(!ctx.retry_due(me, now) && ctx.retry_due(me, now + POLL));
        let bytes = locked(&ctx.state).ctx_bytes;
        assert_eq!(bytes, found.context.unwrap().bytes());
        // Republished with two names: read again at the next poll due.
        let two = payload(&["http_route", "http_method"]);
        // SAFETY: within the mapping made above.
        unsafe {
            std::ptr::copy_nonoverlapping(two.as_ptr(), m.add(32), two.len());
            std::ptr::copy_nonoverlapping((two.len() as u32).to_le_bytes().as_ptr(), m.add(12), 4);
            std::ptr::copy_nonoverlapping(6u64.to_le_bytes().as_ptr(), m.add(16), 8);
        }
        let pids = [me].into_iter().collect();
        let later = Instant::now() + Duration::from_secs(10);
        ctx.synchronize(&pids, now, later);
        assert_eq!(ctx.names(me).unwrap().len(), 1, "not due yet");
        ctx.synchronize(&pids, now + POLL, later);
        assert_eq!(ctx.names(me).unwrap().len(), 2);
        ctx.synchronize(&pids, now + 3 * POLL, later);
        assert_eq!(ctx.stats().ctx_rereads, 1, "unchanged: one header read");
        let bytes = locked(&ctx.state).ctx_bytes;
        assert_eq!(bytes, ctx.found(me).unwrap().context.unwrap().bytes());
        Runtime::detach(&*ctx, me);
        assert_eq!(locked(&ctx.state).ctx_bytes, 0);
        assert!(ctx.names(me).is_none());
    }
}
