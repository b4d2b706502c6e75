//! `floe validate` shows the pipeline a job file declares: each stream, where it lands, and
//! the operators that read it, as a tree.
//!
//! ```text
//! spans → table otel_spans
//!   └─ rollup_1m: window tumbling 1m by service_name on ts: spans, p99 (…)
//!        ├─ span_rollup_1m → table span_rollup_1m
//!        └─ span_rollup_1m_late → table span_rollup_1m_late
//! ```

use floe_runtime::JobConfig;
use floe_runtime::job::Streams;

/// The tree of `config`'s streams (`streams`: what the source is known to produce).
pub(crate) fn describe(config: &JobConfig, streams: &Streams) -> String {
    let mut out = String::new();
    let roots: Vec<(String, String)> = match streams {
        Streams::Known(known) => known
            .iter()
            .map(|s| (s.name.clone(), s.table.clone()))
            .collect(),
        Streams::Tables => {
            out.push_str("change streams: one per source table (schema.table), known at start\n");
            let mut inputs: Vec<(String, String)> = config
                .pipeline
                .operators
                .iter()
                .filter(|o| {
                    !config
                        .pipeline
                        .operators
                        .iter()
                        .any(|p| p.outputs.contains(&o.input))
                })
                .map(|o| (o.input.clone(), o.input.replace('.', "_")))
                .collect();
            inputs.dedup();
            inputs
        }
    };
    for (stream, table) in roots {
        stream_line(config, &stream, &table, "", &mut out);
    }
    if config.pipeline.operators.iter().any(|o| o.stateful()) {
        out.push_str(&format!(
            "state: table {} (operators {})\n",
            config.state_table,
            config
                .pipeline
                .operators
                .iter()
                .filter(|o| o.stateful())
                .map(|o| o.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}

fn landing(config: &JobConfig, stream: &str, default: &str) -> String {
    if !config.lands(stream) {
        return "not landed".to_string();
    }
    let name = config
        .table(stream)
        .and_then(|t| t.name.clone())
        .unwrap_or_else(|| default.to_string());
    format!("table {name}")
}

fn stream_line(config: &JobConfig, stream: &str, table: &str, indent: &str, out: &mut String) {
    out.push_str(&format!("{stream} → {}\n", landing(config, stream, table)));
    let readers: Vec<_> = config
        .pipeline
        .operators
        .iter()
        .filter(|o| o.inputs.iter().any(|i| i == stream))
        .collect();
    for (i, op) in readers.iter().enumerate() {
        let last = i + 1 == readers.len();
        out.push_str(&format!(
            "{indent}  {}─ {}: {}\n",
            if last { "└" } else { "├" },
            op.id,
            op.describe()
        ));
        if op.input != stream {
            // A union's outputs are drawn once, under its first input.
            continue;
        }
        let child = format!("{indent}  {}  ", if last { " " } else { "│" });
        for (j, output) in op.outputs.iter().enumerate() {
            let last_output = j + 1 == op.outputs.len();
            out.push_str(&format!(
                "{child}   {}─ ",
                if last_output { "└" } else { "├" }
            ));
            stream_line(
                config,
                output,
                output,
                &format!("{child}   {}", if last_output { " " } else { "│" }),
                out,
            );
        }
    }
}
