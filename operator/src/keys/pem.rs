//! Certificates in PEM text, read just far enough to tell which CA of a bundle issued a
//! certificate: the blocks of a bundle, and a certificate's issuer and subject names (their DER
//! bytes, compared as they are). No signature is checked: the operator made every certificate
//! of the ring itself, and only needs to keep a CA with the certificate it signed.

/// The label of a certificate block.
const CERTIFICATE: &str = "CERTIFICATE";

/// The certificate blocks of `text`, each from its `BEGIN` line to its `END` line with one
/// line feed after it, in order; anything between blocks is dropped.
pub(crate) fn certificates(text: &str) -> Vec<String> {
    let begin = format!("-----BEGIN {CERTIFICATE}-----");
    let end = format!("-----END {CERTIFICATE}-----");
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let Some(stop) = rest[start..].find(&end) else {
            break;
        };
        let stop = start + stop + end.len();
        blocks.push(format!("{}\n", &rest[start..stop]));
        rest = &rest[stop..];
    }
    blocks
}

/// Whether `text` holds a PEM block whose label ends with `PRIVATE KEY` (PKCS#8, or a key of
/// one algorithm).
pub(crate) fn has_private_key(text: &str) -> bool {
    text.lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
            .is_some_and(|label| label.ends_with("PRIVATE KEY"))
    })
}

/// The issuer and subject names of the certificate in the PEM `block` (DER, as encoded), or
/// `None` when it is no X.509 certificate.
pub(crate) fn names(block: &str) -> Option<Names> {
    let der = decode(block)?;
    let (certificate, _) = element(&der, SEQUENCE)?;
    let (tbs, _) = element(certificate, SEQUENCE)?;
    let mut rest = tbs;
    if rest.first() == Some(&VERSION) {
        rest = skip(rest)?;
    }
    // serialNumber, signature
    rest = skip(rest)?;
    rest = skip(rest)?;
    let issuer = whole(rest, SEQUENCE)?;
    rest = skip(rest)?;
    // validity
    rest = skip(rest)?;
    let subject = whole(rest, SEQUENCE)?;
    Some(Names {
        issuer: issuer.to_vec(),
        subject: subject.to_vec(),
    })
}

/// Whether the CA certificate `ca` issued `certificate` (both PEM blocks): the certificate's
/// issuer name is the CA's subject name.
pub(crate) fn issued_by(certificate: &str, ca: &str) -> bool {
    match (names(certificate), names(ca)) {
        (Some(cert), Some(ca)) => cert.issuer == ca.subject,
        _ => false,
    }
}

/// A certificate's issuer and subject, as DER.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// The issuer's distinguished name.
    pub(crate) issuer: Vec<u8>,
    /// The subject's distinguished name.
    pub(crate) subject: Vec<u8>,
}

/// DER tag of a SEQUENCE.
const SEQUENCE: u8 = 0x30;
/// DER tag of a certificate's explicit `[0]` version.
const VERSION: u8 = 0xa0;

/// The first DER element of `input`: `(tag, header + content length)`; `None` when it is cut
/// short or its length takes more than 4 bytes.
fn header(input: &[u8]) -> Option<(u8, usize, usize)> {
    let tag = *input.first()?;
    let first = *input.get(1)?;
    let (len, at) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let bytes = input.get(2..2 + n)?;
        let len = bytes
            .iter()
            .fold(0_usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    (input.len() >= at + len).then_some((tag, at, len))
}

/// The content of the first element of `input` when its tag is `tag`, and what follows it.
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (found, at, len) = header(input)?;
    (found == tag).then(|| (&input[at..at + len], &input[at + len..]))
}

/// The first element of `input` whole (header and content) when its tag is `tag`.
fn whole(input: &[u8], tag: u8) -> Option<&[u8]> {
    let (found, at, len) = header(input)?;
    (found == tag).then(|| &input[..at + len])
}

/// What follows the first element of `input`.
fn skip(input: &[u8]) -> Option<&[u8]> {
    let (_, at, len) = header(input)?;
    Some(&input[at + len..])
}

/// The DER bytes of the first certificate block of `block` (its base64 lines decoded).
fn decode(block: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {CERTIFICATE}-----");
    let body = block.split_once(&begin)?.1;
    let body = body.split_once("-----END")?.0;
    base64(body)
}

/// Standard base64 with padding; whitespace is skipped, anything else outside the alphabet is
/// `None`.
fn base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    };
    let symbols: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let data = symbols
        .iter()
        .position(|b| *b == b'=')
        .map_or(&symbols[..], |at| &symbols[..at]);
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    let (mut acc, mut bits) = (0_u32, 0_u32);
    for c in data {
        acc = (acc << 6) | value(*c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use tether_crds::keyring::Generation;

    use super::*;

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64("aGVs\nbG8h").unwrap(), b"hello!");
        assert_eq!(base64("aA==").unwrap(), b"h");
        assert!(base64("a$==").is_none());
    }

    #[test]
    fn a_leaf_names_the_ca_that_issued_it_and_no_other() {
        let one = Generation::new("tools/weather").unwrap();
        let two = Generation::new("tools/weather").unwrap();
        assert!(issued_by(&one.cert_pem, &one.ca_pem));
        assert!(issued_by(&one.ca_pem, &one.ca_pem), "a CA is self-signed");
        assert!(!issued_by(&one.cert_pem, &two.ca_pem));
        assert!(!issued_by(&two.cert_pem, &one.ca_pem));
        let leaf = names(&one.cert_pem).unwrap();
        assert_ne!(leaf.issuer, leaf.subject);
        assert!(!issued_by("not a certificate", &one.ca_pem));
        let cut = &one.cert_pem[..one.cert_pem.len() / 2];
        assert!(names(&format!("{cut}\n-----END CERTIFICATE-----\n")).is_none());
    }

    #[test]
    fn a_bundle_splits_into_its_certificates_in_order() {
        let one = Generation::new("a").unwrap();
        let two = Generation::new("b").unwrap();
        let bundle = format!("{}junk\r\n{}", one.ca_pem, two.ca_pem.replace('\n', "\r\n"));
        let blocks = certificates(&bundle);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0], one.ca_pem);
        assert!(issued_by(&two.cert_pem, &blocks[1]));
        assert!(certificates("-----BEGIN CERTIFICATE-----\nAAAA").is_empty());
        assert!(has_private_key(&one.key_pem));
        assert!(!has_private_key(&one.cert_pem));
    }
}
