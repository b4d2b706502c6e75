//! A generated corpus for tests and benchmarks: valid values of every built-in detector
//! ([`value`]) and decoys that must not be found ([`decoy`]) — Luhn-invalid card numbers,
//! CPFs with a wrong check digit, UUIDs, hex trace and span ids, version strings, dates,
//! order numbers, hex digests. Deterministic for a seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Detector;

/// A seeded source of values.
#[derive(Debug)]
pub struct Corpus {
    rng: StdRng,
}

const WORDS: [&str; 12] = [
    "jane", "omar", "li", "ana", "kofi", "mia", "ravi", "lena", "sam", "yuki", "noor", "ivan",
];
const DOMAINS: [&str; 5] = [
    "example.com",
    "mail.example.org",
    "shop.example.net",
    "corp.example",
    "ex.io",
];

impl Corpus {
    /// A corpus seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn digits(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.rng.random_range(0..10)).collect()
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.random_range(0..from.len())]
    }

    fn chars(&mut self, alphabet: &[u8], n: usize) -> String {
        (0..n)
            .map(|_| alphabet[self.rng.random_range(0..alphabet.len())] as char)
            .collect()
    }

    /// A valid value `detector` must find; for [`Detector::Bearer`] the whole
    /// `Bearer <token>` (the token is what it finds: [`found_part`]).
    pub fn value(&mut self, detector: Detector) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        const URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        match detector {
            Detector::Email => {
                let (a, b) = (self.pick(&WORDS), self.pick(&WORDS));
                let n = self.rng.random_range(1..999);
                format!("{a}.{b}{n}@{}", self.pick(&DOMAINS))
            }
            Detector::Phone => {
                let d = self.digits(10);
                let s = |r: std::ops::Range<usize>| {
                    d[r].iter().map(|x| x.to_string()).collect::<String>()
                };
                match self.rng.random_range(0..3) {
                    0 => format!("+1 {}{} {} {}", 2 + d[0] % 8, s(1..3), s(3..6), s(6..10)),
                    1 => format!("+44 20 {} {}", s(0..4), s(4..8)),
                    _ => format!("({}{}) {}-{}", 2 + d[0] % 8, s(1..3), s(3..6), s(6..10)),
                }
            }
            Detector::Card => {
                let prefix: Vec<u32> = match self.rng.random_range(0..3) {
                    0 => vec![4],
                    1 => vec![5, self.rng.random_range(1..6)],
                    _ => vec![6, 0, 1, 1],
                };
                let mut d = prefix;
                let rest = self.digits(15 - d.len());
                d.extend(rest);
                d.push(luhn_digit(&d));
                let text: String = d.iter().map(|x| x.to_string()).collect();
                match self.rng.random_range(0..3) {
                    0 => text,
                    1 => group(&text, 4, ' '),
                    _ => group(&text, 4, '-'),
                }
            }
            Detector::Iban => {
                let (country, len) =
                    [("DE", 22), ("GB", 22), ("FR", 27), ("NL", 18)][self.rng.random_range(0..4)];
                let bban: String = match country {
                    "GB" => format!(
                        "{}{}",
                        self.chars(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 4),
                        digits_text(&self.digits(14))
                    ),
                    "NL" => format!(
                        "{}{}",
                        self.chars(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 4),
                        digits_text(&self.digits(10))
                    ),
                    _ => digits_text(&self.digits(len - 4)),
                };
                let check = 98 - mod97(&format!("{bban}{country}00"));
                group(&format!("{country}{check:02}{bban}"), 4, ' ')
            }
            Detector::UsSsn => {
                let area = self.rng.random_range(1..900);
                let area = if area == 666 { 667 } else { area };
                format!(
                    "{area:03}-{:02}-{:04}",
                    self.rng.random_range(1..100),
                    self.rng.random_range(1..10000)
                )
            }
            Detector::Cpf => {
                let mut d = self.digits(9);
                d[0] = 1 + d[0] % 9;
                d.push(check11(&d, (2..=10).rev()));
                d.push(check11(&d, (2..=11).rev()));
                let t = digits_text(&d);
                format!("{}.{}.{}-{}", &t[0..3], &t[3..6], &t[6..9], &t[9..])
            }
            Detector::Cnpj => {
                let mut d = self.digits(8);
                d[0] = 1 + d[0] % 9;
                d.extend([0, 0, 0, 1]);
                d.push(check11(
                    &d,
                    [5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2].into_iter(),
                ));
                d.push(check11(
                    &d,
                    [6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2].into_iter(),
                ));
                let t = digits_text(&d);
                format!(
                    "{}.{}.{}/{}-{}",
                    &t[0..2],
                    &t[2..5],
                    &t[5..8],
                    &t[8..12],
                    &t[12..]
                )
            }
            Detector::Ipv4 => format!(
                "{}.{}.{}.{}",
                self.rng.random_range(11..224),
                self.rng.random_range(0..256),
                self.rng.random_range(0..256),
                self.rng.random_range(1..255)
            ),
            Detector::Ipv6 => format!(
                "2001:db8:{:x}:{:x}::{:x}",
                self.rng.random_range(1..0xffff),
                self.rng.random_range(1..0xffff),
                self.rng.random_range(1..0xffff)
            ),
            Detector::Jwt => {
                use base64::Engine;
                let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                let header = e.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
                let n: u32 = self.rng.random();
                let payload =
                    e.encode(format!(r#"{{"sub":"{n}","name":"{}"}}"#, self.pick(&WORDS)));
                format!("{header}.{payload}.{}", self.chars(URL, 43))
            }
            Detector::CloudKey => format!("AKIA{}", self.chars(UPPER, 16)),
            Detector::PrivateKey => format!(
                "-----BEGIN RSA PRIVATE KEY-----\n{}\n{}\n-----END RSA PRIVATE KEY-----",
                self.chars(ALNUM, 64),
                self.chars(ALNUM, 40)
            ),
            Detector::Bearer => format!("Bearer {}", self.secret(40)),
            Detector::Secret => self.secret(32),
        }
    }

    /// `n` characters mixing upper case, lower case and digits, of high entropy.
    fn secret(&mut self, n: usize) -> String {
        loop {
            let s = self.chars(
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                n,
            );
            if crate::validate::high_entropy(&s, 4.0) {
                return s;
            }
        }
    }

    /// A decoy: text that looks like personal data or a secret and is not.
    pub fn decoy(&mut self) -> String {
        match self.rng.random_range(0..10) {
            0 => {
                // A card number with a wrong Luhn digit.
                let mut d = vec![4];
                d.extend(self.digits(14));
                let good = luhn_digit(&d);
                d.push((good + 1 + self.rng.random_range(0..9)) % 10);
                group(&digits_text(&d), 4, ' ')
            }
            1 => {
                // A CPF with a wrong second check digit.
                let mut d = self.digits(9);
                d[0] = 1 + d[0] % 9;
                d.push(check11(&d, (2..=10).rev()));
                let good = check11(&d, (2..=11).rev());
                d.push((good + 1 + self.rng.random_range(0..9)) % 10);
                let t = digits_text(&d);
                format!("{}.{}.{}-{}", &t[0..3], &t[3..6], &t[6..9], &t[9..])
            }
            2 => {
                let h = self.chars(b"0123456789abcdef", 32);
                format!(
                    "{}-{}-4{}-a{}-{}",
                    &h[0..8],
                    &h[8..12],
                    &h[13..16],
                    &h[17..20],
                    &h[20..32]
                )
            }
            3 => self.chars(b"0123456789abcdef", 32),
            4 => self.chars(b"0123456789abcdef", 16),
            5 => format!(
                "v{}.{}.{}",
                self.rng.random_range(0..20),
                self.rng.random_range(0..100),
                self.rng.random_range(0..1000)
            ),
            6 => format!(
                "2026-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                self.rng.random_range(1..13),
                self.rng.random_range(1..29),
                self.rng.random_range(0..24),
                self.rng.random_range(0..60),
                self.rng.random_range(0..60)
            ),
            7 => format!("order {}", self.rng.random_range(1_000_000..99_999_999)),
            8 => self.chars(b"0123456789abcdef", 64),
            _ => format!(
                "/api/v{}/orders/{}/items",
                self.rng.random_range(1..4),
                self.rng.random_range(1..100000)
            ),
        }
    }
}

/// The part of a [`Corpus::value`] its detector finds (and must never be written): the
/// token of a bearer header, else the whole value.
pub fn found_part(detector: Detector, value: &str) -> &str {
    match detector {
        Detector::Bearer => value.trim_start_matches("Bearer "),
        _ => value,
    }
}

fn digits_text(d: &[u32]) -> String {
    d.iter().map(|x| x.to_string()).collect()
}

fn group(text: &str, n: usize, sep: char) -> String {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(n)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .join(&sep.to_string())
}

/// The digit that makes `d` followed by it pass Luhn.
fn luhn_digit(d: &[u32]) -> u32 {
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| match i % 2 {
            0 if x * 2 > 9 => x * 2 - 9,
            0 => x * 2,
            _ => x,
        })
        .sum();
    (10 - sum % 10) % 10
}

fn check11(d: &[u32], weights: impl Iterator<Item = u32>) -> u32 {
    let sum: u32 = d.iter().zip(weights).map(|(x, w)| x * w).sum();
    match sum % 11 {
        0 | 1 => 0,
        r => 11 - r,
    }
}

/// `text` (digits and upper-case letters) mod 97, letters as 10–35.
fn mod97(text: &str) -> u32 {
    let mut r = 0u32;
    for c in text.chars() {
        let v = c.to_digit(36).expect("digits and letters");
        for digit in v.to_string().chars() {
            r = (r * 10 + digit.to_digit(10).unwrap()) % 97;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Outcome, Redactor, Rules};

    #[test]
    fn every_value_is_found_by_its_detector_and_no_decoy_is() {
        let r = Redactor::new(&Rules::default()).unwrap();
        let mut corpus = Corpus::new(42);
        for detector in Detector::ALL {
            for _ in 0..200 {
                let value = corpus.value(detector);
                let text = format!("x {value} y");
                let mut found = Vec::new();
                let outcome = r.redact(None, &text, &mut |f| {
                    found.push(f.finder.name().to_string())
                });
                assert_eq!(found, [detector.name()], "{value}");
                let Outcome::Replaced(out) = outcome else {
                    panic!("{value}")
                };
                assert!(!out.contains(found_part(detector, &value)), "{out}");
            }
        }
        let mut false_positives = 0;
        for _ in 0..10_000 {
            let decoy = corpus.decoy();
            if r.redact(None, &decoy, &mut |_| {}) != Outcome::Kept {
                false_positives += 1;
            }
        }
        assert_eq!(false_positives, 0, "decoys found");
    }
}
