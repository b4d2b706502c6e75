//! Accuracy of the HyperLogLog estimate over several seeds and cardinalities.
//!
//! Cardinalities near the linear-counting switch (about 40k to 50k, `2.5 m` to `3 m`) are left
//! out of the 4-standard-error check: there the raw estimate of the specified formula has a
//! known positive bias (see `hll_error_profile`).
#![allow(clippy::unwrap_used)]

use floe_sketch::{HyperLogLog, hll};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn hll_within_four_standard_errors() {
    let mut worst = 0f64;
    for (n, seeds) in [
        (10u64, 20u64),
        (100, 20),
        (1000, 10),
        (10_000, 5),
        (100_000, 3),
        (1_000_000, 2),
    ] {
        let mut sum_rel = 0f64;
        for seed in 0..seeds {
            let mut rng = StdRng::seed_from_u64(seed * 7919 + n);
            // n distinct random 64-bit values (collisions among them are negligible), each
            // added twice.
            let base: i64 = rng.random();
            let mut s = HyperLogLog::new();
            for j in 0..n as i64 {
                let v = base.wrapping_add(j.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64));
                s.add_i64(v);
                s.add_i64(v);
            }
            let est = s.estimate() as f64;
            let rel = (est - n as f64) / n as f64;
            sum_rel += rel;
            worst = worst.max(rel.abs() / hll::STANDARD_ERROR);
            assert!(
                rel.abs() <= 4.0 * hll::STANDARD_ERROR,
                "n={n} seed={seed} est={est}"
            );
            if n <= 100 {
                // Linear counting is near-exact for small counts: only values whose hashes
                // share a register and a rank are lost (about n^2 / 2m ~ 0.3 at n = 100).
                assert!((est - n as f64).abs() <= 3.0, "n={n} seed={seed} est={est}");
            }
        }
        eprintln!(
            "n={n:>8}: mean relative error {:+.5} over {seeds} seeds",
            sum_rel / seeds as f64
        );
    }
    eprintln!("worst error: {worst:.2} standard errors");
}

/// Mean and worst relative error around the linear-counting switch (`E <= 2.5 m`), where
/// the raw HyperLogLog estimate is known to be biased. A measurement, not a check:
/// `cargo test --test accuracy -- --ignored --nocapture`.
#[test]
#[ignore]
fn hll_error_profile() {
    for n in [
        20_000u64, 30_000, 35_000, 38_000, 40_000, 42_000, 45_000, 50_000, 60_000, 80_000, 120_000,
        200_000,
    ] {
        let seeds = 40u64;
        let (mut sum, mut sum_sq, mut worst) = (0f64, 0f64, 0f64);
        for seed in 0..seeds {
            let mut rng = StdRng::seed_from_u64(seed * 104_729 + n);
            let base: i64 = rng.random();
            let mut s = HyperLogLog::new();
            for j in 0..n as i64 {
                s.add_i64(base.wrapping_add(j.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64)));
            }
            let rel = (s.estimate() as f64 - n as f64) / n as f64;
            sum += rel;
            sum_sq += rel * rel;
            worst = worst.max(rel.abs());
        }
        let mean = sum / seeds as f64;
        let rms = (sum_sq / seeds as f64).sqrt();
        eprintln!(
            "n={n:>7}: mean {mean:+.4}  rms {rms:.4} ({:.2} SE)  worst {worst:.4} ({:.2} SE)",
            rms / hll::STANDARD_ERROR,
            worst / hll::STANDARD_ERROR
        );
    }
}
