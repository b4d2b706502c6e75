//! Checks that the SQL in `SQL.md`, run on real engines over a Parquet file of partial
//! sketches, gives the same answers as the Rust merge and estimate, and that the answers are
//! accurate.
//!
//! * DuckDB: through the Python package of the test services (`FLOE_TEST_PYTHON`, set by
//!   `tests/services/up`); ignored without `--include-ignored` (which `tests/run` passes).
//! * Trino runs the same query against real rollup tables in the Trino tier
//!   (`tests/python/test_trino.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, ListArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use floe_sketch::{HyperLogLog, QuantileSketch, hll, quantile};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// How a group's partial sketches are made.
struct GroupSpec {
    name: &'static str,
    partitions: usize,
    distinct: u64,
    total: usize,
    /// Every partition sees all values (instead of a random share).
    replicate: bool,
    /// HLL values as strings (otherwise as Int64).
    strings: bool,
    dist: fn(&mut StdRng) -> f64,
}

fn normal(r: &mut StdRng) -> f64 {
    // Box-Muller.
    let u: f64 = 1.0 - r.random::<f64>();
    let v: f64 = r.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

fn specs() -> Vec<GroupSpec> {
    vec![
        GroupSpec {
            name: "a_tiny1",
            partitions: 1,
            distinct: 1,
            total: 1,
            replicate: false,
            strings: false,
            dist: |_| 3.25,
        },
        GroupSpec {
            name: "b_tiny3",
            partitions: 2,
            distinct: 2,
            total: 3,
            replicate: false,
            strings: true,
            dist: |r| [-1.0, 0.0, 7.5][r.random_range(0..3)],
        },
        GroupSpec {
            name: "c_empty",
            partitions: 3,
            distinct: 0,
            total: 0,
            replicate: false,
            strings: false,
            dist: |_| 0.0,
        },
        GroupSpec {
            name: "d_10",
            partitions: 3,
            distinct: 10,
            total: 100,
            replicate: false,
            strings: false,
            dist: |r| f64::from(r.random_range(-2..=3)),
        },
        GroupSpec {
            name: "e_1000",
            partitions: 5,
            distinct: 1000,
            total: 5000,
            replicate: false,
            strings: true,
            dist: |r| 100.0 * normal(r),
        },
        GroupSpec {
            name: "f_1234",
            partitions: 2,
            distinct: 1234,
            total: 1234,
            replicate: false,
            strings: true,
            dist: |r| r.random_range(-1.0..1.0),
        },
        GroupSpec {
            name: "g_100k",
            partitions: 8,
            distinct: 100_000,
            total: 300_000,
            replicate: false,
            strings: false,
            dist: |r| (3.0 + 2.0 * normal(r)).exp(),
        },
        GroupSpec {
            name: "h_1m",
            partitions: 4,
            distinct: 1_000_000,
            total: 1_000_000,
            replicate: false,
            strings: false,
            dist: |r| {
                if r.random::<f64>() < 0.05 {
                    0.0
                } else {
                    let s = if r.random::<f64>() < 0.7 { 1.0 } else { -1.0 };
                    s * 10f64.powf(r.random_range(-200.0..200.0))
                }
            },
        },
        GroupSpec {
            name: "h_45k",
            partitions: 3,
            distinct: 45_000,
            total: 60_000,
            replicate: false,
            strings: true,
            dist: |r| r.random_range(0.0..1e6),
        },
        GroupSpec {
            name: "i_dup",
            partitions: 6,
            distinct: 2000,
            total: 2000,
            replicate: true,
            strings: false,
            dist: |r| -(1.0 - r.random::<f64>()).ln() * 1e-5,
        },
    ]
}

/// The generated data set, written to Parquet once per test process.
struct Dataset {
    dir: PathBuf,
    /// Per group: true distinct count and the sorted raw quantile values.
    truth: BTreeMap<String, (u64, Vec<f64>)>,
    /// Per group: the sketch built over all the group's values directly.
    direct: BTreeMap<String, (HyperLogLog, QuantileSketch)>,
}

fn dataset() -> &'static Dataset {
    static DATA: OnceLock<Dataset> = OnceLock::new();
    DATA.get_or_init(build_dataset)
}

fn build_dataset() -> Dataset {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("floe-sketch-sql");
    std::fs::create_dir_all(dir.join("partials")).unwrap();
    std::fs::create_dir_all(dir.join("raw")).unwrap();
    let mut rng = StdRng::seed_from_u64(20_240_601);
    let mut rows: Vec<(String, Option<HyperLogLog>, Option<QuantileSketch>)> = Vec::new();
    let (mut raw_g, mut raw_x) = (Vec::new(), Vec::new());
    let mut truth = BTreeMap::new();
    let mut direct = BTreeMap::new();
    for spec in specs() {
        // Every id in 0..distinct at least once, then random repeats.
        let mut ids: Vec<u64> = (0..spec.distinct).collect();
        while ids.len() < spec.total {
            ids.push(rng.random_range(0..spec.distinct));
        }
        ids.shuffle(&mut rng);
        let xs: Vec<f64> = (0..spec.total).map(|_| (spec.dist)(&mut rng)).collect();
        let mut part_ids = vec![Vec::new(); spec.partitions];
        let mut part_xs = vec![Vec::new(); spec.partitions];
        for (id, x) in ids.iter().zip(&xs) {
            let targets: Vec<usize> = if spec.replicate {
                (0..spec.partitions).collect()
            } else {
                vec![rng.random_range(0..spec.partitions)]
            };
            for p in targets {
                part_ids[p].push(*id);
                part_xs[p].push(*x);
                raw_g.push(spec.name.to_string());
                raw_x.push(*x);
            }
        }
        let hll_values = |ids: &[u64]| -> ArrayRef {
            if spec.strings {
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| format!("user-{i}")),
                ))
            } else {
                Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| *i as i64)))
            }
        };
        let (mut all_h, mut all_q) = (HyperLogLog::new(), QuantileSketch::new());
        for p in 0..spec.partitions {
            let ids = hll_values(&part_ids[p]);
            let xs = Float64Array::from(part_xs[p].clone());
            let mut h = HyperLogLog::new();
            h.add_array(ids.as_ref()).unwrap();
            let mut q = QuantileSketch::new();
            assert_eq!(q.add_array(&xs).unwrap(), 0);
            all_h.add_array(ids.as_ref()).unwrap();
            all_q.add_array(&xs).unwrap();
            // Empty partitions are stored alternately as NULL and as an empty list.
            let (h, q) = if part_ids[p].is_empty() && p % 2 == 0 {
                (None, None)
            } else {
                (Some(h), Some(q))
            };
            rows.push((spec.name.to_string(), h, q));
        }
        let mut sorted = xs.clone();
        if spec.replicate {
            sorted = sorted
                .iter()
                .flat_map(|x| std::iter::repeat_n(*x, spec.partitions))
                .collect();
        }
        sorted.sort_by(f64::total_cmp);
        let distinct = ids.iter().collect::<HashSet<_>>().len() as u64;
        assert_eq!(distinct, spec.distinct);
        truth.insert(spec.name.to_string(), (distinct, sorted));
        direct.insert(spec.name.to_string(), (all_h, all_q));
    }
    // A synthetic group: random registers of every rank (real data reaches ranks > 25, the
    // `zlo` part of Z, only with ~2^25 values per register) and random buckets over the whole
    // key range (both signs, zero) with large counts.
    let (mut all_h, mut all_q) = (HyperLogLog::new(), QuantileSketch::new());
    for _ in 0..3 {
        let h = HyperLogLog::from_registers(
            (0..12_000).map(|_| (rng.random_range(0..16384), rng.random_range(1..=51))),
        )
        .unwrap();
        let q = QuantileSketch::from_buckets((0..3000).map(|_| {
            let k =
                quantile::KEY_OFFSET + rng.random_range(quantile::MIN_INDEX..=quantile::MAX_INDEX);
            let k = match rng.random_range(0..5) {
                0 => 0,
                1 | 2 => -k,
                _ => k,
            };
            (k, rng.random_range(1..1_000_000_000))
        }))
        .unwrap();
        all_h.merge(&h);
        all_q.merge(&q);
        rows.push(("z_synthetic".to_string(), Some(h), Some(q)));
    }
    assert!(all_h.z_parts().2 > 0);
    direct.insert("z_synthetic".to_string(), (all_h, all_q));
    // Many small synthetic groups, to compare SQL and Rust on many different register counts
    // (1 to m, on both sides of the linear-counting switch) and bucket sets.
    for j in 0..150 {
        let name = format!("zz_{j:03}");
        let registers = (2f64.powf(rng.random_range(0.0..14.5)) as usize).max(1);
        let max_rank = if j % 3 == 0 { 51 } else { 12 };
        let (mut all_h, mut all_q) = (HyperLogLog::new(), QuantileSketch::new());
        for _ in 0..2 {
            let h = HyperLogLog::from_registers(
                (0..registers)
                    .map(|_| (rng.random_range(0..16384), rng.random_range(1..=max_rank))),
            )
            .unwrap();
            let q = QuantileSketch::from_buckets((0..rng.random_range(1..50)).map(|_| {
                let k = quantile::KEY_OFFSET + rng.random_range(-3000..3000);
                (
                    if rng.random::<bool>() { k } else { -k },
                    rng.random_range(1..100),
                )
            }))
            .unwrap();
            all_h.merge(&h);
            all_q.merge(&q);
            rows.push((name.clone(), Some(h), Some(q)));
        }
        direct.insert(name, (all_h, all_q));
    }
    rows.shuffle(&mut rng);

    let g = StringArray::from_iter_values(rows.iter().map(|r| r.0.clone()));
    let h = hll::to_list_array(rows.iter().map(|r| r.1.as_ref())).unwrap();
    let q = quantile::to_list_array(rows.iter().map(|r| r.2.as_ref())).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, false),
        Field::new("hll", hll::data_type(), true),
        Field::new("qs", quantile::data_type(), true),
    ]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(g), Arc::new(h), Arc::new(q)]).unwrap();
    write_parquet(&dir.join("partials/partials.parquet"), &batch);

    let raw_schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let raw = RecordBatch::try_new(
        raw_schema,
        vec![
            Arc::new(StringArray::from(raw_g)),
            Arc::new(Float64Array::from(raw_x)),
        ],
    )
    .unwrap();
    write_parquet(&dir.join("raw/raw.parquet"), &raw);
    Dataset { dir, truth, direct }
}

fn write_parquet(path: &Path, batch: &RecordBatch) {
    let file = File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

/// One answer row: distinct estimate, p50, p99.
type Answer = (u64, Option<f64>, Option<f64>);

/// The Rust answers, from the partial sketches read back from the Parquet file.
fn rust_answers(data: &Dataset) -> BTreeMap<String, Answer> {
    let file = File::open(data.dir.join("partials/partials.parquet")).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut merged: BTreeMap<String, (HyperLogLog, QuantileSketch)> = BTreeMap::new();
    for batch in reader {
        let batch = batch.unwrap();
        let g = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let h = batch
            .column(1)
            .as_any()
            .downcast_ref::<ListArray>()
            .unwrap();
        let q = batch
            .column(2)
            .as_any()
            .downcast_ref::<ListArray>()
            .unwrap();
        for row in 0..batch.num_rows() {
            let entry = merged.entry(g.value(row).to_string()).or_default();
            if let Some(s) = hll::from_list_array(h, row).unwrap() {
                entry.0.merge(&s);
            }
            if let Some(s) = quantile::from_list_array(q, row).unwrap() {
                entry.1.merge(&s);
            }
        }
    }
    // Merging the partial rows is exact: it gives the sketch of all the values.
    for (g, (h, q)) in &merged {
        let (dh, dq) = &data.direct[g];
        assert_eq!(h, dh, "HLL merge of {g} is not the sketch of the union");
        assert_eq!(
            q, dq,
            "quantile merge of {g} is not the sketch of the union"
        );
    }
    merged
        .into_iter()
        .map(|(g, (h, q))| (g, (h.estimate(), q.quantile(0.5), q.quantile(0.99))))
        .collect()
}

/// The SQL block of `SQL.md` whose first line is `-- test: <tag>`.
fn sql_block(tag: &str) -> String {
    let md = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("SQL.md")).unwrap();
    let marker = format!("-- test: {tag}\n");
    let start = md
        .find(&marker)
        .unwrap_or_else(|| panic!("no `{marker}` block in SQL.md"));
    let end = start + md[start..].find("```").unwrap();
    md[start..end].to_string()
}

fn parse_opt_f64(s: &str) -> Option<f64> {
    match s.trim() {
        "None" | "NULL" | "" => None,
        v => Some(
            v.trim_matches('"')
                .parse()
                .unwrap_or_else(|e| panic!("bad float {v:?}: {e}")),
        ),
    }
}

fn parse_answers(out: &str) -> BTreeMap<String, Answer> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 4, "bad row {l:?}");
            let g = f[0].trim_matches(|c| c == '\'' || c == '"').to_string();
            (
                g,
                (
                    f[1].parse().unwrap(),
                    parse_opt_f64(f[2]),
                    parse_opt_f64(f[3]),
                ),
            )
        })
        .collect()
}

/// The test services' Python (`FLOE_TEST_PYTHON`) with DuckDB importable.
fn python() -> PathBuf {
    let py = std::env::var_os("FLOE_TEST_PYTHON")
        .map(PathBuf::from)
        .expect("FLOE_TEST_PYTHON is not set: start tests/services/up or run tests/run");
    let ok = Command::new(&py)
        .args(["-c", "import duckdb"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{} cannot import duckdb", py.display());
    py
}

const DUCKDB_RUNNER: &str = r#"
import sys, duckdb
data, sql_file = sys.argv[1], sys.argv[2]
db = duckdb.connect()
db.execute(f"CREATE VIEW partials AS SELECT * FROM read_parquet('{data}/partials/*.parquet')")
db.execute(f"CREATE VIEW raw AS SELECT * FROM read_parquet('{data}/raw/*.parquet')")
sql = open(sql_file).read()
for row in db.execute(sql).fetchall():
    print("\t".join(repr(v) for v in row))
"#;

fn run_duckdb(py: &Path, dir: &Path, sql: &str, name: &str) -> String {
    let sql_file = dir.join(format!("{name}.sql"));
    std::fs::write(&sql_file, sql).unwrap();
    let out = Command::new(py)
        .arg("-c")
        .arg(DUCKDB_RUNNER)
        .arg(dir)
        .arg(&sql_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "duckdb failed on {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn assert_same(engine: &str, sql: &BTreeMap<String, Answer>, rust: &BTreeMap<String, Answer>) {
    assert_eq!(
        sql.keys().collect::<Vec<_>>(),
        rust.keys().collect::<Vec<_>>(),
        "{engine}: groups differ"
    );
    let (mut max_rel, mut identical, mut compared) = (0f64, 0, 0);
    for (g, (re, r50, r99)) in rust {
        let (se, s50, s99) = &sql[g];
        assert_eq!(se, re, "{engine}: distinct estimate of {g}");
        for (name, s, r) in [("p50", s50, r50), ("p99", s99, r99)] {
            match (s, r) {
                (None, None) => {}
                (Some(s), Some(r)) => {
                    let rel = if *r == 0.0 {
                        s.abs()
                    } else {
                        ((s - r) / r).abs()
                    };
                    assert!(rel <= 1e-9, "{engine}: {name} of {g}: sql {s} rust {r}");
                    max_rel = max_rel.max(rel);
                    compared += 1;
                    identical += usize::from(s.to_bits() == r.to_bits());
                }
                _ => panic!("{engine}: {name} of {g}: sql {s:?} rust {r:?}"),
            }
        }
        if !g.starts_with("zz_") {
            eprintln!("{engine} == rust  {g:11} distinct {se:>8}  p50 {s50:?}  p99 {s99:?}");
        }
    }
    let small = rust.values().filter(|a| a.0 <= 40_960).count();
    eprintln!(
        "{engine}: {} of {} distinct estimates identical to Rust ({small} of them <= 2.5 m)",
        rust.len(),
        rust.len()
    );
    eprintln!(
        "{engine}: {identical} of {compared} quantile values bit-identical to Rust, max relative difference {max_rel:e}"
    );
}

/// Element at 0-based position `floor(q * (n - 1))`: what the sketch approximates.
fn sketch_target(sorted: &[f64], q: f64) -> f64 {
    sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
}

/// DuckDB's `quantile_disc` position: `max(ceil(q * n), 1) - 1` (0-based).
fn quantile_disc_position(n: usize, q: f64) -> usize {
    ((q * n as f64).ceil() as usize).max(1) - 1
}

fn rel_err(est: f64, truth: f64) -> f64 {
    if truth.abs() < quantile::MIN_MAGNITUDE {
        est.abs()
    } else {
        ((est - truth) / truth).abs()
    }
}

#[test]
fn rust_answers_are_exact_merges_and_accurate() {
    let data = dataset();
    let rust = rust_answers(data);
    // The distinct count against the truth (cardinalities 1 to 1M).
    for (g, (distinct, _)) in &data.truth {
        let est = rust[g].0 as f64;
        let d = *distinct as f64;
        let err = (est - d).abs();
        eprintln!(
            "distinct {g:8} true {d:>8} est {est:>8} rel err {:.5} ({:.2} SE)",
            err / d.max(1.0),
            err / (d.max(1.0) * hll::STANDARD_ERROR)
        );
        assert!(
            err <= 4.0 * hll::STANDARD_ERROR * d,
            "{g}: estimate {est}, true {d}"
        );
        if d <= 10.0 {
            assert_eq!(est, d, "{g}: small counts must be exact");
        }
    }

    // The documented quantile guarantee: within alpha of the element at floor(q (N - 1)).
    for (g, (_, sorted)) in &data.truth {
        let (_, r50, r99) = rust[g];
        if sorted.is_empty() {
            assert!(r50.is_none() && r99.is_none());
            continue;
        }
        for (q, est) in [(0.5, r50.unwrap()), (0.99, r99.unwrap())] {
            let target = sketch_target(sorted, q);
            let e = rel_err(est, target);
            assert!(
                e <= quantile::RELATIVE_ACCURACY + 1e-12,
                "{g} q={q}: est {est} target {target}"
            );
        }
    }
}

#[test]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
fn duckdb_matches_rust_and_is_accurate() {
    let py = python();
    let data = dataset();
    let rust = rust_answers(data);

    for tag in ["duckdb", "duckdb-macros"] {
        let out = run_duckdb(&py, &data.dir, &sql_block(tag), tag);
        assert_same(tag, &parse_answers(&out), &rust);
    }

    // Accuracy of the quantiles against DuckDB's quantile_disc over the raw values.
    let raw_sql = "SELECT g, count(*), quantile_disc(x, 0.5), quantile_disc(x, 0.99) FROM raw GROUP BY g ORDER BY g";
    let out = run_duckdb(&py, &data.dir, raw_sql, "raw");
    let disc = parse_answers(&out);
    for (g, (_, sorted)) in &data.truth {
        let (_, r50, r99) = rust[g];
        if sorted.is_empty() {
            assert!(r50.is_none() && r99.is_none() && !disc.contains_key(g));
            continue;
        }
        let (n, d50, d99) = disc[g];
        assert_eq!(n as usize, sorted.len());
        for (q, est, d) in [
            (0.5, r50.unwrap(), d50.unwrap()),
            (0.99, r99.unwrap(), d99.unwrap()),
        ] {
            // DuckDB's definition of quantile_disc, checked on the raw values.
            assert_eq!(
                d,
                sorted[quantile_disc_position(sorted.len(), q)],
                "{g}: quantile_disc({q})"
            );
            // The documented guarantee: within alpha of the element at floor(q (N - 1)).
            let target = sketch_target(sorted, q);
            let e_target = rel_err(est, target);
            assert!(
                e_target <= quantile::RELATIVE_ACCURACY + 1e-12,
                "{g} q={q}: est {est} target {target}"
            );
            let same_position = quantile_disc_position(sorted.len(), q)
                == (q * (sorted.len() - 1) as f64).floor() as usize;
            let e_disc = rel_err(est, d);
            eprintln!(
                "quantile {g:8} q={q:<4} est {est:<24e} quantile_disc {d:<24e} rel err {e_disc:.5} (vs floor(q(N-1)) element: {e_target:.5}){}",
                if same_position {
                    ""
                } else {
                    "  [positions differ]"
                }
            );
            if same_position {
                assert!(
                    e_disc <= quantile::RELATIVE_ACCURACY + 1e-12,
                    "{g} q={q}: est {est} quantile_disc {d}"
                );
            }
        }
    }
}
