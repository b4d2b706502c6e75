//! Personal data and secrets in strings: found, validated and redacted before anything is
//! written.
//!
//! * [`Detector`]s — e-mail, phone, payment card (issuer and Luhn), IBAN (mod 97), US SSN,
//!   CPF and CNPJ (check digits), IPv4 and IPv6, JWT, cloud access keys, private-key blocks,
//!   bearer tokens, high-entropy secrets — and the job's own regexes.
//! * A [`Redactor`] runs all of them over a string in one [`regex::RegexSet`] pass, keeps
//!   the candidates their validators accept (so a random 16-digit id is not a card, a CPF
//!   with a wrong check digit not a CPF), and applies each one's [`Action`]: mask, keyed
//!   hash, drop the attribute, drop the record, or flag only. Keys can be allowed (never
//!   scanned) or redacted whatever they hold.
//! * Each finding is reported as what found it and what was done — never the value.

pub mod corpus;
mod detectors;
mod redactor;
mod validate;

pub use detectors::Detector;
pub use redactor::{Action, Finder, Finding, Outcome, Redactor, Rules, RulesError, UserPattern};
