//! The capabilities wallscope uses, checked at start: without the ones
//! that load eBPF it refuses to start, naming them; without the others it
//! starts, says which feature is off and why (log and `/healthz`
//! `capabilities`). `deploy/wallscope.service` grants exactly [`USED`].
//!
//! Read from `/proc/self/status` (`CapEff`) rather than with a crate: one
//! hex field, and the `caps` crate would add a dependency for it.

use std::sync::OnceLock;

use serde::Serialize;

/// A capability and what stops without it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cap {
    pub cap: &'static str,
    #[serde(skip)]
    bit: u32,
    /// What is off without it.
    pub off: &'static str,
}

const fn cap(cap: &'static str, bit: u32, off: &'static str) -> Cap {
    Cap { cap, bit, off }
}

/// CAP_SYS_ADMIN: before Linux 5.8 (no CAP_BPF/CAP_PERFMON) it stands for
/// both.
const SYS_ADMIN: u32 = 21;

/// Every capability wallscope uses; the first two load the eBPF programs.
pub const USED: [Cap; 11] = [
    cap("CAP_BPF", 39, "everything: the eBPF programs cannot load"),
    cap("CAP_PERFMON", 38, "everything: the eBPF programs cannot attach"),
    cap(
        "CAP_SYS_RESOURCE",
        24,
        "raising RLIMIT_MEMLOCK (needed only on kernels that do not charge BPF memory to the memory cgroup)",
    ),
    cap(
        "CAP_SYS_PTRACE",
        19,
        "reading other users' processes: their maps and JVM structures (stack unwinding tables, Java frames, DebugNonSafepoints)",
    ),
    cap(
        "CAP_DAC_READ_SEARCH",
        2,
        "opening other users' binaries and perf maps: their frames stay addresses",
    ),
    cap(
        "CAP_CHECKPOINT_RESTORE",
        40,
        "opening mapped files by their map_files links: binaries deleted or replaced since they were mapped stay unnamed",
    ),
    cap("CAP_SYSLOG", 34, "kernel symbols: kernel frames show as [unknown]_[k]"),
    cap("CAP_SETUID", 7, "attaching to JVMs of other users (perf maps, thread names)"),
    cap("CAP_SETGID", 6, "attaching to JVMs of other users (perf maps, thread names)"),
    cap("CAP_KILL", 5, "signalling JVMs of other users to start their attach listener"),
    cap(
        "CAP_SYS_NICE",
        23,
        "running the drain ahead of the daemon's other threads (SCHED_FIFO or nice -10): on a saturated host it may fall behind and lose rows",
    ),
];

/// What the check found, for `/healthz`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The used capabilities the daemon has.
    pub effective: Vec<&'static str>,
    /// Those it lacks, with what is off.
    pub missing: Vec<Cap>,
}

static REPORT: OnceLock<Report> = OnceLock::new();

/// Checks `effective` against [`USED`]: `Err` naming the capabilities
/// that loading eBPF needs when one is missing.
fn check_set(effective: u64) -> Result<Report, String> {
    let has = |bit: u32| effective & (1 << bit) != 0;
    let (have, missing): (Vec<Cap>, Vec<Cap>) = USED.iter().partition(|c| has(c.bit));
    let essential: Vec<&str> = missing[..]
        .iter()
        .filter(|c| c.bit == 38 || c.bit == 39)
        .map(|c| c.cap)
        .collect();
    if !essential.is_empty() && !has(SYS_ADMIN) {
        return Err(format!(
            "wallscope needs {} (or CAP_SYS_ADMIN) to load its eBPF programs; its effective set lacks {}",
            "CAP_BPF and CAP_PERFMON",
            essential.join(" and ")
        ));
    }
    Ok(Report {
        effective: have.iter().map(|c| c.cap).collect(),
        missing: missing
            .into_iter()
            .filter(|c| !(has(SYS_ADMIN) && (c.bit == 38 || c.bit == 39)))
            .collect(),
    })
}

/// Checks this process's capabilities once at start, logging what is off;
/// `Err` (to refuse to start) without the ones eBPF needs.
pub fn check() -> Result<&'static Report, String> {
    let effective = crate::process::own::status()
        .and_then(|s| s.cap_eff)
        .ok_or("cannot read this process's effective capabilities (CapEff)")?;
    let report = check_set(effective)?;
    for c in &report.missing {
        tracing::warn!(capability = c.cap, "{} missing: off: {}", c.cap, c.off);
    }
    Ok(REPORT.get_or_init(|| report))
}

/// What [`check`] found, once it ran.
pub fn report() -> Option<&'static Report> {
    REPORT.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(caps: &[u32]) -> u64 {
        caps.iter().fold(0, |s, b| s | 1 << b)
    }

    #[test]
    fn ebpf_capabilities_are_required_the_rest_reported() {
        let all: Vec<u32> = USED.iter().map(|c| c.bit).collect();
        let r = check_set(set(&all)).unwrap();
        assert!(r.missing.is_empty() && r.effective.len() == USED.len());
        let e = check_set(set(&all[1..])).unwrap_err();
        assert!(e.contains("CAP_BPF"), "{e}");
        let admin = check_set(set(&[SYS_ADMIN])).unwrap();
        assert!(admin.missing.iter().all(|c| c.bit != 39 && c.bit != 38));
        let no_ptrace: Vec<u32> = all.iter().copied().filter(|b| *b != 19).collect();
        let r = check_set(set(&no_ptrace)).unwrap();
        assert_eq!(r.missing.len(), 1);
        assert_eq!(r.missing[0].cap, "CAP_SYS_PTRACE");
    }
}
