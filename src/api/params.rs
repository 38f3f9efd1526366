//! Query-string parsing with errors that name the parameter.

use std::collections::HashMap;

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
}
