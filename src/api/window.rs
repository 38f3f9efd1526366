//! The window a query reads, from `seconds` or `from`/`until`.

use std::time::{Duration, SystemTime};

use super::{error::ApiError, params::Params};
use crate::profile::model::window::Window;

/// Window used when a query gives neither `seconds` nor `from`.
pub const DEFAULT_SECONDS: u64 = 30;

/// The parameters that choose a window.
pub const WINDOW_PARAMS: [&str; 3] = ["seconds", "from", "until"];

/// The window `p` asks for:
/// - `seconds` alone: the last `seconds` before `now`;
/// - `from` (and optionally `until`, default now): that range;
/// - `until` alone, or with `seconds`: the `seconds` (default 30) before it;
/// - `from` with `seconds`: the `seconds` after it.
///
/// `seconds` is at most `max` (the retention); an absolute range may reach
/// past the retention (it then holds less) but must not end before it
/// starts.
pub fn window(p: &Params, max: Duration, now: SystemTime) -> Result<Window, ApiError> {
    let seconds = p
        .int("seconds", 1, max.as_secs().max(1))?
        .map(Duration::from_secs);
    let from = p.time("from")?;
    let until = p.time("until")?;
    let default = Duration::from_secs(DEFAULT_SECONDS);
    let (from, until) = match (from, until, seconds) {
        (None, None, seconds) => {
            return Ok(Window::last(seconds.unwrap_or(default).as_secs(), now))
        }
        (Some(_), Some(_), Some(_)) => {
            return Err(ApiError::bad(
                "seconds",
                "give `from` and `until`, or one of them with `seconds`, not all three",
            ))
        }
        (Some(from), Some(until), None) => (from, until),
        (Some(from), None, Some(len)) => (from, from + len),
        (Some(from), None, None) => (from, now),
        (None, Some(until), len) => (
            until
                .checked_sub(len.unwrap_or(default))
                .unwrap_or(SystemTime::UNIX_EPOCH),
            until,
        ),
    };
    if until <= from {
        return Err(ApiError::bad(
            "until",
            format!(
                "must be after `from` ({} is not after {})",
                crate::profile::model::window::rfc3339(until),
                crate::profile::model::window::rfc3339(from)
            ),
        ));
    }
    Ok(Window::between(from, until))
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn parse(q: &str) -> Result<Window, ApiError> {
        let p = Params::parse(Some(q), &WINDOW_PARAMS).unwrap();
        window(&p, Duration::from_secs(600), at(10_000))
    }

    #[test]
    fn windows_from_each_parameter_form() {
        assert_eq!(parse("").unwrap(), Window::last(30, at(10_000)));
        assert_eq!(parse("seconds=60").unwrap(), Window::last(60, at(10_000)));
        let range = |a, b| Window::between(at(a), at(b));
        assert_eq!(parse("from=9000&until=9100").unwrap(), range(9000, 9100));
        assert_eq!(parse("from=9000").unwrap(), range(9000, 10_000));
        assert_eq!(parse("from=9000&seconds=5").unwrap(), range(9000, 9005));
        assert_eq!(parse("until=9000").unwrap(), range(8970, 9000));
        assert_eq!(parse("until=9000&seconds=10").unwrap(), range(8990, 9000));
        assert_eq!(
            parse("from=1970-01-01T02:30:00Z&until=1970-01-01T02:31:40Z").unwrap(),
            range(9000, 9100)
        );
    }

    #[test]
    fn bad_windows_name_the_parameter() {
        for (q, param) in [
            ("from=9000&until=9000", "until"),
            ("from=9100&until=9000", "until"),
            ("from=1&until=2&seconds=1", "seconds"),
            ("seconds=601", "seconds"),
            ("from=soon", "from"),
        ] {
            let e = parse(q).expect_err(q).to_string();
            assert!(e.contains(&format!("`{param}`")), "{q}: {e}");
        }
    }
}
