//! Durations on the command line: `500ms`, `30s`, `5m`, `1m 30s` (humantime's syntax), for the
//! bench's options and for every other command of the `allot` binary.

use std::time::Duration;

/// Parses a duration with a unit; a bare number is refused, so `--ttl 30` is not silently 30 ms.
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|err| format!("`{text}` is not a duration ({err}); write e.g. `500ms`, `30s` or `5m`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse("30").is_err());
        assert!(parse("").is_err());
        assert!(parse("fast").is_err());
        assert!(parse("-1s").is_err());
    }
}
