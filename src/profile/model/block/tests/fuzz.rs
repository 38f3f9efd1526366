//! Random mutations of valid blocks, before and past the checksum and
//! past zstd: decoding returns a slice or an error, never panics, and
//! never allocates past its budget (an allocation failure would abort).

use super::{
    super::{decode, decode_standalone, encode, encode_standalone, peek, stack_ids},
    reseal,
    slices::{busy, edges, Ids, Rng},
    with_body,
};

/// Flips bits, overwrites, cuts, inserts or duplicates bytes.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        let len = bytes.len() as u64;
        let at = rng.below(len) as usize;
        match rng.below(6) {
            0 if len > 0 => bytes[at] ^= 1 << rng.below(8),
            1 if len > 0 => bytes[at] = rng.next() as u8,
            2 => bytes.truncate(at),
            3 => bytes.insert(at.min(bytes.len()), rng.next() as u8),
            4 if len > 8 => {
                let n = (1 + rng.below(8) as usize).min(bytes.len() - at);
                let chunk = bytes[at..at + n].to_vec();
                let to = rng.below(len) as usize;
                bytes.splice(to..to, chunk);
            }
            _ if len > 0 => bytes[at] = [0, 0x7f, 0x80, 0xff][rng.below(4) as usize],
            _ => {}
        }
    }
}

/// A body changed in place: its length stays what the header says.
fn mutate_in_place(rng: &mut Rng, body: &mut Vec<u8>) {
    let len = body.len();
    mutate(rng, body);
    body.resize(len, 0);
}

#[test]
fn mutated_blocks_are_errors_or_slices() {
    let mut ids = Ids::default();
    let small = {
        let mut s = busy(9);
        s.samples.truncate(40);
        s.wakeups.truncate(20);
        s
    };
    let blocks = [
        encode(&edges(), &mut ids),
        encode_standalone(&edges()),
        encode(&small, &mut ids),
        encode_standalone(&small),
    ];
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut decoded, mut refused) = (0, 0);
    for i in 0..6000 {
        let block = &blocks[i % blocks.len()];
        let bytes = match i % 3 {
            0 => {
                let mut b = block.clone();
                mutate(&mut rng, &mut b);
                b
            }
            1 => {
                let mut b = block.clone();
                mutate(&mut rng, &mut b);
                reseal(b)
            }
            _ => with_body(block, |body| mutate_in_place(&mut rng, body)),
        };
        let _ = peek(&bytes);
        let _ = stack_ids(&bytes);
        match (decode(&bytes, &ids), decode_standalone(&bytes)) {
            (Ok(_), _) | (_, Ok(_)) => decoded += 1,
            _ => refused += 1,
        }
    }
    // Both outcomes happen: the mutations reach past the checks.
    println!("{decoded} mutated blocks decoded, {refused} refused");
    assert!(
        decoded > 100 && refused > 1000,
        "{decoded} decoded, {refused} refused"
    );
}

#[test]
fn random_bytes_are_errors() {
    let mut rng = Rng(77);
    let ids = Ids::default();
    for i in 0..3000 {
        let len = rng.below(200) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 2 == 0 && len > 8 {
            // A valid magic, version and checksum over random contents.
            bytes[..5].copy_from_slice(b"WSBK\x01");
            bytes = reseal(bytes);
        }
        assert!(decode(&bytes, &ids).is_err());
        assert!(decode_standalone(&bytes).is_err());
    }
}
