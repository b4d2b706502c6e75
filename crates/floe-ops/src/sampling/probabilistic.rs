//! The `probabilistic` policy's choice: a trace is kept when a hash of its id is at or below a
//! threshold, so every replica, restart and the OpenTelemetry Collector's `tail_sampling`
//! processor agree on each trace.
//!
//! The rule is the Collector's (contrib `processor/tailsamplingprocessor`, v0.155.0 through
//! v0.165.1): hash = FNV-1a 64 over the salt's UTF-8 bytes, then the 16 bytes of the trace
//! id; the salt is `default-hash-seed` unless one is set; threshold = ⌊(2⁶⁴ − 1) × p⌋ for the
//! share p = `sampling_percentage` / 100, the product of the 53-bit float p and 2⁶⁴ − 1
//! rounded to 64 significant bits (ties to even) before the floor, as Go's `math/big` does;
//! p ≥ 1 keeps every trace.
//!
//! FNV-1a mixes the last bytes of the id little: ids that differ only there (a counter) are
//! kept or dropped together. Random ids — what the W3C trace context asks for — give the
//! share within a fraction of a percent over 100k traces.

/// The salt the Collector uses when none is configured.
pub const DEFAULT_SALT: &str = "default-hash-seed";

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `salt` then `trace_id`.
pub fn hash(salt: &str, trace_id: &[u8; 16]) -> u64 {
    salt.as_bytes()
        .iter()
        .chain(trace_id)
        .fold(FNV_OFFSET, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME)
        })
}

/// The largest hash kept at `percentage` percent.
pub fn threshold(percentage: f64) -> u64 {
    let ratio = percentage / 100.0;
    if ratio.is_nan() || ratio <= 0.0 {
        return 0;
    }
    if ratio >= 1.0 {
        return u64::MAX;
    }
    // ratio = mantissa × 2^exponent, mantissa < 2^53.
    let bits = ratio.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let (mantissa, exponent) = if biased == 0 {
        (bits & ((1 << 52) - 1), -1074)
    } else {
        ((bits & ((1 << 52) - 1)) | (1 << 52), biased - 1075)
    };
    // The exact product, then rounded to 64 significant bits, ties to even.
    let product = u128::from(u64::MAX) * u128::from(mantissa);
    let width = 128 - product.leading_zeros() as i32;
    let shift = (width - 64).max(0);
    let rounded = if shift == 0 {
        product
    } else {
        let kept = product >> shift;
        let rest = product & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let up = rest > half || (rest == half && kept & 1 == 1);
        (kept + u128::from(up)) << shift
    };
    // Times 2^exponent (negative for a ratio below 1), truncated.
    let down = -exponent;
    if down >= 128 {
        0
    } else {
        (rounded >> down).min(u128::from(u64::MAX)) as u64
    }
}

/// Whether `trace_id` is kept at the `threshold` of [`threshold`] with `salt`.
pub fn keeps(salt: &str, threshold: u64, trace_id: &[u8; 16]) -> bool {
    hash(salt, trace_id) <= threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(hex: &str) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    /// Values computed with Go's `hash/fnv` and `math/big`, as the Collector computes them.
    #[test]
    fn hashes_and_thresholds_are_the_collector_s() {
        for (hex, expected) in [
            (
                "5b8efff798038103d269b633813fc60c",
                10_804_547_627_798_090_743u64,
            ),
            (
                "0102030405060708090a0b0c0d0e0f10",
                15_838_989_281_584_434_349,
            ),
            (
                "00000000000000000000000000000001",
                16_254_957_729_900_898_954,
            ),
        ] {
            assert_eq!(hash(DEFAULT_SALT, &id(hex)), expected, "{hex}");
        }
        for (percentage, expected) in [
            (10.0, 1_844_674_407_370_955_263u64),
            (1.0, 184_467_440_737_095_519),
            (25.0, 4_611_686_018_427_387_903),
            (33.3, 6_142_765_776_545_279_999),
            (50.0, 9_223_372_036_854_775_807),
            (0.1, 18_446_744_073_709_551),
            (100.0, u64::MAX),
        ] {
            assert_eq!(threshold(percentage), expected, "{percentage} %");
        }
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(f64::NAN), 0);
        assert_eq!(threshold(250.0), u64::MAX);
    }

    #[test]
    fn the_kept_share_of_random_ids_is_the_setting() {
        // splitmix64: independent 64-bit halves, as random W3C trace ids are.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for percentage in [1.0, 10.0, 50.0] {
            let limit = threshold(percentage);
            let n = 100_000;
            let kept = (0..n)
                .filter(|_| {
                    let mut trace = [0u8; 16];
                    trace[..8].copy_from_slice(&next().to_le_bytes());
                    trace[8..].copy_from_slice(&next().to_le_bytes());
                    keeps(DEFAULT_SALT, limit, &trace)
                })
                .count();
            // Within three standard deviations of a fair coin of that share.
            let (share, p) = (kept as f64 / n as f64, percentage / 100.0);
            let sigma = (p * (1.0 - p) / n as f64).sqrt();
            assert!(
                (share - p).abs() <= 3.0 * sigma,
                "{percentage} %: kept {:.3} %",
                100.0 * share
            );
        }
    }
}
