//! The daemon's one memory budget (`--memory-mb`) and its split among the
//! holders of [`crate::held`] and `/healthz` `memory`: every holder's byte
//! bound is its part of the budget, so that the bounds together fit the
//! budget, and the budget fits the unit's `MemoryMax` with a margin (for
//! the kernel's share of the cgroup: BPF maps, page tables, sockets).
//!
//! The split is installed once at start ([`install`]); holders read their
//! part with [`bytes`]. Before that (unit tests, `record`), the default
//! budget's split stands. Tables the host's processes fill (shared BPF
//! maps) are divided among users by [`shares`]; the CPU time work done
//! for processes takes, among users by [`cpu`].

pub mod cpu;
pub mod shares;

use std::sync::OnceLock;

use serde::Serialize;

/// The default budget: `MemoryMax=512M` (`deploy/wallscope.service`) less a
/// quarter for the kernel's share of the cgroup and spikes no holder names.
pub const DEFAULT_MB: u64 = 384;
/// The smallest budget accepted: below it the parts are too small for the
/// structures they bound (a batch, an answer).
pub const MIN_MB: u64 = 128;
/// Per mille of the budget all parts together (the rest is [`Part::Reserve`]).
const PER_MILLE: u64 = 1000;

/// A holder's part of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The history: slices, their stacks and thread names.
    Store,
    /// The OpenTelemetry spans' times, records and stack rows.
    Spans,
    /// The interned frame names and the address caches handing them out.
    Names,
    /// Names read from JIT perf maps.
    PerfMapNames,
    /// The ELF files the symbolizers map, and the kernel's symbols.
    ElfSymbols,
    /// Unwind tables being built and the registry's entries.
    UnwindTables,
    /// Decoded JVM code and method names.
    JvmCode,
    /// The process table's images and mappings.
    ProcessTable,
    /// Answers being built by running queries.
    QueryBuffers,
    /// Answers being written to their clients (`api::answers`).
    Answers,
    /// The push sinks' outboxes together.
    PushOutbox,
    /// Drained batches waiting for the symbolizer.
    Batches,
    /// What no holder bounds: the binary, thread stacks, libraries, the
    /// allocator's slack.
    Reserve,
}

impl Part {
    /// Its name in `/healthz` and `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Part::Store => "store",
            Part::Spans => "spans",
            Part::Names => "names",
            Part::PerfMapNames => "perf_map_names",
            Part::ElfSymbols => "elf_symbols",
            Part::UnwindTables => "unwind_tables",
            Part::JvmCode => "jvm_code",
            Part::ProcessTable => "process_table",
            Part::QueryBuffers => "query_buffers",
            Part::Answers => "answers",
            Part::PushOutbox => "push_outbox",
            Part::Batches => "batches",
            Part::Reserve => "reserve",
        }
    }
}

/// Every part with its per mille of the budget, in `/healthz` order.
/// Why these: the store and the names grow with the host's activity; the
/// ELF files are mapped whole (libjvm's 20 MB among them); two queries of
/// 24 MiB each (their fold
/// table, kept lines and text: `profile::report::truncate::Limits::API`)
/// may run at once; answers being written hold two clients' largest
/// answers and root's reserve; a drained batch of 10,000 threads' stacks
/// is estimated at about 20 MB; the spans' part holds a few minutes of a
/// busy service's spans in full (older ones aggregated); the reserve holds
/// the daemon's binary and the allocator's slack.
const SPLIT: [(Part, u64); 13] = [
    (Part::Store, 110),
    (Part::Spans, 20),
    (Part::Names, 120),
    (Part::PerfMapNames, 50),
    (Part::ElfSymbols, 130),
    (Part::UnwindTables, 60),
    (Part::JvmCode, 40),
    (Part::ProcessTable, 35),
    (Part::QueryBuffers, 140),
    (Part::Answers, 70),
    (Part::PushOutbox, 35),
    (Part::Batches, 110),
    (Part::Reserve, 80),
];
const _: () = {
    let mut sum = 0;
    let mut i = 0;
    while i < SPLIT.len() {
        sum += SPLIT[i].1;
        i += 1;
    }
    assert!(sum == PER_MILLE);
};

/// A part given explicitly by its own flag.
#[derive(Debug, Clone, Copy)]
pub struct Override {
    pub part: Part,
    pub bytes: u64,
    /// The flag that gave it, for the refusal.
    pub flag: &'static str,
}

/// Why a budget cannot be split.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error("--memory-mb {0} is below the least budget, {MIN_MB}")]
    TooSmall(u64),
    #[error(
        "{flag} {mb} does not fit in --memory-mb {budget}: the other holders would get \
         less than half their share; raise --memory-mb to at least {needed} or lower {flag}"
    )]
    OverrideTooLarge {
        flag: &'static str,
        mb: u64,
        budget: u64,
        needed: u64,
    },
    #[error(
        "--memory-mb {budget} is too small for this host's fixed parts (the unwind \
         registry's entries); give at least {needed}"
    )]
    Bases { budget: u64, needed: u64 },
}

/// One part's bytes (`/healthz` `memory.budget.split`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Share {
    pub part: Part,
    pub bytes: u64,
    /// Given by its own flag rather than by the split.
    pub overridden: bool,
}

/// The budget divided among the parts.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Split {
    pub budget_bytes: u64,
    pub split: Vec<Share>,
}

impl Split {
    /// `budget_mb` divided by [`SPLIT`]: the `bases` (bytes fixed by the
    /// kernel-side sizes, such as the unwind registry's entries) taken off
    /// first, `overrides` taken as given, and the other parts sharing the
    /// rest in their proportions (each on top of its base). Refused when
    /// that leaves the others less than half of their share.
    pub fn new(
        budget_mb: u64,
        bases: &[(Part, u64)],
        overrides: &[Override],
    ) -> Result<Split, BudgetError> {
        if budget_mb < MIN_MB {
            return Err(BudgetError::TooSmall(budget_mb));
        }
        let budget = budget_mb << 20;
        let given = |p: Part| overrides.iter().find(|o| o.part == p);
        let base = |p: Part| -> u64 {
            if given(p).is_some() {
                return 0;
            }
            bases.iter().filter(|(b, _)| *b == p).map(|(_, n)| n).sum()
        };
        let fixed: u64 = overrides.iter().map(|o| o.bytes).sum();
        let based: u64 = SPLIT.iter().map(|(p, _)| base(*p)).sum();
        let rest_mille: u64 = SPLIT
            .iter()
            .filter(|(p, _)| given(*p).is_none())
            .map(|(_, m)| m)
            .sum();
        // The others need at least half of what the split would give
        // them of the whole budget.
        let least = budget * rest_mille / PER_MILLE / 2;
        if based + fixed + least > budget {
            // budget * (1 - rest / 2000) >= based + fixed
            let needed = ((based + fixed) * 2 * PER_MILLE).div_ceil(2 * PER_MILLE - rest_mille);
            let needed = needed.div_ceil(1 << 20).max(MIN_MB);
            return Err(match overrides.iter().max_by_key(|o| o.bytes) {
                Some(o) => BudgetError::OverrideTooLarge {
                    flag: o.flag,
                    mb: o.bytes >> 20,
                    budget: budget_mb,
                    needed,
                },
                None => BudgetError::Bases {
                    budget: budget_mb,
                    needed,
                },
            });
        }
        let rest = budget - based - fixed;
        let split = SPLIT
            .iter()
            .map(|&(part, mille)| match given(part) {
                Some(o) => Share {
                    part,
                    bytes: o.bytes,
                    overridden: true,
                },
                None => Share {
                    part,
                    bytes: base(part) + rest * mille / rest_mille.max(1),
                    overridden: false,
                },
            })
            .collect();
        Ok(Split {
            budget_bytes: budget,
            split,
        })
    }

    /// `part`'s bytes.
    pub fn of(&self, part: Part) -> u64 {
        self.split
            .iter()
            .find(|s| s.part == part)
            .map_or(0, |s| s.bytes)
    }

    /// All parts' bytes together (at most the budget).
    pub fn sum(&self) -> u64 {
        self.split.iter().map(|s| s.bytes).sum()
    }
}

/// Bytes the unwind registry's entries hold at most (its processes, their
/// mappings and files: fixed by the BPF maps' sizes), taken off the budget
/// before it is split, as the base of its `unwind_tables` part. A number
/// here rather than a call into `unwind` (a layer above this one):
/// `unwind::held` checks at compile time that its entries fit it.
pub const UNWIND_REGISTRY_BYTES: u64 = 62_390_272;

/// This build's fixed parts: the unwind registry's entries.
pub fn bases() -> [(Part, u64); 1] {
    [(Part::UnwindTables, UNWIND_REGISTRY_BYTES)]
}

static INSTALLED: OnceLock<Split> = OnceLock::new();

/// Makes `split` the daemon's, before any holder reads it; `false` if one
/// was installed (or read) already.
pub fn install(split: Split) -> bool {
    INSTALLED.set(split).is_ok()
}

/// The daemon's split (the default budget's if none was installed).
pub fn current() -> &'static Split {
    INSTALLED.get_or_init(|| {
        Split::new(DEFAULT_MB, &bases(), &[]).unwrap_or_else(|_| Split {
            budget_bytes: DEFAULT_MB << 20,
            split: Vec::new(),
        })
    })
}

/// `part`'s bytes in the daemon's split.
pub fn bytes(part: Part) -> usize {
    current().of(part) as usize
}

/// Drained batches held at once: one queued for the symbolizer, one it
/// symbolizes, one waiting in the collector. A counts map's drain is sized
/// to a third of the part.
const BATCHES_HELD: u64 = 3;
/// Bytes a drained row is estimated at before symbolization, its stacks
/// aside, for the size of the counts maps.
pub const RAW_ROW_BYTES: u64 = 200;

/// One batch's share of the `batches` part.
fn batch_bytes() -> u64 {
    bytes(Part::Batches) as u64 / BATCHES_HELD
}

/// Most rows of a counts map (a power of two): as many as one batch's
/// share of the `batches` part holds at [`RAW_ROW_BYTES`] a row.
pub fn max_counts_rows() -> u32 {
    let rows = (batch_bytes() / RAW_ROW_BYTES).clamp(4096, u64::from(u32::MAX));
    1u32 << (63 - rows.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_split_fits_the_budget() {
        let s = Split::new(DEFAULT_MB, &[], &[]).unwrap();
        assert_eq!(s.split.len(), SPLIT.len());
        assert!(s.sum() <= s.budget_bytes);
        assert!(s.sum() > s.budget_bytes - 1024, "{}", s.sum());
        assert_eq!(s.of(Part::Store), (DEFAULT_MB << 20) * 110 / 1000);
    }

    #[test]
    fn an_override_takes_from_the_others() {
        let store = Override {
            part: Part::Store,
            bytes: 100 << 20,
            flag: "--max-memory-mb",
        };
        let s = Split::new(DEFAULT_MB, &[], &[store]).unwrap();
        assert_eq!(s.of(Part::Store), 100 << 20);
        assert!(s.of(Part::Names) < Split::new(DEFAULT_MB, &[], &[]).unwrap().of(Part::Names));
        assert!(s.sum() <= s.budget_bytes);
        assert!(s.split[0].overridden && !s.split[1].overridden);
    }

    #[test]
    fn bases_come_first_and_count_in_their_part() {
        let unwind = (Part::UnwindTables, 50 << 20);
        let s = Split::new(DEFAULT_MB, &[unwind], &[]).unwrap();
        let plain = Split::new(DEFAULT_MB, &[], &[]).unwrap();
        assert!(s.of(Part::UnwindTables) > 50 << 20);
        assert!(s.of(Part::Store) < plain.of(Part::Store));
        assert!(s.sum() <= s.budget_bytes);
        assert!(matches!(
            Split::new(MIN_MB, &[(Part::UnwindTables, 120 << 20)], &[]),
            Err(BudgetError::Bases { .. })
        ));
    }

    #[test]
    fn an_override_that_does_not_fit_is_refused_with_the_budget_it_needs() {
        let store = Override {
            part: Part::Store,
            bytes: 300 << 20,
            flag: "--max-memory-mb",
        };
        let err = Split::new(DEFAULT_MB, &[], &[store]).unwrap_err();
        let BudgetError::OverrideTooLarge { needed, .. } = err else {
            panic!("{err}");
        };
        assert!(err.to_string().contains("--max-memory-mb 300"), "{err}");
        assert!(Split::new(needed, &[], &[store]).is_ok(), "{needed}");
        assert!(Split::new(needed - 1, &[], &[store]).is_err(), "{needed}");
    }

    #[test]
    fn a_counts_map_fits_one_batchs_share() {
        let rows = max_counts_rows();
        assert!(rows.is_power_of_two());
        let fit = batch_bytes() / RAW_ROW_BYTES;
        assert!(
            u64::from(rows) <= fit && u64::from(rows) * 2 > fit,
            "{rows}"
        );
    }

    #[test]
    fn a_budget_below_the_least_is_refused() {
        assert_eq!(Split::new(64, &[], &[]), Err(BudgetError::TooSmall(64)));
        assert!(Split::new(MIN_MB, &[], &[]).is_ok());
    }
}
