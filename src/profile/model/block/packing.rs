//! zstd for block bodies, with a few reusable contexts: making one costs
//! more than compressing a small block, and a context kept per thread
//! would hold its memory (about a megabyte to compress, 150 KB to
//! decompress) in every query thread that ever decoded a block.

use std::sync::Mutex;

use zstd::{
    bulk::{Compressor, Decompressor},
    zstd_safe::CParameter,
};

use super::CodecError;

/// zstd level, chosen by measurement (`tests/measure.rs`): on a busy
/// slice's body level 3 was 2 % smaller than 1 and within 3 % of 19, in a
/// third of 6's time and a fiftieth of 19's.
const LEVEL: i32 = 3;
/// Contexts kept between uses, of each kind; more are made when threads
/// compete, and dropped after use.
const KEPT: usize = 2;

static COMPRESSORS: Mutex<Vec<Compressor<'static>>> = Mutex::new(Vec::new());
static DECOMPRESSORS: Mutex<Vec<Decompressor<'static>>> = Mutex::new(Vec::new());

/// Runs `f` with a context from `pool`, or a new one from `make`.
fn with<T, R>(
    pool: &Mutex<Vec<T>>,
    make: impl FnOnce() -> Option<T>,
    f: impl FnOnce(&mut T) -> R,
) -> Option<R> {
    let kept = pool.lock().ok().and_then(|mut p| p.pop());
    let mut ctx = kept.or_else(make)?;
    let out = f(&mut ctx);
    if let Ok(mut p) = pool.lock() {
        if p.len() < KEPT {
            p.push(ctx);
        }
    }
    Some(out)
}

fn compressor() -> Option<Compressor<'static>> {
    let mut z = Compressor::new(LEVEL).ok()?;
    // The block's header has the length and the block its own checksum.
    z.set_parameter(CParameter::ContentSizeFlag(false)).ok()?;
    z.set_parameter(CParameter::ChecksumFlag(false)).ok()?;
    Some(z)
}

/// `body` compressed; `None` if zstd fails (the block then stores it).
pub fn compress(body: &[u8]) -> Option<Vec<u8>> {
    with(&COMPRESSORS, compressor, |z| z.compress(body).ok())?
}

/// `payload` decompressed into exactly `len` bytes, allocated before
/// (the caller bounds `len`): zstd writes within that capacity only, so a
/// body that would grow past it is an error, not an allocation.
pub fn decompress(payload: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    let mut raw = Vec::with_capacity(len);
    let n = with(
        &DECOMPRESSORS,
        || Decompressor::new().ok(),
        |d| d.decompress_to_buffer(payload, &mut raw),
    )
    .ok_or(CodecError::Compression)?
    .map_err(|_| CodecError::Compression)?;
    match n == len {
        true => Ok(raw),
        false => Err(CodecError::Corrupt("body length")),
    }
}
