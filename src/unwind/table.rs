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

use crate::bpf::abi::{cfa, rbp, UnwindRow};

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
mod tests;
