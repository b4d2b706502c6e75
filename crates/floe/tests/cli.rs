//! The `floe` command as a user runs it: `validate` and `run` refuse bad job files with
//! `file:line:col` and exit code 2; the example jobs validate; `quickstart` lands generated
//! data that DuckDB reads back (when `FLOE_TEST_PYTHON` is set); a table created earlier with
//! fewer columns gains the format's columns by schema evolution; a job stopped with SIGTERM
//! while it still starts exits 0.

use std::path::Path;
use std::process::Command;

mod support;
use support::temp_dir;

fn floe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn example_jobs_validate() {
    let jobs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../jobs");
    let out = floe(&[
        "validate",
        jobs.join("otlp.toml").to_str().unwrap(),
        jobs.join("quickstart.toml").to_str().unwrap(),
        jobs.join("postgres-cdc.toml").to_str().unwrap(),
        jobs.join("debezium.toml").to_str().unwrap(),
        jobs.join("otlp-rollups.toml").to_str().unwrap(),
        jobs.join("otlp-red.toml").to_str().unwrap(),
        jobs.join("otlp-tail-sampling.toml").to_str().unwrap(),
        jobs.join("otlp-pii.toml").to_str().unwrap(),
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
         [checkpoint]\ninterval = \"soon\"\n[tables.spanz]\n[tables.spans]\npartition = [\"day(nope)\"]\n\
         [tables.logs]\nland = false\n\
         [sinks.a]\nkind = \"kafka\"\nstream = \"logs\"\nurl = \"http://x\"\n\
         [sinks.b]\nkind = \"prometheus\"\nstream = \"spans\"\nurl = \"ftp://y\"\n\
         [sinks.c]\nkind = \"smtp\"\nstream = \"spans\"\n",
    )
    .unwrap();
    let path = bad.to_str().unwrap();
    for command in ["validate", "run"] {
        let out = floe(&[command, path]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for expected in [
            format!("{path}:4:9: start is one of \"earliest\", \"latest\""),
            format!("{path}:6:7: the catalog uri must start with http"),
            format!("{path}:8:12: \"soon\" is not a duration"),
            format!("{path}:9:9: no stream \"spanz\""),
            format!("{path}:11:14: table spans has no column \"nope\""),
            format!("{path}:16:10: sink a: stream \"logs\" does not land in a table"),
            format!("{path}:17:7: sink a: `url` is not a setting of a kafka sink"),
            format!("{path}:21:7: the remote-write url must start with http"),
            "sink b: `values` names the numeric columns to send".to_string(),
            format!("{path}:23:8: a sink's `kind` is one of \"kafka\", \"prometheus\""),
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
fn bad_redaction_is_refused_with_its_place() {
    let dir = temp_dir("cli-pii");
    let bad = dir.join("pii.toml");
    std::fs::write(
        &bad,
        "version = 1\nname = \"x\"\n[source.kafka]\n[source.redaction]\n\
         detectors = [\"email\", \"passport\"]\naction = \"shred\"\n\
         actions = { card = \"hash\", visa = \"mask\" }\n\
         [[source.redaction.patterns]]\nname = \"email\"\nregex = \"(\"\n\
         [catalog]\nuri = \"http://x\"\n",
    )
    .unwrap();
    let path = bad.to_str().unwrap();
    let out = floe(&["validate", path]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        format!("{path}:5:23: a detector is one of private_key, jwt,"),
        format!("{path}:6:10: an action is \"mask\", \"hash\""),
        format!("{path}:7:35: \"visa\" is no detector"),
        format!("{path}:9:8: a pattern's name is its own"),
        format!("{path}:10:9: pattern email: regex parse error"),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in\n{stderr}"
        );
    }
    // Valid, but hashing without its key: `validate` passes, `run` refuses to start.
    let hashing = dir.join("hash.toml");
    std::fs::write(
        &hashing,
        "version = 1\nname = \"x\"\n[source.kafka]\n[source.redaction]\n\
         hash_key_env = \"FLOE_TEST_NO_SUCH_KEY\"\nactions = { email = \"hash\" }\n\
         [catalog]\nuri = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let out = floe(&["validate", hashing.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = floe(&["run", hashing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("environment variable FLOE_TEST_NO_SUCH_KEY"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_cdc_job_files_are_refused_with_their_place() {
    let dir = temp_dir("cli-cdc");
    let pg = dir.join("pg.toml");
    std::fs::write(
        &pg,
        "version = 1\nname = \"x\"\n[source.postgres]\nport = 70000\nssl_mode = \"maybe\"\n\
         slot = \"Bad-Slot\"\nsnapshot_parallelism = 0\nsnapshot_chunk_rows = 0\n\
         snapshot_chunk_delay = \"soon\"\n[catalog]\nuri = \"http://x\"\n\
         [tables.orders]\n",
    )
    .unwrap();
    let dbz = dir.join("dbz.toml");
    std::fs::write(
        &dbz,
        "version = 1\nname = \"x\"\n[source.kafka]\nformat = \"debezium-json\"\n\
         [catalog]\nuri = \"http://x\"\n",
    )
    .unwrap();
    let out = floe(&["validate", pg.to_str().unwrap(), dbz.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        format!("{}:4:8: a port is 1 to 65535", pg.display()),
        format!("{}:5:12: ssl_mode is one of", pg.display()),
        format!("{}:6:8: a replication slot name is", pg.display()),
        format!("{}:7:24: snapshot_parallelism is 1 to 64", pg.display()),
        format!(
            "{}:8:23: snapshot_chunk_rows is 1 to 10000000",
            pg.display()
        ),
        format!("{}:9:24: ", pg.display()),
        format!("{}:12:9: a CDC table is named `schema.table`", pg.display()),
        format!(
            "{}:4:10: format \"debezium-json\" needs `topics`",
            dbz.display()
        ),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A replica stopped right after it was started (a rolling restart, a scale-down) must stop
/// cleanly, not die of the signal's default action while it is still connecting: SIGTERM
/// once the process speaks (its first line, before the catalog and the tables), and a little
/// later.
#[test]
fn a_job_stopped_while_it_starts_exits_cleanly() {
    use std::io::BufRead;
    for delay_ms in [0, 30, 150] {
        let dir = temp_dir("early-stop");
        let mut child = Command::new(env!("CARGO_BIN_EXE_floe"))
            .args([
                "quickstart",
                "--duration",
                "60s",
                "--dir",
                dir.to_str().unwrap(),
            ])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        stderr.read_line(&mut first).unwrap();
        assert!(first.contains("floe quickstart"), "{first}");
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "SIGTERM {delay_ms} ms after its first line: {status:?}\n{rest}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn quickstart_lands_data_duckdb_reads() {
    let dir = temp_dir("quickstart");
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["quickstart", "--dir", dir.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Logs into a pipe or a file carry no colour escapes (only a terminal gets colours).
    assert!(stderr.contains("checkpoint committed"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "escape codes in piped logs:\n{stderr}"
    );
    assert!(
        stdout.contains("iceberg_scan('"),
        "prints DuckDB queries:\n{stdout}"
    );
    // The default 30 s make an hour of event time: the SLOs have a status, and the bad
    // payments deploy ten minutes in is judged ten minutes later, by both metrics.
    assert!(stdout.contains("SLOs, at their newest minute"), "{stdout}");
    assert!(stdout.contains("frontend-availability"), "{stdout}");
    let verdicts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("payments 1.0.0 → 1.1.0"))
        .collect();
    assert_eq!(verdicts.len(), 2, "{stdout}");
    assert!(
        verdicts.iter().all(|l| l.ends_with("REGRESSION")),
        "{verdicts:?}"
    );
    // The verdicts raise alerts, and inventory failing 40 minutes in raises an anomaly alert
    // that names it as its own first root-cause candidate.
    assert!(stdout.contains("Alerts (otel_alerts):"), "{stdout}");
    let firing = |what: &str| {
        stdout
            .lines()
            .any(|l| l.contains("FIRING") && l.contains(what))
    };
    assert!(
        firing(
            "deploy-regression on payments (service_name=payments,new_version=1.1.0,metric=latency_p99)"
        ),
        "{stdout}"
    );
    assert!(
        firing("anomaly on inventory (service_name=inventory,measure=error_rate) firing"),
        "{stdout}"
    );
    // Inventory's connection pool filling up from 5 minutes in is forecast to cross 90 %
    // before it does, and raises a saturation alert.
    assert!(
        stdout.contains("Saturation forecasts (otel_forecasts)")
            && stdout.contains("inventory usage: "),
        "{stdout}"
    );
    assert!(
        firing("saturation on inventory (service_name=inventory,measure=usage) firing"),
        "{stdout}"
    );
    // With context: inventory's most frequent error message and a failed trace to open.
    let inventory = stdout
        .lines()
        .find(|l| l.contains("FIRING") && l.contains("anomaly on inventory"))
        .unwrap();
    assert!(
        inventory.contains("; top error: \"") && inventory.contains("failed: upstream timed out"),
        "{inventory}"
    );
    let trace = inventory
        .split("; failed trace ")
        .nth(1)
        .unwrap_or_default();
    assert!(
        trace.len() >= 32 && trace[..32].chars().all(|c| c.is_ascii_hexdigit()),
        "{inventory}"
    );
    // Its callers' error-rate alerts during the incident rank it first too.
    let minute = |l: &str| -> i64 {
        let (h, m) = l.trim_start()[..5].split_once(':').unwrap();
        h.parse::<i64>().unwrap() * 60 + m.parse::<i64>().unwrap()
    };
    let errors: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("FIRING") && l.contains("measure=error_rate"))
        .collect();
    let start = errors
        .iter()
        .find(|l| l.contains("anomaly on inventory"))
        .map(|l| minute(l))
        .unwrap();
    assert!(
        errors
            .iter()
            .filter(|l| (minute(l) - start).rem_euclid(24 * 60) < 8)
            .all(|l| l.contains("root-cause candidates: inventory (")),
        "error-rate alerts during the incident rank inventory first:\n{stdout}"
    );
    if support::optional_service("FLOE_TEST_PYTHON").is_none() {
        return;
    }
    // Run the printed span query as a user would paste it.
    let query = stdout
        .split("\n\n")
        .find(|block| block.contains("iceberg_scan") && block.contains("otel_spans"))
        .unwrap()
        .trim()
        .trim_end_matches(';')
        .to_string();
    support::python(&format!(
        "import duckdb_offline\ncon = duckdb_offline.connect()\nrows = con.sql('''{query}''').fetchall()\n\
         assert len(rows) == 5, rows\nassert all(r[1] > 0 for r in rows), rows\nprint(rows)"
    ));
    // And the printed deploy query finds what the quickstart said.
    let query = stdout
        .split("\n\n")
        .find(|block| block.contains("otel_deploy_regressions-"))
        .unwrap()
        .trim()
        .trim_end_matches(';')
        .to_string();
    support::python(&format!(
        "import duckdb_offline\ncon = duckdb_offline.connect()\nrows = con.sql('''{query}''').fetchall()\n\
         assert [(r[1], r[2], r[3], r[4], r[8]) for r in rows] == [\
         ('payments', '1.0.0', '1.1.0', 'error_rate', 'regression'), \
         ('payments', '1.0.0', '1.1.0', 'latency_p99', 'regression')], rows\nprint(rows)"
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_table_gains_the_new_columns() {
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    let dir = temp_dir("evolve");
    let (catalog, client) = support::start_catalog(&dir).await;
    // An older otel_logs with three of the columns (and one of its own).
    client.ensure_namespace(&["otel"]).await.unwrap();
    let ident = iceberg::TableIdent::from_strs(["otel", "otel_logs"]).unwrap();
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(2, "body", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "severity_text", Type::Primitive(PrimitiveType::String))
                .into(),
            NestedField::optional(4, "note", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    client
        .create_table(
            &ident,
            &iceberg_catalog_rest::CreateTableRequest {
                name: "otel_logs".into(),
                location: None,
                schema,
                partition_spec: None,
                write_order: None,
                stage_create: None,
                properties: [("format-version".to_string(), "2".to_string())].into(),
            },
        )
        .await
        .unwrap();
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        format!(
            "version = 1\nname = \"evolve\"\n[source.generator]\nrequests_per_second = 200\nduration = \"2s\"\n\
             [catalog]\nuri = \"{}\"\nnamespace = \"otel\"\n[checkpoint]\ninterval = \"1s\"\nstate_dir = \"{}\"\n",
            catalog.uri(),
            dir.join("state").display()
        ),
    )
    .unwrap();
    let out = floe(&["run", job.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = client.load_table(&ident).await.unwrap();
    let schema = table.metadata.current_schema();
    for column in [
        "ts",
        "body",
        "note",
        "service_version",
        "team",
        "log_attributes",
        "trace_id",
        "kafka_offset",
    ] {
        assert!(
            schema.field_by_name(column).is_some(),
            "{column} in {schema:?}"
        );
    }
    let added: u64 = table
        .metadata
        .snapshots()
        .filter_map(|s| s.summary().additional_properties.get("added-records"))
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert!(added > 0, "rows landed in the evolved table");
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
