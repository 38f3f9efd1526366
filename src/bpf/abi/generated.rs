//! `bpf/wallscope.h` as bindgen reads it (see build.rs): every `ws_*` type
//! and `WS_*` constant, with compile-time assertions of each struct's size,
//! alignment and field offsets.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all,
    clippy::pedantic
)]

include!(concat!(env!("OUT_DIR"), "/abi.rs"));
