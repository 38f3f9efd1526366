//! HotSpot's description of itself: the `gHotSpotVMStructs` and
//! `gHotSpotVMTypes` tables libjvm exports for debuggers (the
//! Serviceability Agent reads them too). They give the offset and type of
//! every field wallscope reads in a JVM, so what changed between JDK
//! versions (an offset, a pointer that became an offset, a field that
//! moved to another structure) is read from the VM, not hard-coded.
//!
//! A layout is read from the very process it is used for, never shared
//! between processes: any user can `dlopen` the system's libjvm and
//! rewrite these tables in their own copy, and a layout taken from that
//! copy must not choose what is read (or written) in anyone else's JVM.
//! [`Layouts::of`] parses it once per process (pid and start time), with a
//! bounded number of reads, and keeps statics as offsets from the load
//! bias.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::vmtables::Tables;
use crate::process::{
    files::{hotspot_libjvm_in, ExecMapping},
    live::exec_mappings,
    remote::{uint_at, Remote},
};

/// Processes whose layout (or failure) is remembered (about 1 KiB each).
pub const MAX_PROCESSES: usize = 1024;
/// Why a JVM's structures cannot be read: its frames then come from its
/// perf map only.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("no libjvm.so mapping")]
    NoLibjvm,
    #[error("libjvm.so: {0}")]
    File(String),
    #[error("libjvm.so exports no {0}")]
    NoSymbol(&'static str),
    #[error("reading the JVM's memory: {0}")]
    Read(String),
    #[error("the JVM's tables lack {0}")]
    Missing(String),
    #[error("the JVM's tables are implausible: {0}")]
    Implausible(String),
}

/// A field: where it is in its structure and how wide it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u64,
    pub width: usize,
}

impl Field {
    /// Its value in `buf`, a copy of the structure.
    pub fn get(&self, buf: &[u8]) -> u64 {
        uint_at(buf, self.offset as usize, self.width)
    }

    /// Reads it from the structure at `base`.
    pub fn read(&self, mem: &Remote, base: u64) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        mem.read(base + self.offset, &mut b[..self.width])?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Where a code blob's instructions start: a pointer (JDK 9-22) or an
/// offset from the blob (JDK 23+).
#[derive(Debug, Clone, Copy)]
pub enum CodeStart {
    Pointer(Field),
    Offset(Field),
}

/// Where an nmethod keeps its metadata (the `Method*`s its scopes name),
/// scope descriptors and the pc table that leads to them.
#[derive(Debug, Clone, Copy)]
pub enum NmethodData {
    /// JDK 9-22: all inside the blob; metadata up to the scopes, scopes up
    /// to the pc descriptors, pc descriptors up to the dependencies.
    InBlob {
        metadata_offset: Field,
        scopes_data_begin: Field,
        scopes_pcs_offset: Field,
        dependencies_offset: Field,
    },
    /// JDK 23+: scopes and pc descriptors in a separate immutable block;
    /// metadata after the code (23-24) or in the mutable data (25+).
    Immutable {
        immutable_data: Field,
        immutable_data_size: Field,
        scopes_pcs_offset: Field,
        scopes_data_offset: Field,
        ref_count_offset: Option<Field>,
        metadata: MetadataPlace,
    },
}

/// Where JDK 23+ keeps an nmethod's metadata.
#[derive(Debug, Clone, Copy)]
pub enum MetadataPlace {
    /// `blob + data_offset + metadata_offset`, up to the blob's size.
    AfterCode {
        data_offset: Field,
        metadata_offset: Field,
        size: Field,
    },
    /// `mutable_data + relocation_size`, up to the mutable data's size.
    Mutable {
        mutable_data: Field,
        relocation_size: Field,
        mutable_data_size: Field,
    },
}

/// What wallscope reads in a HotSpot JVM, as this libjvm lays it out.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The VM's major version (`Abstract_VM_Version::_vm_major_version`).
    pub major: u32,
    /// Statics, as offsets from the load bias.
    pub code_heaps: u64,
    pub interpreter_code: u64,
    pub array_len: Field,
    pub array_data: Field,
    pub heap_memory: u64,
    pub heap_segmap: u64,
    pub heap_log2_segment: Field,
    pub space_low: Field,
    pub space_high: Field,
    pub heap_block_size: u64,
    pub blob_name: Field,
    pub blob_code: CodeStart,
    /// `CodeBlob::_frame_size` (words) and `_frame_complete_offset`
    /// (bytes from the code's start), for the BPF walk; none where the
    /// VM does not describe them.
    pub blob_frame: Option<(Field, Field)>,
    pub nm_compile_id: Field,
    pub nm_comp_level: Option<Field>,
    pub nm_method: Field,
    pub nm_data: NmethodData,
    /// Bytes of an nmethod header worth reading: past every field above.
    pub nm_header: u64,
    pub pc_desc_size: u64,
    pub pc_offset: Field,
    pub pc_scope_offset: Field,
    pub method_const: Field,
    pub const_constants: Field,
    pub const_name_index: Field,
    pub pool_size: u64,
    pub pool_holder: Field,
    pub klass_name: Field,
    pub symbol_length: Field,
    pub symbol_body: u64,
    pub queue_buffer: Field,
    pub queue_limit: Field,
    /// The VM's flags (`JVMFlag::flags`, a static), when described.
    pub flags: Option<FlagTable>,
}

/// The VM's table of `-XX` flags: `count` entries of `size` bytes.
#[derive(Debug, Clone, Copy)]
pub struct FlagTable {
    /// Statics, as offsets from the load bias.
    pub array: u64,
    pub count: u64,
    pub size: u64,
    pub name: Field,
    pub addr: Field,
}

impl Layout {
    fn from_tables(t: &Tables, mem: &Remote, bias: u64) -> Result<Layout, LayoutError> {
        let blob = ["CodeBlob"];
        let nm = ["nmethod", "CompiledMethod"];
        let major_at = t.static_addr("Abstract_VM_Version", "_vm_major_version")?;
        let mut b = [0u8; 4];
        mem.read(major_at, &mut b)
            .map_err(|e| LayoutError::Read(e.to_string()))?;
        let major = u32::from_le_bytes(b);
        let blob_code = match t.opt_field(&blob, "_code_begin") {
            Some(f) => CodeStart::Pointer(f),
            None => CodeStart::Offset(t.field(&blob, "_code_offset")?),
        };
        let nm_data = match t.opt_field(&nm, "_immutable_data") {
            None => NmethodData::InBlob {
                metadata_offset: t.field(&nm, "_metadata_offset")?,
                scopes_data_begin: t.field(&nm, "_scopes_data_begin")?,
                scopes_pcs_offset: t.field(&nm, "_scopes_pcs_offset")?,
                dependencies_offset: t.field(&nm, "_dependencies_offset")?,
            },
            Some(immutable_data) => NmethodData::Immutable {
                immutable_data,
                immutable_data_size: t.field(&nm, "_immutable_data_size")?,
                scopes_pcs_offset: t.field(&nm, "_scopes_pcs_offset")?,
                scopes_data_offset: t
                    .opt_field(&nm, "_scopes_data_offset")
                    .map_or_else(|| t.field(&nm, "_scopes_data_begin"), Ok)?,
                ref_count_offset: t.opt_field(&nm, "_immutable_data_ref_count_offset"),
                metadata: match t.opt_field(&blob, "_mutable_data") {
                    Some(mutable_data) => MetadataPlace::Mutable {
                        mutable_data,
                        relocation_size: t.field(&blob, "_relocation_size")?,
                        mutable_data_size: t.field(&blob, "_mutable_data_size")?,
                    },
                    None => MetadataPlace::AfterCode {
                        data_offset: t.field(&blob, "_data_offset")?,
                        metadata_offset: t.field(&nm, "_metadata_offset")?,
                        size: t.field(&blob, "_size")?,
                    },
                },
            },
        };
        let symbol_length = match t.opt_field(&["Symbol"], "_length") {
            Some(f) => f,
            // JDK 12+: the length is the high half of a 32-bit word.
            None => {
                let f = t.field(&["Symbol"], "_length_and_refcount")?;
                Field {
                    offset: f.offset + 2,
                    width: 2,
                }
            }
        };
        let array_len = t
            .opt_field(&["GrowableArrayBase"], "_len")
            .map_or_else(|| t.field(&["GenericGrowableArray"], "_len"), Ok)?;
        let nm_size = t.size("nmethod")?;
        let layout = Layout {
            major,
            code_heaps: t.static_addr("CodeCache", "_heaps")? - bias,
            interpreter_code: t.static_addr("AbstractInterpreter", "_code")? - bias,
            array_len,
            array_data: t.field(&["GrowableArray<int>"], "_data")?,
            heap_memory: t.embedded("CodeHeap", "_memory")?,
            heap_segmap: t.embedded("CodeHeap", "_segmap")?,
            heap_log2_segment: t.field(&["CodeHeap"], "_log2_segment_size")?,
            space_low: t.field(&["VirtualSpace"], "_low_boundary")?,
            space_high: t.field(&["VirtualSpace"], "_high_boundary")?,
            heap_block_size: t.size("HeapBlock")?,
            blob_name: t.field(&blob, "_name")?,
            blob_code,
            blob_frame: t
                .opt_field(&blob, "_frame_size")
                .zip(t.opt_field(&blob, "_frame_complete_offset")),
            nm_compile_id: t.field(&nm, "_compile_id")?,
            nm_comp_level: t.opt_field(&nm, "_comp_level"),
            nm_method: t.field(&nm, "_method")?,
            nm_data,
            nm_header: nm_size,
            pc_desc_size: t.size("PcDesc")?,
            pc_offset: t.field(&["PcDesc"], "_pc_offset")?,
            pc_scope_offset: t.field(&["PcDesc"], "_scope_decode_offset")?,
            method_const: t.field(&["Method"], "_constMethod")?,
            const_constants: t.field(&["ConstMethod"], "_constants")?,
            const_name_index: t.field(&["ConstMethod"], "_name_index")?,
            pool_size: t.size("ConstantPool")?,
            pool_holder: t.field(&["ConstantPool"], "_pool_holder")?,
            klass_name: t.field(&["Klass"], "_name")?,
            symbol_length,
            symbol_body: t.embedded("Symbol", "_body")?,
            queue_buffer: t.field(&["StubQueue"], "_stub_buffer")?,
            queue_limit: t.field(&["StubQueue"], "_buffer_limit")?,
            flags: flag_table(t, bias),
        };
        if !(8..=64).contains(&layout.pc_desc_size)
            || layout.pc_offset.offset >= layout.pc_desc_size
        {
            return Err(LayoutError::Implausible(format!(
                "sizeof(PcDesc) = {}",
                layout.pc_desc_size
            )));
        }
        Ok(layout)
    }

    /// The encoding of the scope descriptors: JDK 20 excluded the zero
    /// byte from UNSIGNED5 (each byte one higher).
    pub fn unsigned5_excluded(&self) -> u8 {
        u8::from(self.major >= 20)
    }
}

fn flag_table(t: &Tables, bias: u64) -> Option<FlagTable> {
    Some(FlagTable {
        array: t.static_addr("JVMFlag", "flags").ok()? - bias,
        count: t.static_addr("JVMFlag", "numFlags").ok()? - bias,
        size: t.size("JVMFlag").ok()?,
        name: t.opt_field(&["JVMFlag"], "_name")?,
        addr: t.opt_field(&["JVMFlag"], "_addr")?,
    })
}

/// A JVM process's libjvm: its layout and load bias.
#[derive(Debug, Clone)]
pub struct Vm {
    pub layout: Arc<Layout>,
    /// Runtime address minus libjvm's virtual address.
    pub bias: u64,
}

/// A process's layout, or why it could not be read, and when.
#[derive(Debug, Clone)]
struct Known {
    result: Result<Arc<Layout>, LayoutError>,
    at: Instant,
    /// Parses that failed in a row.
    failures: u32,
}

/// A failed parse is tried again after this, [`RETRY_STEADY`] times in a
/// row, then doubling with each failure up to [`RETRY_AT_MOST`]: a JVM seen
/// the moment it maps libjvm has not filled its tables yet (the loader
/// relocates them before the VM starts, and a busy host stretches that to
/// seconds), and a process whose tables never read costs one parse a
/// minute.
const RETRY_AFTER: Duration = Duration::from_millis(500);
const RETRY_STEADY: u32 = 10;
const RETRY_AT_MOST: Duration = Duration::from_secs(60);

impl Known {
    fn usable(&self) -> bool {
        let doublings = self.failures.saturating_sub(RETRY_STEADY).min(8);
        self.result.is_ok()
            || self.at.elapsed()
                < RETRY_AFTER
                    .saturating_mul(1 << doublings)
                    .min(RETRY_AT_MOST)
    }
}

/// The JVMs' layouts by (pid, start time in ticks), parsed once per
/// process for every thread that reads a JVM (the walk's registration,
/// the symbolizer, the flag writer): held by [`super::Jvms`], at most
/// [`MAX_PROCESSES`].
#[derive(Debug, Default)]
pub struct Layouts(Mutex<Cache>);

/// Layouts by (pid, start time in ticks).
type Cache = HashMap<(u32, u64), Known>;

impl Layouts {
    /// The layout of JVM `pid`'s libjvm, parsed from its own memory once
    /// per process (a failure is tried again later, less and less often).
    pub fn of(&self, pid: u32) -> Result<Vm, LayoutError> {
        let mappings = exec_mappings(pid).map_err(|e| LayoutError::Read(e.to_string()))?;
        self.of_mapped(pid, &mappings)
    }

    /// [`Layouts::of`], with the process's executable mappings already
    /// read.
    pub(crate) fn of_mapped(&self, pid: u32, mappings: &[ExecMapping]) -> Result<Vm, LayoutError> {
        layout_in(&self.0, pid, mappings)
    }
}

fn layout_in(cache: &Mutex<Cache>, pid: u32, mappings: &[ExecMapping]) -> Result<Vm, LayoutError> {
    let m = hotspot_libjvm_in(mappings).ok_or(LayoutError::NoLibjvm)?;
    let file = m.open(pid).map_err(|e| LayoutError::File(e.to_string()))?;
    let bias = crate::unwind::table::load_bias_of(&file, m.start, m.offset)
        .map_err(|e| LayoutError::File(e.to_string()))?;
    let started = crate::process::live::start_ticks(pid)
        .ok_or_else(|| LayoutError::Read("the process is gone".into()))?;
    let key = (pid, started);
    let known = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    if let Some(k) = known.as_ref().filter(|k| k.usable()) {
        return k.result.clone().map(|layout| Vm { layout, bias });
    }
    let result = super::vmtables::read(pid, &file, bias)
        .and_then(|(tables, mem)| Layout::from_tables(&tables, &mem, bias))
        .map(Arc::new);
    let failures = match (&result, known) {
        (Ok(_), _) => 0,
        (Err(_), Some(k)) => k.failures + 1,
        (Err(_), None) => 1,
    };
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= MAX_PROCESSES && !cache.contains_key(&key) {
        // Forget the processes that are gone; all, if none is.
        cache.retain(|&(pid, started), _| crate::process::live::start_ticks(pid) == Some(started));
        if cache.len() >= MAX_PROCESSES {
            cache.clear();
        }
    }
    cache.insert(
        key,
        Known {
            result: result.clone(),
            at: Instant::now(),
            failures,
        },
    );
    result.map(|layout| Vm { layout, bias })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A layout with plausible made-up offsets, for tests that build
    /// structures in their own memory.
    pub(crate) fn layout_for_tests() -> Layout {
        let f = |offset| Field { offset, width: 8 };
        Layout {
            major: 17,
            code_heaps: 0,
            interpreter_code: 0,
            array_len: f(0),
            array_data: f(8),
            heap_memory: 0,
            heap_segmap: 0,
            heap_log2_segment: f(0),
            space_low: f(0),
            space_high: f(8),
            heap_block_size: 16,
            blob_name: f(0),
            blob_code: CodeStart::Offset(f(8)),
            blob_frame: Some((f(16), f(20))),
            nm_compile_id: f(16),
            nm_comp_level: None,
            nm_method: f(24),
            nm_data: NmethodData::InBlob {
                metadata_offset: f(32),
                scopes_data_begin: f(40),
                scopes_pcs_offset: f(48),
                dependencies_offset: f(56),
            },
            nm_header: 64,
            pc_desc_size: 16,
            pc_offset: f(0),
            pc_scope_offset: f(8),
            method_const: f(0),
            const_constants: f(0),
            const_name_index: f(8),
            pool_size: 16,
            pool_holder: f(0),
            klass_name: f(0),
            symbol_length: f(0),
            symbol_body: 8,
            queue_buffer: f(0),
            queue_limit: f(8),
            flags: None,
        }
    }

    #[test]
    fn failed_reads_are_tried_again_steadily_then_less_and_less_often() {
        let failed = |failures, ago_ms| Known {
            result: Err(LayoutError::NoLibjvm),
            at: Instant::now() - Duration::from_millis(ago_ms),
            failures,
        };
        // While a JVM starts, every half second.
        assert!(failed(1, 100).usable());
        assert!(!failed(1, 600).usable());
        assert!(!failed(RETRY_STEADY, 600).usable());
        // Then doubling, to once a minute.
        assert!(failed(RETRY_STEADY + 2, 1_900).usable());
        assert!(!failed(RETRY_STEADY + 2, 2_100).usable());
        assert!(failed(RETRY_STEADY + 20, 59_000).usable());
        assert!(!failed(RETRY_STEADY + 20, 61_000).usable());
    }

    #[test]
    fn layouts_are_per_process_and_not_read_from_a_non_jvm() {
        // This test process maps no libjvm.
        assert_eq!(
            Layouts::default().of(std::process::id()).err(),
            Some(LayoutError::NoLibjvm)
        );
    }
}
