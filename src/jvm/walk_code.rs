//! What the BPF walk needs of a JVM's code to step through it without
//! frame pointers (`bpf/java.bpf.h`): its interpreter, its code heaps and
//! where a code blob keeps its frame size, read from the JVM's vmStructs
//! when the unwind registry registers the process.

use super::{
    code::JavaCode,
    vmstructs::{CodeStart, Layout},
};
use crate::bpf::abi::{UnwindJava, UnwindJavaHeap, JAVA_BLOB_HEADER, UNWIND_JAVA_HEAPS};

/// What the BPF walk needs of `pid`'s JVM, if `mappings` (its executable
/// mappings) include a libjvm whose structures can be read: its
/// interpreter's code (interpreted frames' methods are recorded) and its
/// code heaps with where a code blob keeps its frame size (compiled frames
/// are stepped through without frame pointers, `bpf/java.bpf.h`).
pub(crate) fn code_for_walks(
    layouts: &super::vmstructs::Layouts,
    pid: u32,
    mappings: &[crate::process::files::ExecMapping],
) -> Option<UnwindJava> {
    let vm = layouts.of_mapped(pid, mappings).ok()?;
    let code = JavaCode::new(&vm, pid);
    let (interp_start, interp_end) = code.interpreter().ok()?;
    let mut java = UnwindJava {
        interp_start,
        interp_end,
        ..UnwindJava::default()
    };
    // Without heaps or a layout the walk can use, interpreted frames are
    // still named; compiled ones end the walk as before.
    if let (Ok(heaps), Some(blob)) = (code.heaps(), BlobFields::of(&vm.layout)) {
        blob.write(&mut java);
        for (slot, h) in java.heaps.iter_mut().zip(&heaps) {
            *slot = UnwindJavaHeap {
                low: h.low,
                high: h.high,
                segmap: h.segmap,
                log2_segment: h.log2_segment,
                _pad: 0,
            };
        }
        java.heap_count = heaps.len().min(UNWIND_JAVA_HEAPS) as u32;
    }
    Some(java)
}

/// Where a code blob keeps what the BPF walk reads, as offsets within the
/// [`JAVA_BLOB_HEADER`] bytes it reads of a blob.
#[derive(Debug, PartialEq, Eq)]
struct BlobFields {
    block_header: u16,
    frame_size: u16,
    frame_complete: (u16, u8),
    code: u16,
    code_is_offset: bool,
}

impl BlobFields {
    /// The layout's, if every field fits where the walk reads it (an
    /// 8-byte read at most 8 bytes before the header's end) and has the
    /// width it reads.
    fn of(l: &Layout) -> Option<BlobFields> {
        let (frame_size, complete) = l.blob_frame?;
        let (code, code_is_offset) = match l.blob_code {
            CodeStart::Pointer(f) => (f, false),
            CodeStart::Offset(f) => (f, true),
        };
        let within = |offset: u64| offset <= JAVA_BLOB_HEADER - 8;
        let fits = frame_size.width == 4
            && matches!(complete.width, 2 | 4)
            && code.width == if code_is_offset { 4 } else { 8 }
            && [frame_size, complete, code]
                .iter()
                .all(|f| within(f.offset))
            && l.heap_block_size <= 256;
        fits.then_some(BlobFields {
            block_header: l.heap_block_size as u16,
            frame_size: frame_size.offset as u16,
            frame_complete: (complete.offset as u16, complete.width as u8),
            code: code.offset as u16,
            code_is_offset,
        })
    }

    fn write(&self, java: &mut UnwindJava) {
        java.block_header = self.block_header;
        java.frame_size = self.frame_size;
        java.frame_complete = self.frame_complete.0;
        java.frame_complete_width = self.frame_complete.1;
        java.code = self.code;
        java.code_is_offset = u8::from(self.code_is_offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_fields_are_registered_only_where_the_walk_reads_them() {
        let field = |offset, width| crate::jvm::vmstructs::Field { offset, width };
        let mut l = crate::jvm::vmstructs::tests::layout_for_tests();
        // JDK 17: a code pointer, an int frame-complete offset.
        l.blob_frame = Some((field(40, 4), field(28, 4)));
        l.blob_code = CodeStart::Pointer(field(48, 8));
        let fields = BlobFields::of(&l).expect("JDK 17's layout");
        assert_eq!(fields.frame_complete, (28, 4));
        assert!(!fields.code_is_offset);
        let mut java = UnwindJava::default();
        fields.write(&mut java);
        assert_eq!(
            (java.frame_size, java.code, java.code_is_offset),
            (40, 48, 0)
        );
        // JDK 21: its fields after a dozen pointers.
        l.blob_frame = Some((field(88, 4), field(80, 4)));
        l.blob_code = CodeStart::Pointer(field(8, 8));
        assert!(BlobFields::of(&l).is_some_and(|f| f.frame_size == 88));
        // JDK 25: a code offset, a 16-bit frame-complete offset.
        l.blob_frame = Some((field(36, 4), field(20, 2)));
        l.blob_code = CodeStart::Offset(field(16, 4));
        assert!(BlobFields::of(&l).is_some_and(|f| f.code_is_offset));
        // A forged layout: fields past the bytes read, odd widths, a huge
        // block header.
        for (frame, complete, header) in [
            (field(124, 4), field(20, 2), 16),
            (field(36, 8), field(20, 2), 16),
            (field(36, 4), field(20, 3), 16),
            (field(36, 4), field(20, 2), 1 << 20),
        ] {
            l.blob_frame = Some((frame, complete));
            l.heap_block_size = header;
            assert_eq!(BlobFields::of(&l), None, "{frame:?} {complete:?} {header}");
        }
        l.blob_frame = None;
        l.heap_block_size = 16;
        assert_eq!(BlobFields::of(&l), None, "no frame size described");
    }
}
