//! Exports `otel_thread_ctx_v1` in `.dynsym`: readers (wallscope) find
//! the variable by that symbol, and an executable exports nothing unless
//! asked. A build script rather than `.cargo/config.toml`, which cargo
//! would not read when run from elsewhere with `--manifest-path`.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
    println!("cargo:rerun-if-changed=build.rs");
}
