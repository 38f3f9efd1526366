//! Unit tests of `table`.

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
