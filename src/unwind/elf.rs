//! The parts of an ELF file unwind tables need (header, program headers,
//! section headers), read lazily: a file another user maps may claim
//! sections of gigabytes, so nothing else is read, and sizes are checked
//! before any section's bytes are.

use object::read::elf::{FileHeader, SectionTable};
use object::{elf, Endianness, ReadRef};

use super::table::TableError;

/// Largest `.eh_frame` read (the biggest seen, a compiler's shared
/// library, has about 20 MiB).
pub const MAX_EH_FRAME: u64 = 64 << 20;
/// Most section headers read: more than ELF's own 16-bit count is a
/// crafted file.
const MAX_SECTIONS: usize = 0xffff;

/// An ELF file's header, program headers and section headers, read without
/// touching anything else (symbol tables, debug info): a file another user
/// maps may claim a section of gigabytes.
pub(super) struct Elf<'d, R: ReadRef<'d>> {
    pub data: R,
    header: &'d elf::FileHeader64<Endianness>,
    pub endian: Endianness,
    sections: SectionTable<'d, elf::FileHeader64<Endianness>, R>,
}

pub(super) fn parse_elf<'d, R: ReadRef<'d>>(data: R) -> Result<Elf<'d, R>, TableError> {
    let ident = data.read_bytes_at(0, 5).map_err(|_| TableError::NotElf)?;
    if ident[..4] != elf::ELFMAG[..] {
        return Err(TableError::NotElf);
    }
    if ident[4] != elf::ELFCLASS64 {
        return Err(TableError::NotX86_64);
    }
    let header = elf::FileHeader64::<Endianness>::parse(data)?;
    let endian = header.endian()?;
    if header.e_machine(endian) != elf::EM_X86_64 {
        return Err(TableError::NotX86_64);
    }
    let count = header.shnum(endian, data)?;
    if count > MAX_SECTIONS {
        return Err(TableError::TooLarge {
            what: "section header table",
            size: count as u64,
            max: MAX_SECTIONS as u64,
        });
    }
    let sections = header.sections(endian, data)?;
    Ok(Elf {
        data,
        header,
        endian,
        sections,
    })
}

impl<'d, R: ReadRef<'d>> Elf<'d, R> {
    pub fn section(&self, name: &str) -> Option<&'d elf::SectionHeader64<Endianness>> {
        self.sections
            .section_by_name(self.endian, name.as_bytes())
            .map(|(_, s)| s)
    }

    pub fn program_headers(&self) -> Result<&'d [elf::ProgramHeader64<Endianness>], TableError> {
        Ok(self.header.program_headers(self.endian, self.data)?)
    }
}
