//! How a thread pointer leads to `otel_thread_ctx_v1` in one process:
//! from the facts of the files it maps ([`super::elf_tls`]) and the slots
//! the dynamic loader filled in its memory, read with its budget. Every
//! value read is the process's to choose, so each is checked to be
//! plausible (an offset within [`MAX_TP_OFFSET`], a module id below
//! [`MAX_MODULE`], a descriptor pointer inside one of its mappings)
//! before it is handed to BPF.

use super::elf_tls::{executable_tp_offset, Site, SiteKind, TlsFacts};
use crate::{bpf::otel::OtelTls, process::remote::Remote};

/// Largest distance from the thread pointer to a static TLS variable
/// believed (glibc's static TLS is a few KiB past the program's block).
pub const MAX_TP_OFFSET: i64 = 1 << 20;
/// Module ids believed (glibc counts loaded modules with TLS).
pub const MAX_MODULE: u64 = 4096;
/// Largest offset of the variable in its module's block.
pub const MAX_DTV_OFFSET: u64 = 1 << 20;

/// Why no access could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// No file mapped has the variable.
    Absent,
    /// A slot not filled in yet (lazy binding): to try again later.
    Pending,
    /// A slot could not be read, or holds an implausible value.
    Implausible,
}

/// One file the process maps, with where it is loaded.
pub struct Loaded<'a> {
    pub facts: &'a TlsFacts,
    pub bias: u64,
}

/// Resolves the access from the files `loaded`, reading slots through
/// `remote`; `mapped(addr)` says whether `addr` lies in one of the
/// process's mappings. Relocations come first (they are what the code
/// itself uses); a variable the program defines and reaches without one
/// (local exec) is at its place in module 1's block.
pub fn resolve(
    loaded: &[Loaded<'_>],
    remote: &Remote,
    mapped: &dyn Fn(u64) -> bool,
) -> Result<OtelTls, Unresolved> {
    let mut last = Unresolved::Absent;
    for l in loaded {
        for site in &l.facts.sites {
            match from_site(site, l, remote, mapped) {
                Ok(a) => return Ok(a),
                Err(e) => last = e,
            }
        }
    }
    if last != Unresolved::Absent {
        return Err(last);
    }
    let program = loaded.iter().find(|l| l.facts.executable);
    if let Some(f) = program.map(|l| l.facts) {
        if let (Some(offset), Some(segment)) = (f.defined, f.segment) {
            let tp_offset = executable_tp_offset(segment, offset).ok_or(Unresolved::Implausible)?;
            return Ok(OtelTls::Static { tp_offset });
        }
    }
    Err(Unresolved::Absent)
}

fn from_site(
    site: &Site,
    l: &Loaded<'_>,
    remote: &Remote,
    mapped: &dyn Fn(u64) -> bool,
) -> Result<OtelTls, Unresolved> {
    let slot = l
        .bias
        .checked_add(site.slot)
        .ok_or(Unresolved::Implausible)?;
    let word = |at: u64| remote.u64(at).map_err(|_| Unresolved::Implausible);
    match site.kind {
        SiteKind::TpOff => static_offset(word(slot)? as i64),
        // General dynamic: the GOT holds a `tls_index` {module, offset},
        // the offset filled in by its DTPOFF64 relocation.
        SiteKind::DtpMod => {
            let module = word(slot)?;
            let offset = word(slot.checked_add(8).ok_or(Unresolved::Implausible)?)?;
            dtv(module, offset)
        }
        SiteKind::TlsDesc => {
            let arg = word(slot.checked_add(8).ok_or(Unresolved::Implausible)?)?;
            // Resolved to static TLS: the argument is the (negative) tp
            // offset. Resolved to dynamic TLS: a pointer to {module,
            // offset, generation}. Not resolved yet (lazy): a pointer
            // to something else, most often the relocation itself.
            if let Ok(a) = static_offset(arg as i64) {
                return Ok(a);
            }
            if arg == 0 || !mapped(arg) {
                return Err(Unresolved::Pending);
            }
            let (module, offset) = (word(arg)?, word(arg + 8)?);
            dtv(module, offset).map_err(|_| Unresolved::Pending)
        }
    }
}

fn static_offset(tp_offset: i64) -> Result<OtelTls, Unresolved> {
    if (-MAX_TP_OFFSET..0).contains(&tp_offset) {
        Ok(OtelTls::Static { tp_offset })
    } else {
        Err(Unresolved::Implausible)
    }
}

fn dtv(module: u64, offset: u64) -> Result<OtelTls, Unresolved> {
    if (1..MAX_MODULE).contains(&module) && offset < MAX_DTV_OFFSET {
        Ok(OtelTls::Dtv { module, offset })
    } else {
        Err(Unresolved::Implausible)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otelctx::elf_tls::TlsSegment;

    fn facts(sites: Vec<Site>) -> TlsFacts {
        TlsFacts {
            sites,
            ..TlsFacts::default()
        }
    }

    /// Slots laid out in this test's memory, the bias 0.
    fn with_slots(words: &[u64], kind: SiteKind) -> Result<OtelTls, Unresolved> {
        let f = facts(vec![Site {
            kind,
            slot: words.as_ptr() as u64,
        }]);
        let me = Remote::new(std::process::id());
        let loaded = [Loaded { facts: &f, bias: 0 }];
        resolve(&loaded, &me, &|a| a > 4096)
    }

    #[test]
    fn each_relocation_kind_gives_its_access() {
        let tp = (-0x80i64) as u64;
        assert_eq!(
            with_slots(&[tp], SiteKind::TpOff),
            Ok(OtelTls::Static { tp_offset: -0x80 })
        );
        assert_eq!(
            with_slots(&[0x1234, tp], SiteKind::TlsDesc),
            Ok(OtelTls::Static { tp_offset: -0x80 })
        );
        let desc = [3u64, 0x10, 1];
        assert_eq!(
            with_slots(&[0x1234, desc.as_ptr() as u64], SiteKind::TlsDesc),
            Ok(OtelTls::Dtv {
                module: 3,
                offset: 0x10
            })
        );
        assert_eq!(
            with_slots(&[2, 0x18], SiteKind::DtpMod),
            Ok(OtelTls::Dtv {
                module: 2,
                offset: 0x18
            })
        );
    }

    #[test]
    fn implausible_or_unresolved_slots_are_refused() {
        assert_eq!(
            with_slots(&[1 << 40], SiteKind::TpOff),
            Err(Unresolved::Implausible)
        );
        assert_eq!(
            with_slots(&[(-(2i64 << 20)) as u64], SiteKind::TpOff),
            Err(Unresolved::Implausible)
        );
        // A lazy slot: its argument points at a relocation.
        let rela = [0x4000u64, 0x24, 0];
        assert_eq!(
            with_slots(&[0x1234, rela.as_ptr() as u64], SiteKind::TlsDesc),
            Err(Unresolved::Pending)
        );
        assert_eq!(
            with_slots(&[0x1234, 64], SiteKind::TlsDesc),
            Err(Unresolved::Pending)
        );
        assert_eq!(
            with_slots(&[5000, 0], SiteKind::DtpMod),
            Err(Unresolved::Implausible)
        );
    }

    #[test]
    fn a_program_reaching_its_own_variable_needs_no_slot() {
        let f = TlsFacts {
            defined: Some(8),
            executable: true,
            segment: Some(TlsSegment {
                vaddr: 0x3de8,
                memsz: 16,
                align: 8,
            }),
            ..TlsFacts::default()
        };
        let loaded = [Loaded { facts: &f, bias: 0 }];
        let me = Remote::new(std::process::id());
        assert_eq!(
            resolve(&loaded, &me, &|_| true),
            Ok(OtelTls::Static { tp_offset: -8 })
        );
        assert_eq!(resolve(&[], &me, &|_| true), Err(Unresolved::Absent));
    }
}
