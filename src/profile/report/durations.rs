//! Durations as text answers print them: milliseconds below a second, so
//! that a quarter of a second reads `250 ms`, never `0 s`.

/// `s` seconds (known to the millisecond, as `/blocked` holds them):
/// `250 ms` below a second, else `12.345 s`.
pub fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{} ms", (s * 1000.0).round().max(0.0))
    } else {
        format!("{} s", (s * 1000.0).round() / 1000.0)
    }
}

/// A span of waits from `shortest` to `longest` seconds: one duration when
/// they are alike (`45 s`, `250 ms`), else a range (`250 ms-3 s`,
/// `12-45 s`), to the second above one second.
pub fn span(shortest: f64, longest: f64) -> String {
    let whole = |s: f64| match s < 1.0 {
        true => seconds(s),
        false => format!("{} s", s.round()),
    };
    if longest < 1.0 && longest - shortest < 0.001 || longest >= 1.0 && longest - shortest < 1.0 {
        return whole(longest);
    }
    match (shortest < 1.0, whole(shortest)) {
        (false, _) => format!("{}-{} s", shortest.floor(), longest.round()),
        (true, low) => format!("{low}-{}", whole(longest)),
    }
}

/// `s` seconds as a lower bound: `250 ms` below a second, else whole
/// seconds rounded down (`12 s` for 12.9).
pub fn at_least(s: f64) -> String {
    match s < 1.0 {
        true => seconds(s),
        false => format!("{} s", s.floor()),
    }
}

/// `us` microseconds: `1.2 s` from a second on, `250 ms` or `2.5 ms`
/// from a millisecond on, else `800 us`.
pub fn micros(us: u64) -> String {
    let trimmed = |v: f64| {
        let s = format!("{v:.1}");
        s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
    };
    match us {
        1_000_000.. => format!("{} s", trimmed(us as f64 / 1e6)),
        10_000.. => format!("{} ms", (us as f64 / 1e3).round()),
        1_000.. => format!("{} ms", trimmed(us as f64 / 1e3)),
        _ => format!("{us} us"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_a_second_reads_in_milliseconds() {
        assert_eq!(seconds(0.25), "250 ms");
        assert_eq!(seconds(0.0), "0 ms");
        assert_eq!(seconds(0.001), "1 ms");
        assert_eq!(seconds(1.0), "1 s");
        assert_eq!(seconds(12.345), "12.345 s");
        assert_eq!(micros(250_000), "250 ms");
        assert_eq!(micros(2_500), "2.5 ms");
        assert_eq!(micros(2_000), "2 ms");
        assert_eq!(micros(800), "800 us");
        assert_eq!(micros(1_250_000), "1.2 s");
        assert_eq!(micros(3_000_000), "3 s");
    }

    #[test]
    fn spans_say_both_ends_when_they_differ() {
        assert_eq!(span(0.25, 0.25), "250 ms");
        assert_eq!(span(0.1, 0.25), "100 ms-250 ms");
        assert_eq!(span(0.25, 3.2), "250 ms-3 s");
        assert_eq!(span(44.6, 45.2), "45 s");
        assert_eq!(span(12.3, 45.2), "12-45 s");
        assert_eq!(
            (at_least(0.25), at_least(12.9)),
            ("250 ms".into(), "12 s".into())
        );
    }
}
