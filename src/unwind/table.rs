//! Compact x86-64 unwind tables built from an ELF file's `.eh_frame`.
//!
//! BPF walks user stacks by following frame pointers, which breaks in code
//! compiled without them (Debian's glibc, most distro libraries). To walk
//! through such code, user space evaluates each module's DWARF CFI once
//! (with `gimli`) and hands BPF a flat array of [`UnwindRow`]s sorted by pc,
//! the same layout as `struct ws_unwind_row` in the BPF code. A row applies
//! from its `pc` (an ELF virtual address of the module) up to the next row's
//! `pc` and says how to find the CFA (`rsp` or `rbp` plus an offset) and
//! where the caller's `rbp` was saved. The return address is always at
//! CFA-8 on x86-64, so it needs no column. Ranges without CFI get a
//! [`cfa::NONE`] row, outermost frames (return address undefined) a
//! [`cfa::END`] row, and anything BPF cannot evaluate (DWARF expressions,
//! other base registers, signal frames) a [`cfa::UNSUPPORTED`] row.
//! Consecutive rows with identical rules are merged.

use std::{fs::File, path::Path};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, EndianSlice, LittleEndian, Register, RegisterRule,
    UnwindContext, UnwindSection,
};
use object::read::elf::{ProgramHeader, SectionHeader};
use object::{elf, Endianness, ReadCache, ReadRef};

use super::elf::parse_elf;
pub use super::elf::MAX_EH_FRAME;

pub use crate::bpf::abi::{cfa, rbp, UnwindRow};

/// Share of code with frame pointers above which a module gets no table.
const FRAME_POINTER_MODULE: f64 = 0.98;

/// `.eh_frame` bytes per row of the table, at least: 5.1 in bash, 5.4 in
/// glibc, 5.9 in libstdc++, 7.7 in libjvm, 5.2 in cargo.
pub const EH_FRAME_BYTES_PER_ROW: u64 = 12;

/// Whether two rows have the same rule, whatever their pc.
fn same_rule(a: &UnwindRow, b: &UnwindRow) -> bool {
    UnwindRow { pc: 0, ..*a } == UnwindRow { pc: 0, ..*b }
}

/// Why a module's table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not an ELF file")]
    NotElf,
    #[error("not an x86-64 ELF file")]
    NotX86_64,
    #[error("no .eh_frame section")]
    NoEhFrame,
    #[error("{what} too large ({size} bytes, at most {max})")]
    TooLarge {
        what: &'static str,
        size: u64,
        max: u64,
    },
    #[error("more than {0} rows")]
    TooManyRows(usize),
    #[error("address {0:#x} does not fit in 32 bits")]
    AddressOverflow(u64),
    #[error("no PT_LOAD segment contains file offset {0:#x}")]
    NoSegment(u64),
    #[error("ELF parse error: {0}")]
    Elf(#[from] object::Error),
    #[error("CFI parse error: {0}")]
    Cfi(#[from] gimli::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A module's table.
#[derive(Debug, Clone)]
pub struct UnwindTable {
    /// Rows sorted by strictly increasing `pc`.
    pub rows: Vec<UnwindRow>,
    /// Share (0..1) of covered code bytes whose CFA is rbp-based after the
    /// prologue, i.e. compiled with frame pointers.
    pub frame_pointer_share: f64,
}

const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

/// A row without offsets (NONE, END, UNSUPPORTED), so that merging works.
fn special(pc: u64, cfa_reg: u8) -> UnwindRow {
    UnwindRow {
        pc: pc as u32,
        cfa_off: 0,
        rbp_off: 0,
        cfa_reg,
        rbp_rule: rbp::SAME,
    }
}

/// Translates one evaluated gimli row starting at `pc`.
fn convert<T: gimli::ReaderOffset>(
    pc: u64,
    row: &gimli::UnwindTableRow<T>,
    signal: bool,
) -> UnwindRow {
    match row.register(RA) {
        _ if signal => return special(pc, cfa::UNSUPPORTED),
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return special(pc, cfa::END),
        _ => return special(pc, cfa::UNSUPPORTED),
    }
    let (cfa_reg, cfa_off) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == RSP => (cfa::RSP, offset),
        CfaRule::RegisterAndOffset { register, offset } if register == RBP => (cfa::RBP, offset),
        _ => return special(pc, cfa::UNSUPPORTED),
    };
    let Ok(cfa_off) = i32::try_from(cfa_off) else {
        return special(pc, cfa::UNSUPPORTED);
    };
    let (rbp_rule, rbp_off) = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => (rbp::SAME, 0),
        Some(RegisterRule::Offset(off)) => match i16::try_from(off) {
            Ok(off) => (rbp::AT_CFA, off),
            Err(_) => (rbp::UNSUPPORTED, 0),
        },
        Some(_) => (rbp::UNSUPPORTED, 0),
    };
    UnwindRow {
        pc: pc as u32,
        cfa_off,
        rbp_off,
        cfa_reg,
        rbp_rule,
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// One FDE's rows, and how many of its bytes have CFA = rbp + 16.
fn eval_fde(
    fde: &gimli::FrameDescriptionEntry<Slice<'_>>,
    eh_frame: &EhFrame<Slice<'_>>,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
) -> gimli::Result<(Vec<UnwindRow>, u64)> {
    let signal = fde.is_signal_trampoline();
    let (mut rows, mut rbp16_bytes) = (Vec::new(), 0);
    let mut table = fde.rows(eh_frame, bases, ctx)?;
    while let Some(r) = table.next_row()? {
        let (lo, hi) = (r.start_address(), r.end_address().min(fde.end_address()));
        if lo >= hi {
            continue;
        }
        if let CfaRule::RegisterAndOffset {
            register: RBP,
            offset: 16,
        } = r.cfa()
        {
            rbp16_bytes += hi - lo;
        }
        rows.push(convert(lo, r, signal));
    }
    Ok((rows, rbp16_bytes))
}

/// One FDE's rows, before FDEs are merged into the module table.
struct FdeRows {
    start: u64,
    end: u64,
    rows: Vec<UnwindRow>,
}

impl UnwindTable {
    /// Builds the table of an x86-64 ELF file's `.eh_frame`.
    pub fn from_elf(data: &[u8]) -> Result<UnwindTable, TableError> {
        Self::from_read_ref(data, usize::MAX)
    }

    /// Builds the table of an open ELF file, reading only its headers and
    /// `.eh_frame` (at most [`MAX_EH_FRAME`] bytes).
    pub fn from_file(file: &File) -> Result<UnwindTable, TableError> {
        Self::from_read_ref(&ReadCache::new(file), usize::MAX)
    }

    /// [`UnwindTable::from_file`], giving up with
    /// [`TableError::TooManyRows`] when the table would surely have more
    /// than `max_rows` rows, so that a table that could not be loaded
    /// anyway (a compiler's huge library) costs little or nothing: at once
    /// when `.eh_frame` has more than [`EH_FRAME_BYTES_PER_ROW`] bytes per
    /// allowed row, else once the FDEs gave 1.5 times `max_rows` rows
    /// (merging removes few: FDEs give 1.02 times the final rows in glibc,
    /// 1.26 in libjvm).
    pub fn from_file_within(file: &File, max_rows: usize) -> Result<UnwindTable, TableError> {
        Self::from_read_ref(&ReadCache::new(file), max_rows)
    }

    fn from_read_ref<'d, R: ReadRef<'d>>(
        data: R,
        max_rows: usize,
    ) -> Result<UnwindTable, TableError> {
        let file = parse_elf(data)?;
        let endian = file.endian;
        for ph in file.program_headers()? {
            let end = ph.p_vaddr(endian).saturating_add(ph.p_memsz(endian));
            if ph.p_type(endian) == elf::PT_LOAD && end > 1 << 32 {
                return Err(TableError::AddressOverflow(end));
            }
        }
        let section = file.section(".eh_frame").ok_or(TableError::NoEhFrame)?;
        let size = section.sh_size(endian);
        if size > MAX_EH_FRAME {
            return Err(TableError::TooLarge {
                what: ".eh_frame",
                size,
                max: MAX_EH_FRAME,
            });
        }
        let mut bases = BaseAddresses::default().set_eh_frame(section.sh_addr(endian));
        if let Some(text) = file.section(".text") {
            bases = bases.set_text(text.sh_addr(endian));
        }
        if let Some(got) = file.section(".got") {
            bases = bases.set_got(got.sh_addr(endian));
        }
        if size / EH_FRAME_BYTES_PER_ROW > max_rows as u64 {
            return Err(TableError::TooManyRows(max_rows));
        }
        let bytes = section
            .data(endian, data)
            .map_err(|_| TableError::NoEhFrame)?;
        let eh_frame = EhFrame::new(bytes, LittleEndian);

        let mut ctx = Box::new(UnwindContext::new());
        let mut fdes = Vec::new();
        let mut fde_rows = 0usize;
        let (mut fp_bytes, mut total_bytes) = (0u64, 0u64);
        let mut entries = eh_frame.entries(&bases);
        while let Some(entry) = entries.next()? {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            // A bad FDE (e.g. a dangling CIE pointer) is skipped, its range
            // then reads as NONE; one whose CFI fails to evaluate is UNSUPPORTED.
            let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
                continue;
            };
            let (start, end) = (fde.initial_address(), fde.end_address());
            if start >= end || end > 1 << 32 {
                continue;
            }
            let (rows, rbp16_bytes) = eval_fde(&fde, &eh_frame, &bases, &mut ctx)
                .unwrap_or_else(|_| (vec![special(start, cfa::UNSUPPORTED)], 0));
            fde_rows += rows.len() + 1;
            if fde_rows / 3 * 2 > max_rows {
                return Err(TableError::TooManyRows(max_rows));
            }
            total_bytes += end - start;
            if rbp16_bytes * 2 > end - start {
                fp_bytes += end - start;
            }
            fdes.push(FdeRows { start, end, rows });
        }

        // Later starts win on overlap; equal starts keep .eh_frame order, so
        // the later entry wins. Pushing a row drops every row at or after its
        // pc, which keeps pcs strictly increasing and removes the NONE
        // terminator of an FDE that the next one starts right at.
        fdes.sort_by_key(|f| f.start);
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(fdes.len() * 4);
        let mut push = |row: UnwindRow| {
            let keep = rows.partition_point(|r| r.pc < row.pc);
            rows.truncate(keep);
            rows.push(row);
        };
        for fde in fdes {
            fde.rows.into_iter().for_each(&mut push);
            // `end` may be exactly 1 << 32: nothing follows, no terminator.
            if let Ok(pc) = u32::try_from(fde.end) {
                push(special(pc.into(), cfa::NONE));
            }
        }
        rows.dedup_by(|next, prev| same_rule(next, prev));

        let frame_pointer_share = if total_bytes == 0 {
            0.0
        } else {
            fp_bytes as f64 / total_bytes as f64
        };
        Ok(UnwindTable {
            rows,
            frame_pointer_share,
        })
    }

    /// Reads `path` and builds its table, see [`UnwindTable::from_elf`].
    pub fn from_path(path: &Path) -> Result<UnwindTable, TableError> {
        Self::from_elf(&std::fs::read(path)?)
    }

    /// Whether (nearly) all of the module's code keeps frame pointers, so
    /// that the frame-pointer walk needs no table. Mixed modules are common:
    /// a Rust release binary links a standard library built with frame
    /// pointers (88 % of the code) around user code built without.
    pub fn uses_frame_pointers(&self) -> bool {
        self.frame_pointer_share >= FRAME_POINTER_MODULE
    }

    /// The row covering `vaddr`: the last row with `pc <= vaddr`.
    pub fn find(&self, vaddr: u64) -> Option<&UnwindRow> {
        let i = self.rows.partition_point(|r| u64::from(r.pc) <= vaddr);
        i.checked_sub(1).map(|i| &self.rows[i])
    }
}

/// Translation of a runtime address to the module's vaddr space: the `bias`
/// such that `vaddr = addr - bias` (wrapping), for an executable mapping that
/// starts at `map_start` with file offset `map_offset`. Uses the PT_LOAD
/// segment containing that file offset (executable segments preferred):
/// `bias = map_start - map_offset - (p_vaddr - p_offset)`.
pub fn load_bias(data: &[u8], map_start: u64, map_offset: u64) -> Result<u64, TableError> {
    load_bias_in(data, map_start, map_offset)
}

/// [`load_bias`] of an open file, reading only its headers.
pub fn load_bias_of(file: &File, map_start: u64, map_offset: u64) -> Result<u64, TableError> {
    load_bias_in(&ReadCache::new(file), map_start, map_offset)
}

fn load_bias_in<'d, R: ReadRef<'d>>(
    data: R,
    map_start: u64,
    map_offset: u64,
) -> Result<u64, TableError> {
    const PAGE: u64 = 4096;
    let file = parse_elf(data)?;
    let endian = file.endian;
    let contains = |ph: &&elf::ProgramHeader64<Endianness>| {
        let off = ph.p_offset(endian);
        ph.p_type(endian) == elf::PT_LOAD
            && off & !(PAGE - 1) <= map_offset
            && map_offset < off.saturating_add(ph.p_filesz(endian))
    };
    let headers = file.program_headers()?;
    let ph = headers
        .iter()
        .filter(contains)
        .find(|ph| ph.p_flags(endian) & elf::PF_X != 0)
        .or_else(|| headers.iter().find(contains))
        .ok_or(TableError::NoSegment(map_offset))?;
    Ok(map_start
        .wrapping_sub(map_offset)
        .wrapping_sub(ph.p_vaddr(endian).wrapping_sub(ph.p_offset(endian))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};
    use std::time::Instant;

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    /// Address and size of `name` in the ELF's symtab or dynsym.
    fn symbol(data: &[u8], name: &str) -> Option<(u64, u64)> {
        let file = object::File::parse(data).unwrap();
        file.symbols()
            .chain(file.dynamic_symbols())
            .find(|s| {
                s.name()
                    .ok()
                    .is_some_and(|n| n == name || n.starts_with(&format!("{name}@")))
            })
            .map(|s| (s.address(), s.size()))
    }

    /// Rows starting in `[addr, addr + size)`.
    fn rows_in(t: &UnwindTable, (addr, size): (u64, u64)) -> Vec<UnwindRow> {
        let range = addr..addr + size;
        t.rows
            .iter()
            .filter(|r| range.contains(&u64::from(r.pc)))
            .copied()
            .collect()
    }

    #[test]
    fn reading_only_headers_and_eh_frame_gives_the_same_table() {
        let data = std::fs::read(LIBC).unwrap();
        let whole = UnwindTable::from_elf(&data).unwrap();
        let file = File::open(LIBC).unwrap();
        let parts = UnwindTable::from_file(&file).unwrap();
        assert_eq!(whole.rows, parts.rows);
        assert_eq!(
            load_bias(&data, 0x7f0000028000, 0x28000).unwrap(),
            load_bias_of(&file, 0x7f0000028000, 0x28000).unwrap()
        );
    }

    #[test]
    fn crafted_sizes_are_refused_before_reading() {
        // A 3 GB sparse file whose only section claims a 2 GB .eh_frame.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crafted.so");
        let mut data = std::fs::read(LIBC).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let eh = file.section_by_name(".eh_frame").unwrap();
        let (offset, _) = eh.file_range().unwrap();
        // Find the section header whose sh_offset is .eh_frame's and grow
        // its sh_size (offset 32 in an Elf64_Shdr).
        let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap()) as usize;
        let shnum = u16::from_le_bytes(data[0x3c..0x3e].try_into().unwrap()) as usize;
        let hdr = (0..shnum)
            .map(|i| shoff + i * 64)
            .find(|&h| u64::from_le_bytes(data[h + 24..h + 32].try_into().unwrap()) == offset)
            .unwrap();
        data[hdr + 32..hdr + 40].copy_from_slice(&(2u64 << 30).to_le_bytes());
        std::fs::write(&path, &data).unwrap();
        let f = File::options().write(true).open(&path).unwrap();
        f.set_len(3 << 30).unwrap();
        let err = UnwindTable::from_file(&File::open(&path).unwrap()).unwrap_err();
        assert!(matches!(err, TableError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn libc_table() {
        let data = std::fs::read(LIBC).unwrap();
        let t0 = Instant::now();
        let t = UnwindTable::from_elf(&data).unwrap();
        let took = t0.elapsed();
        println!(
            "libc: {} rows, {} bytes ({:.2} MiB), built in {took:?}; frame_pointer_share {:.3}",
            t.rows.len(),
            t.rows.len() * 12,
            (t.rows.len() * 12) as f64 / (1 << 20) as f64,
            t.frame_pointer_share
        );
        let names = ["rsp", "rbp", "none", "end", "unsupported"];
        for (reg, name) in (cfa::RSP..=cfa::UNSUPPORTED).zip(names) {
            let n = t.rows.iter().filter(|r| r.cfa_reg == reg).count();
            println!("  cfa {name}: {n} rows");
        }
        for r in t
            .rows
            .iter()
            .filter(|r| r.cfa_reg >= cfa::END || r.rbp_rule == rbp::UNSUPPORTED)
        {
            println!("  {r:x?}");
        }
        assert!(t.rows.len() > 10_000);
        assert!(!t.uses_frame_pointers());
        // A limit the table meets builds it whole; a much lower one gives up.
        let file = File::open(LIBC).unwrap();
        let within = UnwindTable::from_file_within(&file, t.rows.len()).unwrap();
        assert_eq!(within.rows, t.rows);
        let err = UnwindTable::from_file_within(&file, t.rows.len() / 8).unwrap_err();
        assert!(matches!(err, TableError::TooManyRows(_)), "{err}");
        assert!(t.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert!(t.rows.windows(2).all(|w| !same_rule(&w[0], &w[1])));
    }

    #[test]
    fn clang_with_and_without_frame_pointers() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("t.c");
        std::fs::write(
            &src,
            r#"
            #include <stdio.h>
            __attribute__((noinline)) long ext(long x) { return x * 3 + 1; }
            __attribute__((noinline)) long many_live(long a, long b, long c, long d) {
                long s = 0;
                for (long i = 0; i < a; i++) {
                    s += ext(i) * b + ext(s) * c + d;
                    printf("%ld %ld %ld %ld\n", a, b, c, s);
                }
                return s + a + b + c + d;
            }
            __attribute__((noinline)) long loops(long n) {
                long s = 0;
                for (long i = 0; i < n; i++) s += many_live(i, n, s, i * 2);
                return s;
            }
            int main(int argc, char **argv) {
                printf("%ld\n", loops(argc) + many_live(argc, 2, 3, 4));
                return 0;
            }
            "#,
        )
        .unwrap();
        let build = |name: &str, flags: &[&str]| {
            let out = dir.path().join(name);
            let status = std::process::Command::new("/usr/bin/clang")
                .args(flags)
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .status()
                .expect("clang");
            assert!(status.success());
            std::fs::read(out).unwrap()
        };
        let nofp = build("nofp", &["-O2", "-fomit-frame-pointer"]);
        let fp = build(
            "fp",
            &[
                "-O1",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
            ],
        );
        let t_nofp = UnwindTable::from_elf(&nofp).unwrap();
        let t_fp = UnwindTable::from_elf(&fp).unwrap();
        println!(
            "clang: -fomit-frame-pointer share {:.3} ({} rows), -fno-omit-frame-pointer share {:.3} ({} rows)",
            t_nofp.frame_pointer_share,
            t_nofp.rows.len(),
            t_fp.frame_pointer_share,
            t_fp.rows.len()
        );
        assert!(!t_nofp.uses_frame_pointers());
        assert!(t_nofp.frame_pointer_share < 0.05);
        // Startup code and the PLT keep no frame pointer even here: the
        // module is mostly, not wholly, walkable by frame pointers.
        assert!(t_fp.frame_pointer_share > 0.5);

        for f in ["ext", "many_live", "loops", "main"] {
            let (addr, _) = symbol(&nofp, f).unwrap();
            let row = t_nofp.find(addr).unwrap();
            assert_eq!(
                (row.pc as u64, row.cfa_reg, row.cfa_off),
                (addr, cfa::RSP, 8),
                "{f}"
            );
        }
        let inside = rows_in(&t_nofp, symbol(&nofp, "many_live").unwrap());
        assert!(inside
            .iter()
            .any(|r| r.cfa_reg == cfa::RSP && r.cfa_off > 8));

        // With frame pointers: CFA = rbp + 16 and rbp saved at CFA-16 in the body.
        let (addr, size) = symbol(&fp, "many_live").unwrap();
        let row = t_fp.find(addr + size / 2).unwrap();
        assert_eq!(
            (row.cfa_reg, row.cfa_off, row.rbp_rule, row.rbp_off),
            (cfa::RBP, 16, rbp::AT_CFA, -16)
        );
    }

    #[test]
    fn libc_load_bias() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.contains(" r-xp ") && l.ends_with("/libc.so.6"))
            .expect("libc r-xp mapping");
        let f: Vec<&str> = line.split_whitespace().collect();
        let (start, end) = f[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let offset = u64::from_str_radix(f[2], 16).unwrap();
        let data = std::fs::read(f[5]).unwrap();
        let bias = load_bias(&data, start, offset).unwrap();

        let addr = libc::getpid as *const () as usize as u64;
        assert!(
            (start..end).contains(&addr),
            "getpid {addr:#x} not in {line}"
        );
        let vaddr = addr.wrapping_sub(bias);
        let file = object::File::parse(&*data).unwrap();
        let text = file.section_by_name(".text").unwrap();
        assert!((text.address()..text.address() + text.size()).contains(&vaddr));
        assert_eq!(Some(vaddr), symbol(&data, "getpid").map(|s| s.0));
        let t = UnwindTable::from_elf(&data).unwrap();
        let row = t.find(vaddr).unwrap();
        println!("{line}\nbias {bias:#x}, getpid at {vaddr:#x}: {row:?}");
        assert_ne!(row.cfa_reg, cfa::NONE);
    }

    #[test]
    fn libc_signal_trampoline_and_clone() {
        let data = std::fs::read(LIBC).unwrap();
        let t = UnwindTable::from_elf(&data).unwrap();
        match symbol(&data, "__restore_rt") {
            Some((addr, _)) => assert_eq!(t.find(addr).unwrap().cfa_reg, cfa::UNSUPPORTED),
            None => {
                // Stripped libc: find `mov $15, %rax; syscall` (rt_sigreturn),
                // which is __restore_rt's body.
                println!("note: no __restore_rt symbol, locating it by its code");
                let file = object::File::parse(&*data).unwrap();
                let text = file.section_by_name(".text").unwrap();
                let code = text.data().unwrap();
                let pat = [0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05];
                let hits: Vec<u64> = (0..code.len() - pat.len())
                    .filter(|&i| code[i..i + pat.len()] == pat)
                    .map(|i| text.address() + i as u64)
                    .collect();
                println!("rt_sigreturn sequences at {hits:x?}");
                assert!(!hits.is_empty());
                for addr in hits {
                    assert_eq!(t.find(addr).unwrap().cfa_reg, cfa::UNSUPPORTED, "{addr:#x}");
                }
            }
        }
        // glibc's __clone marks the child's entry (after the syscall)
        // `cfi_undefined (rip)`: the outermost frame of every new thread.
        let rows = rows_in(&t, symbol(&data, "__clone").unwrap());
        println!("__clone: {rows:x?}");
        assert!(rows.iter().any(|r| r.cfa_reg == cfa::END));
    }
}
