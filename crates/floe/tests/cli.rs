//! The `floe` command as a user runs it: `validate` and `run` refuse bad job files with
//! `file:line:col` and exit code 2; the example jobs validate; `quickstart` lands generated
//! data that DuckDB reads back (when `FLOE_TEST_PYTHON` is set).

use std::path::Path;
use std::process::Command;

fn floe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("floe-{tag}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn example_jobs_validate() {
    let jobs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../jobs");
    let out = floe(&[
        "validate",
        jobs.join("otlp.toml").to_str().unwrap(),
        jobs.join("quickstart.toml").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_job_files_are_refused_with_their_place() {
    let dir = temp_dir("cli");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "version = 1\nname = \"x\"\n[source.kafka]\nstart = \"yesterday\"\n[catalog]\nuri = \"ftp://x\"\n\
         [checkpoint]\ninterval = \"soon\"\n[tables.spanz]\n[tables.spans]\npartition = [\"day(nope)\"]\n",
    )
    .unwrap();
    let path = bad.to_str().unwrap();
    for command in ["validate", "run"] {
        let out = floe(&[command, path]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for expected in [
            format!("{path}:4:9: start must be"),
            format!("{path}:6:7: the catalog uri must start with http"),
            format!("{path}:8:12: \"soon\" is not a duration"),
            format!("{path}:9:9: no table \"spanz\""),
            format!("{path}:11:14: table spans has no column \"nope\""),
        ] {
            assert!(
                stderr.contains(&expected),
                "{command}: missing {expected:?} in\n{stderr}"
            );
        }
    }
    let syntax = dir.join("syntax.toml");
    std::fs::write(&syntax, "version = 1\nname = \n").unwrap();
    let out = floe(&["validate", syntax.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{}:2:", syntax.display())));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quickstart_lands_data_duckdb_reads() {
    let dir = temp_dir("quickstart");
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args([
            "quickstart",
            "--duration",
            "4s",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("iceberg_scan('"),
        "prints DuckDB queries:\n{stdout}"
    );
    let Ok(python) = std::env::var("FLOE_TEST_PYTHON") else {
        assert!(std::env::var("FLOE_REQUIRE_SERVICES").as_deref() != Ok("1"));
        return;
    };
    // Run the printed span query as a user would paste it.
    let query = stdout
        .split("\n\n")
        .find(|block| block.contains("iceberg_scan") && block.contains("otel_spans"))
        .unwrap()
        .trim()
        .trim_end_matches(';')
        .to_string();
    let helpers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/services/python");
    let out = Command::new(python)
        .args([
            "-c",
            &format!(
                "import duckdb_offline\ncon = duckdb_offline.connect()\nrows = con.sql('''{query}''').fetchall()\n\
                 assert len(rows) == 5, rows\nassert all(r[1] > 0 for r in rows), rows\nprint(rows)"
            ),
        ])
        .env("PYTHONPATH", helpers)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
