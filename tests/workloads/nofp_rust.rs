//! Built as a release binary WITHOUT frame pointers (rustc -C opt-level=2
//! -C force-frame-pointers=no): only unwind tables can walk it. The main
//! thread spins in main -> outer -> middle -> spin; a second thread sleeps
//! in doze_outer -> doze_inner -> std::thread::sleep.
//! Usage: nofp_rust SECONDS. Prints "ready PID", then "done".

use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn spin(x: u64) -> u64 {
    let (mut a, mut b, mut c) = (x, x.wrapping_mul(3), x.wrapping_mul(5));
    for i in 0..200_000u64 {
        a = a.wrapping_mul(6364136223846793005).wrapping_add(b);
        b ^= a >> 13;
        c = c.wrapping_add(b.wrapping_mul(i));
    }
    black_box(a ^ b ^ c)
}

#[inline(never)]
fn middle(x: u64) -> u64 {
    black_box(spin(black_box(x)) + 1)
}

#[inline(never)]
fn outer(until: Instant) -> u64 {
    let mut x = 1;
    while Instant::now() < until {
        x = black_box(middle(x));
    }
    x
}

#[inline(never)]
fn doze_inner() {
    std::thread::sleep(Duration::from_millis(20));
    black_box(());
}

#[inline(never)]
fn doze_outer(until: Instant) {
    while Instant::now() < until {
        doze_inner();
    }
    black_box(());
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let until = Instant::now() + Duration::from_secs(seconds);
    let sleeper = std::thread::spawn(move || doze_outer(until));
    println!("ready {}", std::process::id());
    black_box(outer(until));
    sleeper.join().unwrap();
    println!("done");
}
