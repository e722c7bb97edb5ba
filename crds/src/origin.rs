//! Web origins as RFC 6454 tuples: the syntax of `spec.origins.allow` entries and of `Origin`
//! request headers.
//!
//! An origin is `scheme://host[:port]` with scheme `http` or `https`, no path, query, fragment or
//! user info. Scheme and host compare case-insensitively; a missing port is the scheme's default
//! (80 or 443), so `https://a.example` and `https://a.example:443` are the same origin.

use std::fmt;

/// A parsed origin.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    /// `http` or `https`, lowercase.
    pub scheme: String,
    /// Host name or IP literal (IPv6 in brackets), lowercase.
    pub host: String,
    /// Port, the scheme's default when absent.
    pub port: u16,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

const EXPECTED: &str =
    "expected scheme://host[:port] with scheme http or https, e.g. \"https://app.example.com\"";

impl Origin {
    /// Parses `scheme://host[:port]`.
    ///
    /// # Errors
    /// A message saying what is wrong with `text` and what is expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        let fail = |what: &str| Err(format!("{text:?}: {what}; {EXPECTED}"));
        let Some((scheme, rest)) = text.split_once("://") else {
            return fail("no scheme");
        };
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return fail("unsupported scheme"),
        };
        if rest.contains(['/', '?', '#', '@']) {
            return fail("an origin has no path, query, fragment or user info");
        }
        let (host, port) = if let Some(after) = rest.strip_prefix('[') {
            let Some((inner, tail)) = after.split_once(']') else {
                return fail("unclosed IPv6 literal");
            };
            if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
                return fail("invalid IPv6 literal");
            }
            let port = match tail {
                "" => None,
                t => match t.strip_prefix(':') {
                    Some(p) => Some(p),
                    None => return fail("junk after the IPv6 literal"),
                },
            };
            (&rest[..inner.len() + 2], port)
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        let host_ok = !host.is_empty()
            && host.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':')
            });
        if !host_ok {
            return fail("invalid host");
        }
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return fail("invalid port"),
            },
        };
        Ok(Self {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_origins() {
        let o = Origin::parse("HTTPS://App.Example.com").unwrap();
        assert_eq!(
            (o.scheme.as_str(), o.host.as_str(), o.port),
            ("https", "app.example.com", 443)
        );
        assert_eq!(Origin::parse("http://localhost:3000").unwrap().port, 3000);
        assert_eq!(Origin::parse("http://[::1]:8080").unwrap().host, "[::1]");
        assert_eq!(Origin::parse("http://[::1]").unwrap().port, 80);
        assert_eq!(
            Origin::parse("https://a.example"),
            Origin::parse("https://a.example:443")
        );
        for bad in [
            "app.example.com",
            "ftp://app.example.com",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://app.example.com:0",
            "https://app.example.com:+80",
            "https://:443",
            "https://",
            "https://user@app.example.com",
            "http://[::1",
            "http://[zz]",
            "null",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
    }
}
