//! Generated C programs without frame pointers whose unwind tables are
//! large: many small functions (about 3 table rows each), so that a few
//! hundred distinct binaries fill a small row array.

use std::{fmt::Write as _, path::Path, process::Command};

/// C source of `functions` functions `f0`.. without frame pointers, then
/// `tail` (which defines `main` and may call `f0`).
pub fn source(functions: usize, tail: &str) -> String {
    let mut src = String::from(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\n#include <unistd.h>\n\
         __attribute__((noinline)) void sink(long *a) { __asm__ volatile(\"\" : : \"r\"(a) : \"memory\"); }\n",
    );
    for i in 0..functions {
        let _ = writeln!(
            src,
            "__attribute__((noinline)) long f{i}(long x) {{ long a[6]; \
             for (int i = 0; i < 6; i++) a[i] = x * i + {i}; sink(a); return a[2] + x; }}"
        );
    }
    src.push_str(tail);
    src
}

/// Compiles `src` (written next to `out`) optimized, without frame
/// pointers or inlining.
pub fn compile(src: &str, out: &Path) {
    let file = out.with_extension("c");
    std::fs::write(&file, src).unwrap();
    let status = Command::new("clang")
        .args(["-O2", "-fomit-frame-pointer", "-fno-inline"])
        .args(["-fno-optimize-sibling-calls", "-o"])
        .arg(out)
        .arg(&file)
        .status()
        .expect("running clang");
    assert!(status.success(), "compiling {}", file.display());
}
