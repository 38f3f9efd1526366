//! The daemon's own resident memory: by kind, from its status,
//! and by holder (`/healthz` `memory.holders`), so that a spike names the
//! holder it came from; and the memory budget's split ([`crate::budget`])
//! that every holder's bound comes from.
//!
//! Each holder reports its bytes and the bound enforced on them (before
//! the allocation). The figures are running counters the holders keep
//! ([`crate::held`], the store's published stats), except the file-backed
//! ones (the daemon's binary, the ELF files the symbolizer maps), which
//! the kernel counts per mapping: its smaps are read for them at most once
//! per [`SMAPS_EVERY`].

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::limit::{QueryStats, MAX_RUNNING};
use crate::{
    budget::{self, Part, Split},
    export::push::outbox,
    held::{self, Holder},
    process::own::{self, MappedRss},
    profile::{
        model::{spans_store::SpanStats, store::StoreStats},
        report::truncate::Limits,
    },
    state::push::PushReport,
    symbolize::elf_files,
};

/// The daemon's smaps are read at most this often (it walks the page
/// tables of every mapping).
pub const SMAPS_EVERY: Duration = Duration::from_secs(1);

/// Resident memory of this process in bytes.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Rss {
    /// Heap, stacks and other private memory (`RssAnon`).
    pub anon_bytes: u64,
    /// Mapped files: the binary, libraries, mapped ELF files (`RssFile`).
    pub file_bytes: u64,
    /// Shared memory (`RssShmem`).
    pub shmem_bytes: u64,
}

impl Rss {
    /// This process's figures; `None` if `/proc` cannot be read.
    pub fn of_self() -> Option<Rss> {
        own::status().map(|s| Rss::of(&s))
    }

    fn of(s: &own::OwnStatus) -> Rss {
        Rss {
            anon_bytes: s.rss_anon,
            file_bytes: s.rss_file,
            shmem_bytes: s.rss_shmem,
        }
    }

    /// All resident memory.
    pub fn total_bytes(&self) -> u64 {
        self.anon_bytes + self.file_bytes + self.shmem_bytes
    }
}

/// One holder's bytes and bound.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HolderBytes {
    pub name: &'static str,
    pub bytes: u64,
    /// The byte bound enforced on it, `None` if it has none.
    pub bound: Option<u64>,
}

/// `/healthz` `memory`: resident memory by kind and by holder.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    #[serde(flatten)]
    pub rss: Rss,
    /// `VmRSS`.
    pub rss_bytes: u64,
    /// `VmHWM`: the most resident memory since the daemon started.
    pub hwm_bytes: u64,
    /// In this order: store, stacks, spans, names, elf_symbols,
    /// unwind_tables, jvm_code, process_table, query_buffers, answers,
    /// push_outbox, batches, bpf_maps, allocator, binary.
    pub holders: Vec<HolderBytes>,
    /// `rss_bytes` less the holders' sum (allocations no holder counts,
    /// thread stacks, libraries).
    pub unaccounted_bytes: u64,
    /// The budget (`--memory-mb`) and its split among the holders.
    pub budget: &'static Split,
    /// The holders' bounds together, `stacks` (within the store's) and
    /// `binary` (file pages, within the budget's reserve) aside: at most
    /// the budget less its reserve.
    pub bounds_bytes: u64,
}

/// Queries that may run at once: as many queries holding at most
/// [`Limits::API`]'s memory (fold table, kept lines, their text) as the
/// budget's `query_buffers` part holds, one at least, at most
/// [`MAX_RUNNING`].
pub fn query_slots() -> usize {
    (budget::bytes(Part::QueryBuffers) / Limits::API.memory()).clamp(1, MAX_RUNNING)
}

/// The daemon's smaps as last read, for the mapped holders.
static SMAPS: Mutex<Option<(Instant, MappedRss)>> = Mutex::new(None);

/// The memory report, from the store's published stats, the query bound
/// and the reports of the push sinks running; `None` if `/proc` cannot be
/// read.
pub fn report(
    store: &StoreStats,
    spans: &SpanStats,
    queries: &QueryStats,
    sinks: &[PushReport],
) -> Option<Memory> {
    let status = own::status()?;
    let rss = Rss::of(&status);
    let rss_bytes = status.vm_rss.unwrap_or(rss.total_bytes());
    let hwm_bytes = status.vm_hwm.unwrap_or(rss_bytes);
    let mapped = mapped();
    let (exe_size, _) = own::exe_size_and_inode();
    let counter = |h: Holder| held::get(h);
    let (interned, interned_bound) = counter(Holder::SymbolizerNames);
    let (perf_maps, perf_maps_bound) = counter(Holder::PerfMapNames);
    let (ksyms, ksyms_bound) = counter(Holder::KernelSymbols);
    let store_bound = Some(store.max_bytes as u64);
    let answer = Limits::API.memory() as u64;
    let holder = |name, bytes: u64, bound| HolderBytes { name, bytes, bound };
    let holders = vec![
        holder(
            "store",
            (store.slice_bytes + store.live_bytes) as u64,
            store_bound,
        ),
        // Within the store's bound, which counts slices and stacks
        // together: no bound of its own.
        holder("stacks", store.stack_bytes as u64, None),
        // The spans' store: its own part of the budget (`spans_store`).
        holder("spans", spans.bytes as u64, Some(spans.max_bytes as u64)),
        // The store's names are the interner's allocations (counted once),
        // but thread and process names are the store's own: the larger
        // of the two, and the perf maps' names beside.
        holder(
            "names",
            interned.max(store.name_bytes as u64) + perf_maps,
            Some(interned_bound.unwrap_or(0) + perf_maps_bound.unwrap_or(0)),
        ),
        // The ELF files' resident pages, and the kernel's symbols.
        holder(
            "elf_symbols",
            mapped.others + ksyms,
            Some(elf_files::max_mapped_bytes() + ksyms_bound.unwrap_or(0)),
        ),
        from_counter("unwind_tables", Holder::UnwindTables),
        from_counter("jvm_code", Holder::JvmCode),
        from_counter("process_table", Holder::ProcessTable),
        // An estimate: each running query may hold its fold table and an
        // answer of at most the API's truncation bytes (twice: its lines
        // and their text).
        holder(
            "query_buffers",
            queries.running as u64 * answer,
            Some(queries.max_running as u64 * answer),
        ),
        // Answers being written to their clients, within the budget's
        // `answers` part (`super::answers`).
        {
            let answers = super::answers::BUDGET.stats();
            holder("answers", answers.held, Some(answers.limits.total))
        },
        // Every sink's outbox (Pyroscope, OTLP), each within the bound.
        holder(
            "push_outbox",
            sinks.iter().map(|p| p.queued_bytes).sum(),
            Some(outbox::max_bytes() as u64 * sinks.len().max(1) as u64),
        ),
        // Drained rows not yet symbolized (an estimate that errs high).
        from_counter("batches", Holder::Batches),
        // Ring buffers and arrays shared with the BPF programs, sized at
        // load by the options (docs/resource-bounds.md).
        holder("bpf_maps", mapped.bpf_maps, None),
        // Pages the allocator keeps beyond what is allocated (metadata,
        // free runs): given back after a second (`dirty_decay_ms`).
        holder("allocator", allocator_overhead(), None),
        holder("binary", mapped.exe, Some(exe_size)),
    ];
    let accounted: u64 = holders.iter().map(|h| h.bytes).sum();
    let bounds_bytes = holders
        .iter()
        .filter(|h| h.name != "binary")
        .filter_map(|h| h.bound)
        .sum();
    Some(Memory {
        rss,
        rss_bytes,
        hwm_bytes,
        holders,
        unaccounted_bytes: rss_bytes.saturating_sub(accounted),
        budget: budget::current(),
        bounds_bytes,
    })
}

/// jemalloc's resident pages less the bytes allocated from them; 0 when
/// its statistics cannot be read (another allocator, in unit tests).
fn allocator_overhead() -> u64 {
    use tikv_jemalloc_ctl::{epoch, stats};
    let read = || -> Result<u64, tikv_jemalloc_ctl::Error> {
        epoch::advance()?;
        Ok(stats::resident::read()?.saturating_sub(stats::allocated::read()?) as u64)
    };
    read().unwrap_or(0)
}

fn from_counter(name: &'static str, holder: Holder) -> HolderBytes {
    let (bytes, bound) = held::get(holder);
    HolderBytes { name, bytes, bound }
}

/// The file-backed holders' resident bytes, read again after
/// [`SMAPS_EVERY`].
fn mapped() -> MappedRss {
    let mut cached = SMAPS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, m)) = *cached {
        if at.elapsed() < SMAPS_EVERY {
            return m;
        }
    }
    let (_, exe) = own::exe_size_and_inode();
    let elf: Vec<u64> = held::mapped_files()
        .into_iter()
        .map(|(_, ino)| ino)
        .collect();
    let m = own::smaps_rss(exe, &elf);
    *cached = Some((Instant::now(), m));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_rss() {
        assert!(Rss::of_self().is_some_and(|r| r.anon_bytes > 0));
    }

    #[test]
    fn holders_are_listed_in_order_and_add_up() {
        let store = StoreStats {
            slice_bytes: 1000,
            live_bytes: 24,
            stack_bytes: 500,
            max_bytes: 4 << 20,
            ..StoreStats::default()
        };
        let m = report(&store, &SpanStats::default(), &QueryStats::default(), &[]).unwrap();
        let names: Vec<&str> = m.holders.iter().map(|h| h.name).collect();
        assert_eq!(
            names,
            [
                "store",
                "stacks",
                "spans",
                "names",
                "elf_symbols",
                "unwind_tables",
                "jvm_code",
                "process_table",
                "query_buffers",
                "answers",
                "push_outbox",
                "batches",
                "bpf_maps",
                "allocator",
                "binary"
            ]
        );
        assert_eq!(
            (m.holders[0].bytes, m.holders[0].bound),
            (1024, Some(4 << 20))
        );
        assert!(m.holders[14].bytes > 0, "the test binary is mapped");
        let sum: u64 = m.holders.iter().map(|h| h.bytes).sum();
        assert_eq!(m.unaccounted_bytes, m.rss_bytes.saturating_sub(sum));
        assert!(m.hwm_bytes >= m.rss_bytes);
    }

    #[test]
    fn the_bounds_fit_the_budget_less_its_reserve() {
        let store = StoreStats {
            max_bytes: budget::bytes(Part::Store),
            ..StoreStats::default()
        };
        let queries = QueryStats {
            max_running: query_slots(),
            ..QueryStats::default()
        };
        let spans = SpanStats {
            max_bytes: budget::bytes(Part::Spans),
            ..SpanStats::default()
        };
        let m = report(&store, &spans, &queries, &[]).unwrap();
        let reserve = m.budget.of(Part::Reserve);
        assert!(
            m.bounds_bytes <= m.budget.budget_bytes - reserve,
            "{} > {}",
            m.bounds_bytes,
            m.budget.budget_bytes - reserve
        );
        let part = |name: &str| m.holders.iter().find(|h| h.name == name).unwrap().bound;
        let query = part("query_buffers").unwrap();
        assert!(query <= m.budget.of(Part::QueryBuffers), "{query}");
    }
}
