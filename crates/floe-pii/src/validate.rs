//! Validators: what a pattern's match must also satisfy to be a finding — check digits,
//! ranges, decodable structure, entropy. Each takes the matched text as found (separators
//! and all) and is pure.

/// The ASCII digits of `text`, in order.
fn digits(text: &str) -> Vec<u32> {
    text.chars().filter_map(|c| c.to_digit(10)).collect()
}

/// A payment card number: 13–19 digits, an issuer prefix of a card network, and the Luhn
/// check digit.
pub(crate) fn card(text: &str) -> bool {
    let d = digits(text);
    if !(13..=19).contains(&d.len()) || !card_issuer(&d) {
        return false;
    }
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| match i % 2 {
            0 => x,
            _ if x * 2 > 9 => x * 2 - 9,
            _ => x * 2,
        })
        .sum();
    sum.is_multiple_of(10)
}

/// Whether the digits start with a prefix a card network issues (Visa, Mastercard, American
/// Express, Discover, JCB, Diners Club, UnionPay, Maestro) at a length it uses.
fn card_issuer(d: &[u32]) -> bool {
    let prefix = |n: usize| d[..n].iter().fold(0, |acc, x| acc * 10 + x);
    let len = d.len();
    match d[0] {
        4 => matches!(len, 13 | 16 | 19),
        5 => (51..=55).contains(&prefix(2)) && len == 16 || matches!(prefix(2), 50 | 56..=59),
        2 => (2221..=2720).contains(&prefix(4)) && len == 16,
        3 => {
            matches!(prefix(2), 34 | 37) && len == 15
                || (3528..=3589).contains(&prefix(4)) && len >= 16
                || matches!(prefix(2), 36 | 38 | 39) && len >= 14
                || (300..=305).contains(&prefix(3)) && len >= 14
        }
        6 => {
            prefix(4) == 6011
                || prefix(2) == 65
                || (644..=649).contains(&prefix(3))
                || prefix(2) == 62
                || matches!(prefix(2), 63 | 67)
        }
        _ => false,
    }
}

/// The length of an IBAN in each country of the registry (ISO 13616), by country code.
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AL", 28),
    ("AT", 20),
    ("AZ", 28),
    ("BA", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("BY", 28),
    ("CH", 21),
    ("CR", 22),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("DO", 28),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("GT", 28),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IQ", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LC", 32),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MR", 27),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SC", 31),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("ST", 25),
    ("SV", 28),
    ("TL", 23),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VA", 22),
    ("VG", 24),
    ("XK", 20),
];

/// An IBAN: a registered country's length and the ISO 7064 mod-97 check.
pub(crate) fn iban(text: &str) -> bool {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let compact = compact.to_ascii_uppercase();
    let Some(&(_, len)) = IBAN_LENGTHS
        .iter()
        .find(|(country, _)| compact.starts_with(country))
    else {
        return false;
    };
    if compact.len() != len {
        return false;
    }
    let (head, tail) = compact.split_at(4);
    let mut remainder = 0u32;
    for c in tail.chars().chain(head.chars()) {
        let value = match c {
            '0'..='9' => c as u32 - '0' as u32,
            'A'..='Z' => c as u32 - 'A' as u32 + 10,
            _ => return false,
        };
        for digit in value.to_string().chars() {
            remainder = (remainder * 10 + (digit as u32 - '0' as u32)) % 97;
        }
    }
    remainder == 1
}

/// A US Social Security number as issued: area not 000, 666 or 900–999, group not 00,
/// serial not 0000.
pub(crate) fn us_ssn(text: &str) -> bool {
    let d = digits(text);
    if d.len() != 9 {
        return false;
    }
    let area = d[0] * 100 + d[1] * 10 + d[2];
    let group = d[3] * 10 + d[4];
    let serial = d[5..].iter().fold(0, |acc, x| acc * 10 + x);
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

/// The mod-11 check digit of `d` under `weights` (CPF's count down to 2; CNPJ's wrap to 9
/// after 2).
fn mod11(d: &[u32], weights: impl Iterator<Item = u32>) -> u32 {
    let sum: u32 = d.iter().zip(weights).map(|(x, w)| x * w).sum();
    match sum % 11 {
        0 | 1 => 0,
        r => 11 - r,
    }
}

/// A Brazilian CPF: 11 digits, not all the same, both check digits right.
pub(crate) fn cpf(text: &str) -> bool {
    let d = digits(text);
    d.len() == 11
        && d.iter().any(|&x| x != d[0])
        && mod11(&d[..9], (2..=10).rev()) == d[9]
        && mod11(&d[..10], (2..=11).rev()) == d[10]
}

/// A Brazilian CNPJ: 14 digits, not all the same, both check digits right.
pub(crate) fn cnpj(text: &str) -> bool {
    let d = digits(text);
    let first = [5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2];
    let second = [6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2];
    d.len() == 14
        && d.iter().any(|&x| x != d[0])
        && mod11(&d[..12], first.into_iter()) == d[12]
        && mod11(&d[..13], second.into_iter()) == d[13]
}

/// A phone number: 10 to 15 digits, not all the same.
pub(crate) fn phone(text: &str) -> bool {
    let d = digits(text);
    (10..=15).contains(&d.len()) && d.iter().any(|&x| x != d[0])
}

/// An IPv4 address: four octets of at most 255, without leading zeros.
pub(crate) fn ipv4(text: &str) -> bool {
    let octets: Vec<&str> = text.split('.').collect();
    octets.len() == 4
        && octets.iter().all(|o| {
            !o.is_empty() && (o.len() == 1 || !o.starts_with('0')) && o.parse::<u8>().is_ok()
        })
}

/// An IPv6 address, as the standard library parses one (with `::` or all eight groups).
pub(crate) fn ipv6(text: &str) -> bool {
    text.contains(':') && text.parse::<std::net::Ipv6Addr>().is_ok()
}

/// A JSON Web Token: its header decodes (base64url) to a JSON object with an `alg`.
pub(crate) fn jwt(text: &str) -> bool {
    use base64::Engine;
    let Some(header) = text.split('.').next() else {
        return false;
    };
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    engine
        .decode(header.trim_end_matches('='))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .is_some_and(|v| v.get("alg").is_some())
}

/// A high-entropy secret: at least 24 characters mixing upper case, lower case and digits,
/// with a Shannon entropy of at least `bits` per character — which hex ids, UUIDs and words
/// do not reach.
pub(crate) fn high_entropy(text: &str, bits: f64) -> bool {
    let bytes = text.as_bytes();
    let classes = [
        bytes.iter().any(u8::is_ascii_uppercase),
        bytes.iter().any(u8::is_ascii_lowercase),
        bytes.iter().any(u8::is_ascii_digit),
    ];
    bytes.len() >= 24 && classes.iter().all(|c| *c) && entropy(bytes) >= bits
}

/// Shannon entropy of `bytes`, bits per byte.
pub(crate) fn entropy(bytes: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for b in bytes {
        counts[*b as usize] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_pass_luhn_and_an_issuer() {
        for good in [
            "4111 1111 1111 1111",
            "5500-0000-0000-0004",
            "340000000000009",
            "6011000000000004",
            "3530111333300000",
            "2223000048400011",
        ] {
            assert!(card(good), "{good}");
        }
        for bad in [
            "4111 1111 1111 1112", // Luhn
            "1234567812345670",    // Luhn-valid, no issuer
            "9999999999999995",    // idem
            "41111111111111",      // Visa at 14 digits
        ] {
            assert!(!card(bad), "{bad}");
        }
    }

    #[test]
    fn ibans_pass_mod_97_at_their_countrys_length() {
        assert!(iban("DE89 3704 0044 0532 0130 00"));
        assert!(iban("GB29NWBK60161331926819"));
        assert!(iban("FR1420041010050500013M02606"));
        assert!(!iban("DE89 3704 0044 0532 0130 01"));
        assert!(!iban("GB29NWBK6016133192681")); // short
        assert!(!iban("ZZ29NWBK60161331926819")); // no such country
    }

    #[test]
    fn brazilian_ids_need_both_check_digits() {
        assert!(cpf("529.982.247-25"));
        assert!(cpf("52998224725"));
        assert!(!cpf("529.982.247-26"));
        assert!(!cpf("111.111.111-11"));
        assert!(cnpj("11.222.333/0001-81"));
        assert!(!cnpj("11.222.333/0001-82"));
        assert!(!cnpj("00000000000000"));
    }

    #[test]
    fn ssn_ranges() {
        assert!(us_ssn("123-45-6789"));
        for bad in [
            "000-12-3456",
            "666-12-3456",
            "900-12-3456",
            "123-00-4567",
            "123-45-0000",
        ] {
            assert!(!us_ssn(bad), "{bad}");
        }
    }

    #[test]
    fn addresses_and_tokens() {
        assert!(ipv4("192.168.10.1"));
        assert!(!ipv4("256.1.1.1"));
        assert!(!ipv4("01.2.3.4"));
        assert!(ipv6("2001:db8::8a2e:370:7334"));
        assert!(!ipv6("12:30:45"));
        assert!(jwt("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"));
        assert!(!jwt("eyJub3RoaW5nIjoxfQ.eyJzdWIiOiIxIn0.sig"));
        assert!(high_entropy("q8ZrT2xLw9VbN4mKp7HsY3dFg6Jc", 4.0));
        assert!(!high_entropy("0af7651916cd43dd8448eb211c80319c", 4.0)); // hex id
        assert!(!high_entropy("550e8400-e29b-41d4-a716-446655440000", 4.0)); // UUID
        assert!(!high_entropy("AaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaA1", 4.0)); // low entropy
    }
}
