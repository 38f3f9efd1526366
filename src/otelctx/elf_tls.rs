//! What one ELF file says of `otel_thread_ctx_v1` (OTEP 4947): whether it
//! defines it (in `.dynsym`, type `STT_TLS`) and where its TLS segment
//! is, and the relocations by which code reaches it (TPOFF64: initial
//! exec; TLSDESC; DTPMOD64/DTPOFF64: general dynamic), whose slots the
//! dynamic loader filled in the process's memory. Pure: the file's bytes
//! in, facts out; the process's memory is read by [`super::resolve`].
//!
//! A file another user maps may be crafted: only the headers, `.dynsym`,
//! its strings and the `SHT_RELA` sections linked to it are read, each at
//! most [`MAX_SECTION_BYTES`], and at most [`MAX_SITES`] relocations kept.

use object::{
    elf,
    read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym},
    Endianness, ReadRef,
};

/// The variable's name.
pub const SYMBOL: &[u8] = b"otel_thread_ctx_v1";
/// Largest `.dynsym` or relocation section read.
pub const MAX_SECTION_BYTES: u64 = 64 << 20;
/// Relocations against the variable kept per file (a real one has one or
/// two).
pub const MAX_SITES: usize = 8;

/// A relocation against the variable: which kind, where its slot is (a
/// virtual address of the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    pub kind: SiteKind,
    pub slot: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKind {
    /// `R_X86_64_TPOFF64`: the slot holds the thread-pointer offset.
    TpOff,
    /// `R_X86_64_TLSDESC`: 16 bytes, resolver and argument.
    TlsDesc,
    /// `R_X86_64_DTPMOD64`: the slot holds the module id, the next one
    /// (its `R_X86_64_DTPOFF64`) the variable's offset in the block.
    DtpMod,
}

/// The file's TLS segment (`PT_TLS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub align: u64,
}

/// What a file says of the variable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFacts {
    /// Its offset in this file's TLS block, if this file defines it.
    pub defined: Option<u64>,
    pub segment: Option<TlsSegment>,
    /// Whether the file is a program (has `PT_INTERP` or is `ET_EXEC`):
    /// its TLS block is module 1, laid out first below the thread pointer.
    pub executable: bool,
    pub sites: Vec<Site>,
    /// `PT_LOAD` segments as (file offset, virtual address), to find
    /// where the file is loaded from one of its mappings.
    pub loads: Vec<(u64, u64)>,
}

impl TlsFacts {
    /// Whether the variable is anywhere in this file.
    pub fn any(&self) -> bool {
        self.defined.is_some() || !self.sites.is_empty()
    }

    /// The load bias of the file mapped at `start` from file offset
    /// `offset` (a mapping of one of its `PT_LOAD` segments).
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let &(p_offset, p_vaddr) = self
            .loads
            .iter()
            .filter(|(o, _)| *o & !0xfff <= offset)
            .max_by_key(|(o, _)| *o)?;
        let vaddr = p_vaddr.checked_sub(p_offset)?.checked_add(offset)?;
        start.checked_sub(vaddr)
    }
}

/// Why a file's facts could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfError {
    NotElf,
    TooBig,
    Malformed,
}

impl From<object::read::Error> for ElfError {
    fn from(_: object::read::Error) -> ElfError {
        ElfError::Malformed
    }
}

/// Reads the facts of the ELF file `data`.
pub fn facts<'d, R: ReadRef<'d>>(data: R) -> Result<TlsFacts, ElfError> {
    let ident = data.read_bytes_at(0, 5).map_err(|_| ElfError::NotElf)?;
    if ident[..4] != elf::ELFMAG[..] || ident[4] != elf::ELFCLASS64 {
        return Err(ElfError::NotElf);
    }
    let header = elf::FileHeader64::<Endianness>::parse(data)?;
    let e = header.endian()?;
    if header.e_machine(e) != elf::EM_X86_64 {
        return Err(ElfError::NotElf);
    }
    let mut out = TlsFacts {
        executable: header.e_type(e) == elf::ET_EXEC,
        ..TlsFacts::default()
    };
    for ph in header.program_headers(e, data)? {
        match ph.p_type(e) {
            elf::PT_LOAD => out.loads.push((ph.p_offset(e), ph.p_vaddr(e))),
            elf::PT_INTERP => out.executable = true,
            elf::PT_TLS => {
                out.segment = Some(TlsSegment {
                    vaddr: ph.p_vaddr(e),
                    memsz: ph.p_memsz(e),
                    align: ph.p_align(e).max(1),
                })
            }
            _ => {}
        }
    }
    let sections = header.sections(e, data)?;
    let Some((dynsym_index, dynsym)) = sections
        .enumerate()
        .find(|(_, s)| s.sh_type(e) == elf::SHT_DYNSYM)
    else {
        return Ok(out);
    };
    if dynsym.sh_size(e) > MAX_SECTION_BYTES {
        return Err(ElfError::TooBig);
    }
    let symbols = sections.symbols(e, data, elf::SHT_DYNSYM)?;
    let strings = symbols.strings();
    // The variable's index: defined here, or imported (undefined) to be
    // reached through a relocation.
    let Some((index, sym)) = symbols
        .enumerate()
        .find(|(_, s)| s.name(e, strings) == Ok(SYMBOL))
    else {
        return Ok(out);
    };
    if sym.st_type() == elf::STT_TLS && sym.st_shndx(e) != elf::SHN_UNDEF {
        out.defined = Some(sym.st_value(e));
    }
    for s in sections.iter() {
        if s.sh_type(e) != elf::SHT_RELA || s.link(e) != dynsym_index {
            continue;
        }
        if s.sh_size(e) > MAX_SECTION_BYTES {
            return Err(ElfError::TooBig);
        }
        let Some((relas, _)) = s.rela(e, data)? else {
            continue;
        };
        for r in relas {
            if r.r_sym(e, false) as usize != index.0 {
                continue;
            }
            let kind = match r.r_type(e, false) {
                elf::R_X86_64_TPOFF64 => SiteKind::TpOff,
                elf::R_X86_64_TLSDESC => SiteKind::TlsDesc,
                elf::R_X86_64_DTPMOD64 => SiteKind::DtpMod,
                _ => continue,
            };
            if out.sites.len() < MAX_SITES {
                out.sites.push(Site {
                    kind,
                    slot: r.r_offset(e),
                });
            }
        }
    }
    Ok(out)
}

/// The thread-pointer offset of a variable at `offset` in the TLS block
/// of the program itself (module 1), as glibc lays it out on x86_64
/// (TLS variant II, `_dl_determine_tlsoffset`): the block ends at the
/// thread pointer, its start rounded to the segment's alignment keeping
/// `p_vaddr`'s offset within it.
pub fn executable_tp_offset(segment: TlsSegment, offset: u64) -> Option<i64> {
    let align = segment.align;
    if !align.is_power_of_two() || segment.memsz > 1 << 30 || offset >= segment.memsz.max(1) {
        return None;
    }
    let firstbyte = align.wrapping_sub(segment.vaddr & (align - 1)) & (align - 1);
    let block = segment.memsz.saturating_sub(firstbyte).div_ceil(align) * align + firstbyte;
    Some(offset as i64 - block as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_block_ends_at_the_thread_pointer() {
        let seg = |vaddr, memsz, align| TlsSegment {
            vaddr,
            memsz,
            align,
        };
        assert_eq!(executable_tp_offset(seg(0x3df0, 8, 8), 0), Some(-8));
        assert_eq!(executable_tp_offset(seg(0x3df0, 12, 8), 4), Some(-12));
        assert_eq!(
            executable_tp_offset(seg(0x3dc0, 0x41, 64), 0x40),
            Some(-0x40)
        );
        // p_vaddr 8 bytes into a 16-byte alignment: the block keeps it.
        assert_eq!(executable_tp_offset(seg(0x1008, 8, 16), 0), Some(-8));
        assert_eq!(executable_tp_offset(seg(0x1008, 24, 16), 0), Some(-24));
        assert_eq!(executable_tp_offset(seg(0, 8, 3), 0), None);
        assert_eq!(executable_tp_offset(seg(0, 8, 8), 8), None);
    }

    #[test]
    fn a_file_is_loaded_where_its_mapping_says() {
        let f = TlsFacts {
            loads: vec![(0, 0), (0x1000, 0x1000), (0x2df0, 0x3df0)],
            ..TlsFacts::default()
        };
        assert_eq!(f.bias(0x7f00_0000_1000, 0x1000), Some(0x7f00_0000_0000));
        assert_eq!(f.bias(0x7f00_0000_3000, 0x2000), Some(0x7f00_0000_0000));
    }

    /// Facts of `tests/workloads/otel_writer.c` built by gcc with `flags`.
    fn writer(out: &str, flags: &[&str]) -> TlsFacts {
        let dir = std::env::temp_dir().join(format!("otelctx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/workloads/otel_writer.c");
        let bin = dir.join(out);
        let status = std::process::Command::new("gcc")
            .args(["-O1", "-pthread"])
            .args(flags)
            .arg("-o")
            .arg(&bin)
            .arg(src)
            .status()
            .unwrap();
        assert!(status.success());
        facts(&std::fs::read(&bin).unwrap()[..]).unwrap()
    }

    #[test]
    fn each_access_model_leaves_its_relocation() {
        let lib = ["-DOTEL_PART_LIB", "-shared", "-fPIC"];
        let kinds = |f: &TlsFacts| f.sites.iter().map(|s| s.kind).collect::<Vec<_>>();
        let desc = writer("desc.so", &[&lib[..], &["-mtls-dialect=gnu2"]].concat());
        assert_eq!((desc.defined, desc.executable), (Some(0), false));
        assert_eq!(kinds(&desc), [SiteKind::TlsDesc]);
        let gd = writer("gd.so", &[&lib[..], &["-mtls-dialect=gnu"]].concat());
        assert_eq!(kinds(&gd), [SiteKind::DtpMod]);
        let ie = writer("ie.so", &[&lib[..], &["-ftls-model=initial-exec"]].concat());
        assert_eq!(kinds(&ie), [SiteKind::TpOff]);
        let exe = writer("exe", &["-DOTEL_TLS_IN_EXE", "-rdynamic"]);
        assert!(exe.executable && exe.sites.is_empty());
        assert_eq!(
            (exe.defined, exe.segment.map(|s| s.memsz)),
            (Some(0), Some(8))
        );
    }

    #[test]
    fn files_without_the_variable_or_not_elf() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        let f = facts(&me[..]).unwrap();
        assert!(!f.any() && !f.loads.is_empty());
        assert_eq!(facts(&b"not an elf file"[..]), Err(ElfError::NotElf));
        let mut cut = me[..200].to_vec();
        cut[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(facts(&cut[..]).is_err());
    }
}
