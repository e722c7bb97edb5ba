//! Reading the duration fields without panicking. `kube::core::Duration`'s parser panics on
//! text whose parts do not fit a `std::time::Duration` — a number of hours written with forty
//! digits, a negative part after the first (`1m-5s`) — so the spec's duration fields are read
//! through [`deserialize`], which refuses such text first and leaves the rest to that parser.
//! The bound is Go's: `time.ParseDuration` (and so the API server) stops at about 292 years.

use kube::core::Duration;
use serde::{Deserializer, de};

/// Longest duration, in seconds: `i64::MAX` nanoseconds, where Go's `time.Duration` ends.
const MAX_SECS: f64 = 9_223_372_036.854_775;

/// Deserializes a duration field (`#[serde(deserialize_with)]`). The text is checked while it
/// is read, so a refusal names the field as the deserializer reports it.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    struct Text;
    impl de::Visitor<'_> for Text {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string in Go `time.Duration.String()` format")
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<Duration, E> {
            parse(value).map_err(E::custom)
        }
    }
    deserializer.deserialize_str(Text)
}

/// Parses a duration in Go `time.ParseDuration` syntax.
///
/// # Errors
/// The parser's message, or that the value is out of range (negative parts, more than about
/// 292 years).
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    if !fits(text) {
        return Err(format!(
            "{text:?} is out of range for a duration (at most about 292 years, no negative parts)"
        ));
    }
    text.parse::<Duration>().map_err(|e| e.to_string())
}

/// Whether every part of `text`, split as kube's parser splits it, is a non-negative number of
/// seconds and the parts add up to at most [`MAX_SECS`]. Text that parser refuses for its
/// syntax passes here (it answers with its own message).
fn fits(text: &str) -> bool {
    let mut rest = text.trim_start_matches('+').trim_start_matches('-');
    let mut total = 0.0;
    while !rest.is_empty() && rest != "0" {
        let Some(unit_start) = rest.find(|c: char| c.is_alphabetic()) else {
            return true;
        };
        let (value, after) = rest.split_at(unit_start);
        let Ok(value) = value.parse::<f64>() else {
            return true;
        };
        let unit_end = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        rest = after;
        let unit_secs = match unit {
            "ns" => 1e-9,
            "us" | "\u{00b5}s" | "\u{03bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return true,
        };
        let secs = value * unit_secs;
        if value.is_sign_negative() || !secs.is_finite() {
            return false;
        }
        total += secs;
        if total > MAX_SECS {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_that_do_not_fit_are_refused_instead_of_panicking() {
        for bad in [
            "1522222222222222222222222222222222222222222m",
            "1m-5s",
            "1h-0s",
            "2562048h",
            "2562047h2562047h",
            "99999999999999999999999999999999999999999999999999ns",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("out of range"), "{bad}: {err}");
        }
        for (good, secs) in [("10m", 600), ("1h30m", 5400), ("2562047h", 2562047 * 3600)] {
            assert_eq!(
                std::time::Duration::from(parse(good).unwrap()),
                std::time::Duration::from_secs(secs),
                "{good}"
            );
        }
        // As the sidecar loads a manifest: an error naming the field, not a panic.
        let manifest = "apiVersion: mcp.tether.dev/v1alpha1\nkind: McpEndpoint\nmetadata: {name: m}\n\
             spec:\n  targetRef: {kind: Deployment, name: m}\n  \
             session: {idleTimeout: 1522222222222222222222222222222222222222222m}\n";
        let err = crate::parse_manifest(manifest).unwrap_err().to_string();
        assert!(
            err.contains("spec.session.idleTimeout") && err.contains("out of range"),
            "{err}"
        );
        assert!(parse("-5m").unwrap().is_negative());
        assert!(!parse("ten minutes").unwrap_err().contains("out of range"));
    }
}
