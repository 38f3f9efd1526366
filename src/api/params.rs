//! Query-string parsing with errors that name the parameter.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::error::ApiError;

/// Most digits an integer parameter may have: enough for any pid, tid,
/// cgroup-free count or window, and few enough that no value overflows.
const MAX_DIGITS: usize = 10;

/// An unsigned integer written as plain ASCII digits: no sign, no
/// whitespace, at most [`MAX_DIGITS`]. `str::parse` takes `+5`, and a
/// trimmed `5%20` would pass too; a parameter must mean exactly one thing.
fn strict_u64(raw: &str) -> Option<u64> {
    let digits =
        !raw.is_empty() && raw.len() <= MAX_DIGITS && raw.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| raw.parse().ok()).flatten()
}

/// Most digits after the decimal point of a duration: nanoseconds.
const MAX_FRACTION_DIGITS: usize = 9;

/// Seconds written as plain digits with an optional fraction (`2`, `0.5`,
/// `1.250`): no sign, exponent, `inf` or `NaN`, which `f64::from_str`
/// would all take. Parsed exactly, without floating point.
fn strict_seconds(raw: &str) -> Option<Duration> {
    let (whole, fraction) = raw.split_once('.').unwrap_or((raw, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let fraction_ok =
        !raw.contains('.') || (!fraction.is_empty() && fraction.len() <= MAX_FRACTION_DIGITS);
    if !(fraction_ok && digits(fraction)) {
        return None;
    }
    let nanos = format!("{fraction:0<MAX_FRACTION_DIGITS$}").parse().ok()?;
    Some(Duration::new(strict_u64(whole)?, nanos))
}

/// Parsed query parameters of one request.
#[derive(Debug, Default)]
pub struct Params {
    values: HashMap<String, String>,
}

impl Params {
    /// Parses a raw query string, accepting only `allowed` names: a typo such
    /// as `pdi=` must not silently widen a query to the whole host.
    pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Params, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.unwrap_or(""))
            .map_err(|e| ApiError::bad("query", format!("malformed query string: {e}")))?;
        let mut values = HashMap::new();
        for (name, value) in pairs {
            if !allowed.contains(&name.as_str()) {
                return Err(ApiError::bad(
                    &name,
                    format!(
                        "unknown parameter (this endpoint takes: {})",
                        allowed.join(", ")
                    ),
                ));
            }
            if values.insert(name.clone(), value).is_some() {
                return Err(ApiError::bad(&name, "given more than once"));
            }
        }
        Ok(Params { values })
    }

    /// An optional free-form value.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// An optional integer in `min..=max`.
    pub fn int(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        let Some(raw) = self.values.get(name) else {
            return Ok(None);
        };
        let n = strict_u64(raw).ok_or_else(|| {
            ApiError::bad(
                name,
                format!("expected a whole number (digits only, at most {MAX_DIGITS}), got `{raw}`"),
            )
        })?;
        if n < min || n > max {
            return Err(ApiError::bad(
                name,
                format!("must be between {min} and {max}, got {n}"),
            ));
        }
        Ok(Some(n))
    }

    /// An optional duration in seconds, fractions allowed, at most `max`.
    pub fn seconds(&self, name: &str, max: Duration) -> Result<Option<Duration>, ApiError> {
        let Some(raw) = self.values.get(name) else {
            return Ok(None);
        };
        let d = strict_seconds(raw).ok_or_else(|| {
            ApiError::bad(
                name,
                format!("expected seconds as digits with an optional fraction (e.g. 2 or 0.5), got `{raw}`"),
            )
        })?;
        if d > max {
            return Err(ApiError::bad(
                name,
                format!("must be at most {} s, got {raw}", max.as_secs_f64()),
            ));
        }
        Ok(Some(d))
    }

    /// An optional instant: Unix seconds (digits, optional fraction) or
    /// RFC 3339 (`2026-11-23T10:00:00Z`, `...+01:00`).
    pub fn time(&self, name: &str) -> Result<Option<SystemTime>, ApiError> {
        let Some(raw) = self.values.get(name) else {
            return Ok(None);
        };
        if let Some(d) = strict_seconds(raw) {
            return Ok(Some(UNIX_EPOCH + d));
        }
        let t = chrono::DateTime::parse_from_rfc3339(raw).map_err(|e| {
            ApiError::bad(
                name,
                format!("expected Unix seconds or RFC 3339 (e.g. 2026-11-23T10:00:00Z), got `{raw}`: {e}"),
            )
        })?;
        let nanos = t
            .timestamp_nanos_opt()
            .filter(|n| *n >= 0)
            .ok_or_else(|| ApiError::bad(name, format!("`{raw}` is before 1970 or after 2262")))?;
        Ok(Some(UNIX_EPOCH + Duration::from_nanos(nanos as u64)))
    }

    /// An optional process or thread id.
    pub fn id(&self, name: &str) -> Result<Option<u32>, ApiError> {
        Ok(self.int(name, 1, u64::from(u32::MAX))?.map(|n| n as u32))
    }

    /// An optional value out of a fixed set.
    pub fn choice<'a>(&self, name: &str, choices: &[&'a str]) -> Result<Option<&'a str>, ApiError> {
        let Some(raw) = self.values.get(name) else {
            return Ok(None);
        };
        choices
            .iter()
            .find(|c| **c == raw)
            .copied()
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad(
                    name,
                    format!("expected one of {}, got `{raw}`", choices.join("|")),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(e: ApiError) -> String {
        e.to_string()
    }

    #[test]
    fn parses_and_validates() {
        let p = Params::parse(
            Some("pid=42&seconds=10&format=svg"),
            &["pid", "seconds", "format"],
        )
        .unwrap();
        assert_eq!(p.id("pid").unwrap(), Some(42));
        assert_eq!(p.int("seconds", 1, 600).unwrap(), Some(10));
        assert_eq!(p.choice("format", &["svg", "folded"]).unwrap(), Some("svg"));
        assert_eq!(p.id("tid").unwrap(), None);
    }

    #[test]
    fn errors_name_the_parameter() {
        let e = Params::parse(Some("pdi=1"), &["pid"]).unwrap_err();
        assert!(msg(e).contains("`pdi`"));
        let e = Params::parse(Some("pid=1&pid=2"), &["pid"]).unwrap_err();
        assert!(msg(e).contains("more than once"));
        let p = Params::parse(
            Some("pid=abc&seconds=0&format=png"),
            &["pid", "seconds", "format"],
        )
        .unwrap();
        assert!(msg(p.id("pid").unwrap_err()).contains("`pid`"));
        assert!(msg(p.int("seconds", 1, 600).unwrap_err()).contains("between 1 and 600"));
        assert!(msg(p.choice("format", &["svg", "folded"]).unwrap_err()).contains("svg|folded"));
        let p = Params::parse(Some("pid=0"), &["pid"]).unwrap();
        assert!(p.id("pid").is_err());
    }

    #[test]
    fn integers_are_plain_digits() {
        for raw in [
            "+5",
            "5%20",
            "%205",
            "",
            "-5",
            "5 ",
            "0x5",
            "5_0",
            "12345678901",
            "٥",
        ] {
            let p = Params::parse(Some(&format!("pid={raw}")), &["pid"]).unwrap();
            let e = p.id("pid").expect_err(raw);
            assert!(msg(e).contains("`pid`"), "{raw}");
        }
        for (raw, n) in [("5", 5), ("0042", 42), ("4294967295", 4_294_967_295)] {
            let p = Params::parse(Some(&format!("pid={raw}")), &["pid"]).unwrap();
            assert_eq!(p.id("pid").unwrap(), Some(n), "{raw}");
        }
        assert_eq!(strict_u64("9999999999"), Some(9_999_999_999));
    }

    #[test]
    fn seconds_are_digits_with_an_optional_fraction() {
        let max = Duration::from_secs(3600);
        for (raw, ms) in [
            ("1", 1000),
            ("0.5", 500),
            ("0", 0),
            ("2.250", 2250),
            ("0.000000001", 0),
        ] {
            let p = Params::parse(Some(&format!("s={raw}")), &["s"]).unwrap();
            let d = p.seconds("s", max).unwrap().unwrap();
            assert_eq!(d.as_millis(), ms, "{raw}");
        }
        assert_eq!(strict_seconds("0.000000001"), Some(Duration::from_nanos(1)));
        for raw in [
            "-1",
            "-0.5",
            "NaN",
            "nan",
            "inf",
            "1e3",
            "+1",
            ".5",
            "1.",
            "1..2",
            "1.2.3",
            "0x1",
            " 1",
            "1%20",
            "",
            "1.0000000001",
            "٥",
            "3601",
            "abc",
        ] {
            let p = Params::parse(Some(&format!("s={raw}")), &["s"]).unwrap();
            let e = p.seconds("s", max).expect_err(raw);
            assert!(msg(e).contains("`s`"), "{raw}");
        }
    }
}

#[cfg(test)]
mod time_tests {
    use super::*;

    fn time(raw: &str) -> Result<Option<SystemTime>, ApiError> {
        let q = serde_urlencoded::to_string([("t", raw)]).unwrap();
        Params::parse(Some(&q), &["t"]).unwrap().time("t")
    }

    #[test]
    fn instants_are_unix_seconds_or_rfc3339() {
        let at = |s: u64, ms: u64| Some(UNIX_EPOCH + Duration::from_millis(s * 1000 + ms));
        assert_eq!(time("1763892000").unwrap(), at(1_763_892_000, 0));
        assert_eq!(time("1763892000.250").unwrap(), at(1_763_892_000, 250));
        assert_eq!(time("2025-11-23T10:00:00Z").unwrap(), at(1_763_892_000, 0));
        assert_eq!(
            time("2025-11-23T11:00:00.5+01:00").unwrap(),
            at(1_763_892_000, 500)
        );
        for bad in [
            "",
            "-5",
            "yesterday",
            "2025-11-23",
            "2025-11-23T10:00:00",
            "1e9",
        ] {
            let e = time(bad).expect_err(bad).to_string();
            assert!(e.contains("`t`"), "{bad}: {e}");
        }
        assert!(time("1969-12-31T23:59:59Z").is_err());
    }
}
