//! The built-in detectors: each a pattern that finds candidates and a validator that keeps
//! only real ones, in precedence order (where two findings overlap, the earlier detector's
//! wins: a card number inside what looks like a long secret is a card).

use crate::validate;

/// A built-in detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Detector {
    /// A private-key block (`-----BEGIN … PRIVATE KEY-----`), to its end or the string's.
    PrivateKey,
    /// A JSON Web Token whose header decodes with an `alg`.
    Jwt,
    /// An `Authorization: Bearer` token (the token, not the word).
    Bearer,
    /// A cloud or SaaS access key of a known shape: AWS, Google API, GitHub, Slack, Stripe.
    CloudKey,
    /// An e-mail address.
    Email,
    /// An IBAN: a registered country's length and the mod-97 check.
    Iban,
    /// A payment card number: an issuer's prefix and length, and the Luhn digit.
    Card,
    /// A Brazilian CNPJ with both check digits.
    Cnpj,
    /// A Brazilian CPF with both check digits.
    Cpf,
    /// A US Social Security number (`ddd-dd-dddd`) in the issued ranges.
    UsSsn,
    /// An IPv6 address.
    Ipv6,
    /// An IPv4 address.
    Ipv4,
    /// A phone number: `+` and a country code, or a grouped national number, 10–15 digits.
    Phone,
    /// A high-entropy secret: ≥ 24 characters mixing cases and digits, ≥ 4 bits per character.
    Secret,
}

impl Detector {
    /// Every built-in detector, in precedence order.
    pub const ALL: [Detector; 14] = [
        Detector::PrivateKey,
        Detector::Jwt,
        Detector::Bearer,
        Detector::CloudKey,
        Detector::Email,
        Detector::Iban,
        Detector::Card,
        Detector::Cnpj,
        Detector::Cpf,
        Detector::UsSsn,
        Detector::Ipv6,
        Detector::Ipv4,
        Detector::Phone,
        Detector::Secret,
    ];

    /// Its name in job files and in the findings table.
    pub fn name(self) -> &'static str {
        match self {
            Detector::PrivateKey => "private_key",
            Detector::Jwt => "jwt",
            Detector::Bearer => "bearer",
            Detector::CloudKey => "cloud_key",
            Detector::Email => "email",
            Detector::Card => "card",
            Detector::Iban => "iban",
            Detector::Cnpj => "cnpj",
            Detector::Cpf => "cpf",
            Detector::UsSsn => "us_ssn",
            Detector::Ipv6 => "ipv6",
            Detector::Ipv4 => "ipv4",
            Detector::Phone => "phone",
            Detector::Secret => "secret",
        }
    }

    /// The detector named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The pattern that finds its candidates (ASCII digits only); a group named `v` marks
    /// the part that is the finding (the token of `Bearer <token>`).
    pub fn pattern(self) -> &'static str {
        match self {
            Detector::PrivateKey => {
                r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?s:.*?)(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\z)"
            }
            Detector::Jwt => r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
            Detector::Bearer => r"(?i)\bbearer\s+(?P<v>[A-Za-z0-9._~+/-]{8,}=*)",
            Detector::CloudKey => {
                r"\b(?:(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}|gh[pousr]_[A-Za-z0-9]{36}|xox[abprs]-[A-Za-z0-9-]{10,72}|sk_live_[0-9A-Za-z]{24,99})\b"
            }
            Detector::Email => r"(?i)\b[a-z0-9._%+-]{1,64}@(?:[a-z0-9-]{1,63}\.)+[a-z]{2,24}\b",
            Detector::Card => r"\b(?:[0-9][ -]?){12,18}[0-9]\b",
            Detector::Iban => r"(?i)\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b",
            Detector::Cnpj => r"\b(?:[0-9]{2}\.[0-9]{3}\.[0-9]{3}/[0-9]{4}-[0-9]{2}|[0-9]{14})\b",
            Detector::Cpf => r"\b(?:[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}|[0-9]{11})\b",
            Detector::UsSsn => r"\b[0-9]{3}-[0-9]{2}-[0-9]{4}\b",
            Detector::Ipv6 => r"(?i)(?:[0-9a-f]{1,4}|:)(?::[0-9a-f]{0,4}){1,7}",
            Detector::Ipv4 => r"\b(?:[0-9]{1,3}\.){3}[0-9]{1,3}\b",
            Detector::Phone => {
                r"(?:\+[0-9]{1,3}[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{2,4}(?:[ .-]?[0-9]{2,4}){1,3}|(?:\([0-9]{2,4}\)[ .-]?|\b[0-9]{2,4}[ .-])[0-9]{3,4}[ .-][0-9]{3,4})\b"
            }
            Detector::Secret => r"[A-Za-z0-9+/_-]{24,}={0,2}",
        }
    }

    /// How much of the candidate `found` is a finding, in bytes from its start (`None`: none
    /// of it). `before` and `after` are the text around it, which must not continue a longer
    /// number or dotted sequence for the detectors of digits. A card number, an IBAN or an
    /// IPv6 address the pattern ran past the end of (an expiry date after a card, a currency
    /// after an IBAN, a colon after an address) is retried shorter, at its separators.
    pub(crate) fn validate(self, found: &str, before: &str, after: &str) -> Option<usize> {
        if !found.is_ascii() {
            return None;
        }
        let numeric = matches!(
            self,
            Detector::Card
                | Detector::Cnpj
                | Detector::Cpf
                | Detector::UsSsn
                | Detector::Ipv4
                | Detector::Phone
        );
        if numeric && continues(before.chars().rev(), self) {
            return None;
        }
        let whole = |ok: bool| ok.then_some(found.len());
        // The whole candidate, then each prefix ending before a separator, longest first.
        let ends = |separators: &'static [u8]| -> Vec<usize> {
            std::iter::once(found.len())
                .chain(
                    found
                        .bytes()
                        .enumerate()
                        .rev()
                        .filter(|(_, b)| separators.contains(b))
                        .map(|(i, _)| i),
                )
                .collect()
        };
        match self {
            Detector::PrivateKey | Detector::Bearer | Detector::CloudKey | Detector::Email => {
                Some(found.len())
            }
            Detector::Jwt => whole(validate::jwt(found)),
            Detector::Card => ends(b" -").into_iter().find(|&end| {
                validate::card(&found[..end])
                    && !continues(found[end..].chars().chain(after.chars()), self)
            }),
            Detector::Iban => ends(b" ")
                .into_iter()
                .find(|&end| validate::iban(&found[..end])),
            Detector::Ipv6 => ends(b":").into_iter().find(|&end| {
                let f = &found[..end];
                f.matches(':').count() >= 2 && validate::ipv6(f)
            }),
            _ if numeric && continues(after.chars(), self) => None,
            Detector::Cnpj => whole(validate::cnpj(found)),
            Detector::Cpf => whole(validate::cpf(found)),
            Detector::UsSsn => whole(validate::us_ssn(found)),
            Detector::Ipv4 => whole(validate::ipv4(found)),
            Detector::Phone => whole(validate::phone(found)),
            Detector::Secret => whole(validate::high_entropy(found.trim_end_matches('='), 4.0)),
        }
    }
}

/// Whether the text next to a numeric candidate (`next`, walking away from it) continues
/// it: a letter or digit, or a joining character and then a digit — a version `1.2.3.4.5`,
/// a longer id. A space joins only for a phone number (the fourth group of what is a card
/// number, not a phone's); a slash not for an IPv4 address (`10.0.0.1/24`).
fn continues(mut next: impl Iterator<Item = char>, detector: Detector) -> bool {
    let joins = |c: char| match c {
        '.' | '-' | '_' => true,
        '/' => detector != Detector::Ipv4,
        ' ' => detector == Detector::Phone,
        _ => false,
    };
    match next.next() {
        Some(c) if c.is_ascii_alphanumeric() => true,
        Some(c) if joins(c) => next.next().is_some_and(|d| d.is_ascii_digit()),
        _ => false,
    }
}

impl std::fmt::Display for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
