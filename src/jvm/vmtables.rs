//! Reading HotSpot's self-description (`gHotSpotVMStructs`,
//! `gHotSpotVMTypes`) out of one process, within a budget of reads:
//! the raw tables that [`super::vmstructs`] turns into a layout. Every
//! number here is the process's to choose, so each loop is bounded by
//! what a real JVM holds, never by what it reads.

use std::collections::HashMap;

use object::{Object, ObjectSymbol};

use super::vmstructs::{Field, LayoutError};
use crate::process::remote::{uint_at, Budget, Remote};

/// Entries read from either table at most (JDK 25 has about 3,000).
const MAX_ENTRIES: usize = 20_000;
/// Largest entry stride believed (entries are six words).
const MAX_STRIDE: u64 = 256;
/// Largest structure size believed; offsets beyond it are refused.
pub(super) const MAX_STRUCT: u64 = 4096;
/// Reads one parse may make: a real JVM needs a few hundred (strings are
/// read a page at a time); a forged table stops here.
pub const PARSE_CALLS: u64 = 4096;
/// Bytes one parse may read.
pub const PARSE_BYTES: u64 = 16 << 20;

/// The structures whose entries are kept while parsing.
const WANTED: &[&str] = &[
    "Abstract_VM_Version",
    "CodeCache",
    "GrowableArrayBase",
    "GenericGrowableArray",
    "GrowableArray<int>",
    "CodeHeap",
    "VirtualSpace",
    "HeapBlock",
    "CodeBlob",
    "CompiledMethod",
    "nmethod",
    "PcDesc",
    "Method",
    "ConstMethod",
    "ConstantPool",
    "Klass",
    "Symbol",
    "AbstractInterpreter",
    "StubQueue",
    "JVMFlag",
];

/// The tables as read: fields by (type, name), type sizes by name.
#[derive(Debug, Default)]
pub(super) struct Tables {
    /// (type, field) → (offset or static address, type string, static).
    pub(super) fields: HashMap<(String, String), (u64, String, bool)>,
    pub(super) sizes: HashMap<String, u64>,
}

impl Tables {
    pub(super) fn size(&self, ty: &str) -> Result<u64, LayoutError> {
        match self.sizes.get(ty) {
            Some(&s) if s > 0 && s <= MAX_STRUCT => Ok(s),
            Some(&s) => Err(LayoutError::Implausible(format!("sizeof({ty}) = {s}"))),
            None => Err(LayoutError::Missing(format!("sizeof({ty})"))),
        }
    }

    /// Width of a field of type `ty`: the VM's own size for it, pointers 8.
    pub(super) fn width(&self, ty: &str) -> usize {
        if ty.ends_with('*') {
            return 8;
        }
        match self.sizes.get(ty) {
            Some(&s @ (1 | 2 | 4 | 8)) => s as usize,
            _ => match ty {
                "u1" | "bool" | "jbyte" | "jboolean" | "int8_t" | "uint8_t" | "char" => 1,
                "u2" | "jushort" | "jshort" | "uint16_t" | "int16_t" | "short" => 2,
                "int" | "u4" | "jint" | "juint" | "int32_t" | "uint32_t" | "uint" => 4,
                _ => 8,
            },
        }
    }

    /// The first of `types` that has field `name`.
    pub(super) fn find(&self, types: &[&str], name: &str) -> Option<(u64, &str, bool)> {
        types.iter().find_map(|t| {
            self.fields
                .get(&(t.to_string(), name.to_string()))
                .map(|(v, ty, st)| (*v, ty.as_str(), *st))
        })
    }

    pub(super) fn opt_field(&self, types: &[&str], name: &str) -> Option<Field> {
        let (offset, ty, is_static) = self.find(types, name)?;
        (!is_static && offset < MAX_STRUCT).then(|| Field {
            offset,
            width: self.width(ty),
        })
    }

    pub(super) fn field(&self, types: &[&str], name: &str) -> Result<Field, LayoutError> {
        self.opt_field(types, name)
            .ok_or_else(|| LayoutError::Missing(format!("{}::{name}", types[0])))
    }

    /// A field holding a structure, whose own fields follow: its offset.
    pub(super) fn embedded(&self, ty: &str, name: &str) -> Result<u64, LayoutError> {
        Ok(self.field(&[ty], name)?.offset)
    }

    pub(super) fn static_addr(&self, ty: &str, name: &str) -> Result<u64, LayoutError> {
        match self.find(&[ty], name) {
            Some((addr, _, true)) if addr != 0 => Ok(addr),
            _ => Err(LayoutError::Missing(format!("{ty}::{name}"))),
        }
    }
}

/// Reads the tables of the libjvm `file`, loaded at `bias` in `pid`, and
/// the memory they were read through (its budget partly spent).
pub(super) fn read(
    pid: u32,
    file: &std::fs::File,
    bias: u64,
) -> Result<(Tables, Remote), LayoutError> {
    let symbols = exported(file)?;
    let mem = Remote::with_budget(pid, Budget::new(PARSE_CALLS, PARSE_BYTES));
    let read = |name: &'static str| -> Result<u64, LayoutError> {
        let value = symbols.get(name).ok_or(LayoutError::NoSymbol(name))?;
        mem.u64(bias + value)
            .map_err(|e| LayoutError::Read(format!("{name}: {e}")))
    };
    let mut tables = Tables::default();
    // Structs: typeName, fieldName, typeString, isStatic, offset, address.
    let stride = read("gHotSpotVMStructEntryArrayStride")?;
    let at = [
        read("gHotSpotVMStructEntryTypeNameOffset")?,
        read("gHotSpotVMStructEntryFieldNameOffset")?,
        read("gHotSpotVMStructEntryTypeStringOffset")?,
        read("gHotSpotVMStructEntryIsStaticOffset")?,
        read("gHotSpotVMStructEntryOffsetOffset")?,
        read("gHotSpotVMStructEntryAddressOffset")?,
    ];
    let mut names = Names::new(mem.clone());
    for_each_entry(&mem, read("gHotSpotVMStructs")?, stride, &at, |e| {
        let Some(ty) = names.get(uint_at(e, at[0] as usize, 8)) else {
            return;
        };
        if !WANTED.contains(&ty.as_str()) {
            return;
        }
        let (Some(field), type_string) = (
            names.get(uint_at(e, at[1] as usize, 8)),
            names.get(uint_at(e, at[2] as usize, 8)).unwrap_or_default(),
        ) else {
            return;
        };
        let is_static = uint_at(e, at[3] as usize, 4) != 0;
        let value = if is_static {
            uint_at(e, at[5] as usize, 8)
        } else {
            uint_at(e, at[4] as usize, 8)
        };
        tables
            .fields
            .insert((ty, field), (value, type_string, is_static));
    })?;
    // Types: typeName and size are all that is needed.
    let stride = read("gHotSpotVMTypeEntryArrayStride")?;
    let at = [
        read("gHotSpotVMTypeEntryTypeNameOffset")?,
        read("gHotSpotVMTypeEntrySizeOffset")?,
    ];
    for_each_entry(&mem, read("gHotSpotVMTypes")?, stride, &at, |e| {
        if let Some(ty) = names.get(uint_at(e, at[0] as usize, 8)) {
            tables.sizes.insert(ty, uint_at(e, at[1] as usize, 8));
        }
    })?;
    Ok((tables, mem))
}

/// The dynamic symbols of libjvm that name the tables.
fn exported(file: &std::fs::File) -> Result<HashMap<&'static str, u64>, LayoutError> {
    const NAMES: &[&str] = &[
        "gHotSpotVMStructs",
        "gHotSpotVMStructEntryArrayStride",
        "gHotSpotVMStructEntryTypeNameOffset",
        "gHotSpotVMStructEntryFieldNameOffset",
        "gHotSpotVMStructEntryTypeStringOffset",
        "gHotSpotVMStructEntryIsStaticOffset",
        "gHotSpotVMStructEntryOffsetOffset",
        "gHotSpotVMStructEntryAddressOffset",
        "gHotSpotVMTypes",
        "gHotSpotVMTypeEntryArrayStride",
        "gHotSpotVMTypeEntryTypeNameOffset",
        "gHotSpotVMTypeEntrySizeOffset",
    ];
    let data = object::ReadCache::new(file);
    let elf = object::File::parse(&data).map_err(|e| LayoutError::File(e.to_string()))?;
    let mut found = HashMap::new();
    for sym in elf.dynamic_symbols() {
        if let Ok(name) = sym.name() {
            if let Some(&n) = NAMES.iter().find(|&&n| n == name) {
                found.insert(n, sym.address());
            }
        }
    }
    Ok(found)
}

/// Strings of the tables by address: type names repeat on every field,
/// and all of them lie together in libjvm's read-only data, so they are
/// read a page at a time.
struct Names {
    mem: Remote,
    seen: HashMap<u64, Option<String>>,
    /// Pages read, by address (`None`: unreadable).
    pages: HashMap<u64, Option<Vec<u8>>>,
}

const PAGE: u64 = 4096;

impl Names {
    fn new(mem: Remote) -> Names {
        Names {
            mem,
            seen: HashMap::new(),
            pages: HashMap::new(),
        }
    }

    fn get(&mut self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        if let Some(known) = self.seen.get(&addr) {
            return known.clone();
        }
        let found = self.read(addr);
        self.seen.insert(addr, found.clone());
        found
    }

    fn read(&mut self, addr: u64) -> Option<String> {
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() <= crate::process::remote::MAX_CSTR {
            let page = at & !(PAGE - 1);
            let mem = &self.mem;
            let bytes = self
                .pages
                .entry(page)
                .or_insert_with(|| mem.bytes(page, PAGE as usize).ok())
                .as_ref()?;
            let chunk = &bytes[(at - page) as usize..];
            if let Some(end) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..end]);
                return (out.len() <= crate::process::remote::MAX_CSTR)
                    .then(|| String::from_utf8(out).ok())
                    .flatten();
            }
            out.extend_from_slice(chunk);
            at = page + PAGE;
        }
        None
    }
}

/// Calls `f` with each entry of the table at `base` until the entry whose
/// type name (at `at[0]`) is null, at most [`MAX_ENTRIES`].
fn for_each_entry(
    mem: &Remote,
    base: u64,
    stride: u64,
    at: &[u64],
    mut f: impl FnMut(&[u8]),
) -> Result<(), LayoutError> {
    if base == 0 || !(16..=MAX_STRIDE).contains(&stride) || at.iter().any(|&o| o + 8 > stride) {
        return Err(LayoutError::Implausible(format!(
            "table at {base:#x}, stride {stride}"
        )));
    }
    const CHUNK: usize = 256;
    for first in (0..MAX_ENTRIES).step_by(CHUNK) {
        let start = base + first as u64 * stride;
        // The table may end near the end of its mapping: entry by entry
        // when the whole chunk cannot be read.
        let buf = match mem.bytes(start, CHUNK * stride as usize) {
            Ok(buf) => buf,
            Err(_) => {
                let mut buf = Vec::new();
                for i in 0..CHUNK as u64 {
                    let e = mem
                        .bytes(start + i * stride, stride as usize)
                        .map_err(|e| LayoutError::Read(e.to_string()))?;
                    let end = uint_at(&e, at[0] as usize, 8) == 0;
                    buf.extend_from_slice(&e);
                    if end {
                        break;
                    }
                }
                buf
            }
        };
        for e in buf.chunks_exact(stride as usize) {
            if uint_at(e, at[0] as usize, 8) == 0 {
                return Ok(());
            }
            f(e);
        }
    }
    Err(LayoutError::Implausible("no end to the table".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_strings_read_a_page_at_a_time() {
        // The strings inside one page (where an allocation lands varies:
        // across a page boundary they would take a read more).
        let strings = b"CodeCache\0_heaps\0GrowableArray<CodeHeap*>*\0";
        let mut text = vec![0u8; 3 * PAGE as usize];
        let page_start = ((PAGE - text.as_ptr() as u64 % PAGE) % PAGE) as usize + 16;
        text[page_start..page_start + strings.len()].copy_from_slice(strings);
        let budget = Budget::new(3, 1 << 20);
        let mut names = Names::new(Remote::with_budget(std::process::id(), budget.clone()));
        let at = text[page_start..].as_ptr() as u64;
        assert_eq!(names.get(at).as_deref(), Some("CodeCache"));
        assert_eq!(names.get(at + 10).as_deref(), Some("_heaps"));
        assert_eq!(
            names.get(at + 17).as_deref(),
            Some("GrowableArray<CodeHeap*>*")
        );
        assert!(!budget.exhausted(), "a page or two for all three");
        let long = vec![b'x'; 3 * PAGE as usize];
        assert_eq!(names.get(long.as_ptr() as u64), None);
    }
}
