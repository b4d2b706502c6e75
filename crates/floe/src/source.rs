//! The sources `floe` knows: the `[source]` section of a job file, each kind checked by its
//! adapter crate, and the reader each becomes.
//!
//! Adding a source is one kind here: its raw section (from its crate), the streams it is
//! known to produce, and how its reader is built.

use std::collections::HashMap;

use floe_cdc::debezium::DebeziumFormat;
use floe_cdc::postgres::{PostgresConfig, RawPostgres};
use floe_config::{Checker, Text};
use floe_kafka::KafkaSettings;
use floe_kafka::config::RawKafka;
use floe_otlp::Signal;
use floe_otlp::config::{GeneratorConfig, RawGenerator, check_signals};
use floe_otlp::redact::{RawRedaction, Redaction, check_redaction};
use floe_runtime::job::{SourceSection, Streams};
use serde::Deserialize;

/// `[source]`: exactly one of its kinds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSource {
    /// Kafka topics (`floe_kafka::config`).
    kafka: Option<RawKafka>,
    /// A Postgres publication through logical replication (`floe_cdc::postgres`).
    postgres: Option<RawPostgres>,
    /// Generated OpenTelemetry data (`floe_otlp::config`).
    generator: Option<RawGenerator>,
    /// Redaction of the OTLP tables' strings (`floe_otlp::redact`).
    redaction: Option<floe_config::Spanned<RawRedaction>>,
}

/// What Kafka records hold.
#[derive(Debug, Clone)]
pub(crate) enum KafkaFormat {
    /// OpenTelemetry (protobuf or JSON).
    Otlp {
        /// Topic → signal overrides.
        signals: HashMap<String, Signal>,
        /// The resource attribute of the `team` column.
        team_attribute: String,
        /// `[source.redaction]`.
        redaction: Option<Box<Redaction>>,
    },
    /// Debezium change events (JSON).
    DebeziumJson,
}

/// A checked source.
#[derive(Debug, Clone)]
pub(crate) enum SourceConfig {
    /// Kafka topics in a format.
    Kafka(KafkaSettings, KafkaFormat),
    /// Postgres logical replication.
    Postgres(PostgresConfig),
    /// The built-in generator, and `[source.redaction]`.
    Generator(GeneratorConfig, Option<Box<Redaction>>),
}

impl SourceConfig {
    /// Its `[source.redaction]`, if any.
    pub(crate) fn redaction(&self) -> Option<&Redaction> {
        match self {
            SourceConfig::Kafka(_, KafkaFormat::Otlp { redaction, .. })
            | SourceConfig::Generator(_, redaction) => redaction.as_deref(),
            _ => None,
        }
    }
}

fn kafka_format(
    raw: &RawKafka,
    redaction: Option<Box<Redaction>>,
    c: &mut Checker<'_>,
) -> KafkaFormat {
    let debezium = c.choice(
        raw.format.as_ref(),
        "format",
        &[("otlp", false), ("debezium-json", true)],
        false,
    );
    let team_attribute = raw.team_attribute.as_ref().map(|t| (t.span(), c.text(t)));
    if !debezium {
        let team_attribute = match team_attribute {
            Some((at, name)) if name.trim().is_empty() => {
                c.problem(
                    Some(at),
                    "team_attribute names a resource attribute (default \"team\")",
                );
                name
            }
            Some((_, name)) => name,
            None => floe_otlp::DEFAULT_TEAM_ATTRIBUTE.to_string(),
        };
        return KafkaFormat::Otlp {
            signals: check_signals(&raw.signals, c),
            team_attribute,
            redaction,
        };
    }
    if let Some((at, _)) = team_attribute {
        c.problem(
            Some(at),
            "team_attribute is a setting of format \"otlp\" (the OTLP tables' team column)",
        );
    }
    if raw.topics.is_none() {
        let at = raw.format.as_ref().map(Text::span);
        c.problem(
            at,
            "format \"debezium-json\" needs `topics`: Debezium's per-table topics \
             (<prefix>.<schema>.<table>)",
        );
    }
    KafkaFormat::DebeziumJson
}

impl SourceSection for RawSource {
    type Config = SourceConfig;

    fn check(&self, c: &mut Checker<'_>, job: &str) -> Option<SourceConfig> {
        let redaction = self
            .redaction
            .as_ref()
            .map(|r| (r.span(), Box::new(check_redaction(r.get_ref(), c))));
        let not_otlp = |c: &mut Checker<'_>, redaction: Option<(std::ops::Range<usize>, _)>| {
            if let Some((at, _)) = redaction {
                c.problem(
                    Some(at),
                    "[source.redaction] redacts the OTLP tables: a Kafka source of format \
                     \"otlp\" or the generator",
                );
            }
        };
        match (&self.kafka, &self.postgres, &self.generator) {
            (Some(k), None, None) => {
                let debezium = matches!(
                    k.format.as_ref().map(|f| f.get_ref().as_str()),
                    Some("debezium-json")
                );
                if debezium {
                    not_otlp(c, redaction.clone());
                }
                let format = kafka_format(k, redaction.map(|(_, r)| r), c);
                Some(SourceConfig::Kafka(k.check(c, job), format))
            }
            (None, Some(p), None) => {
                not_otlp(c, redaction);
                Some(SourceConfig::Postgres(p.check(c, job)))
            }
            (None, None, Some(g)) => Some(SourceConfig::Generator(
                g.check(c),
                redaction.map(|(_, r)| r),
            )),
            _ => {
                c.problem(
                    None,
                    "give exactly one of [source.kafka], [source.postgres] and [source.generator]",
                );
                None
            }
        }
    }

    fn streams(config: &SourceConfig) -> Streams {
        match config {
            SourceConfig::Kafka(_, KafkaFormat::Otlp { redaction, .. }) => {
                Streams::Known(floe_otlp::format::streams(false, redaction.is_some()))
            }
            SourceConfig::Generator(_, redaction) => {
                Streams::Known(floe_otlp::format::streams(true, redaction.is_some()))
            }
            SourceConfig::Kafka(_, KafkaFormat::DebeziumJson) | SourceConfig::Postgres(_) => {
                Streams::Tables
            }
        }
    }

    fn carries_exchanges(config: &SourceConfig) -> bool {
        matches!(config, SourceConfig::Kafka(_, KafkaFormat::Otlp { .. }))
    }
}

/// The Iceberg table names a job file gives change streams (`schema.table` → name).
pub(crate) fn table_names(job: &floe_runtime::JobConfig) -> HashMap<String, String> {
    job.tables
        .iter()
        .filter_map(|t| Some((t.key.clone(), t.name.clone()?)))
        .collect()
}

/// Debezium's format for a job.
pub(crate) fn debezium(job: &floe_runtime::JobConfig) -> DebeziumFormat {
    DebeziumFormat::new(table_names(job))
}

#[cfg(test)]
mod tests {
    use super::RawSource;
    use floe_runtime::JobConfig;

    const HEAD: &str = "version = 1\nname = \"x\"\n[catalog]\nuri = \"http://127.0.0.1:1\"\n";

    fn problems(source: &str, exchange: &str) -> String {
        let text = format!(
            "{HEAD}{source}\n[[operators]]\nid = \"by_service\"\nkind = \"exchange\"\ninput = \"spans\"\n{exchange}"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    const KAFKA: &str = "[source.kafka]\ntopics = [\"otlp_spans\"]";

    #[test]
    fn an_exchange_is_checked_with_its_place() {
        assert_eq!(problems(KAFKA, "key = [\"service_name\"]\n"), "");
        let no_key = problems(KAFKA, "");
        assert!(
            no_key.contains(":9:8") && no_key.contains("needs `key`"),
            "{no_key}"
        );
        let bad_key = problems(KAFKA, "key = [\"nope\"]\n");
        assert!(bad_key.contains("no key column nope"), "{bad_key}");
        let zero = problems(KAFKA, "key = [\"service_name\"]\npartitions = 0\n");
        assert!(zero.contains("between 1 and 10000"), "{zero}");
        let generator = problems(
            "[source.generator]\nrequests_per_second = 10",
            "key = [\"service_name\"]\n",
        );
        assert!(generator.contains("needs [source.kafka]"), "{generator}");
    }

    #[test]
    fn the_team_attribute_is_checked_with_its_place() {
        let named =
            "[source.kafka]\ntopics = [\"otlp_spans\"]\nteam_attribute = \"k8s.namespace.name\"";
        assert_eq!(problems(named, "key = [\"service_name\"]\n"), "");
        let empty = problems(
            "[source.kafka]\ntopics = [\"otlp_spans\"]\nteam_attribute = \" \"",
            "key = [\"service_name\"]\n",
        );
        assert!(
            empty.contains(":7:18") && empty.contains("names a resource attribute"),
            "{empty}"
        );
        let debezium = problems(
            "[source.kafka]\ntopics = [\"db.public.t\"]\nformat = \"debezium-json\"\nteam_attribute = \"team\"",
            "key = [\"service_name\"]\n",
        );
        assert!(
            debezium.contains(":8:18") && debezium.contains("a setting of format \"otlp\""),
            "{debezium}"
        );
    }

    /// A job with a select, an exchange by service and an slo operator, then `slos`.
    fn slo_problems(slos: &str) -> String {
        let text = format!(
            "{HEAD}{KAFKA}\n\
             [[operators]]\nid = \"requests\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"service_name\", \"span_name\", \"duration_ns\", \
             \"CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error\", \"kafka_offset\", \"kafka_item\"]\n\
             [[operators]]\nid = \"by_service\"\nkind = \"exchange\"\ninput = \"requests\"\nkey = [\"service_name\"]\n\
             [[operators]]\nid = \"slo\"\nkind = \"slo\"\ninput = \"by_service\"\n{slos}"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn slos_are_checked_with_their_place() {
        let good = "[[slos]]\nname = \"a\"\nservice = \"checkout\"\nobjective = \"availability\"\ntarget = 99.9\n\
                    [[slos]]\nname = \"l\"\nservice = \"checkout\"\nendpoint = \"GET /\"\nobjective = \"latency\"\nthreshold = \"300ms\"\ntarget = 99\nperiod = \"7d\"\n";
        assert_eq!(slo_problems(good), "");
        let none = slo_problems("");
        assert!(none.contains("no [[slos]] for it"), "{none}");
        let target = slo_problems(
            "[[slos]]\nname = \"a\"\nservice = \"s\"\nobjective = \"availability\"\ntarget = 100\n",
        );
        assert!(
            target.contains(":25:10") && target.contains("below 100"),
            "{target}"
        );
        let latency = slo_problems(
            "[[slos]]\nname = \"l\"\nservice = \"s\"\nobjective = \"latency\"\ntarget = 99\n",
        );
        assert!(latency.contains("give its `threshold`"), "{latency}");
        let kind = slo_problems(
            "[[slos]]\nname = \"k\"\nservice = \"s\"\nobjective = \"speed\"\ntarget = 99\n",
        );
        assert!(
            kind.contains(":24:13") && kind.contains("not Some(\"speed\")"),
            "{kind}"
        );
        let twice = slo_problems(&format!(
            "{good}{}",
            &good[..good.find("[[slos]]\nname = \"l\"").unwrap()]
        ));
        assert!(twice.contains("two SLOs are named a"), "{twice}");
    }
    /// A job with a select, an exchange by service and a regression operator with `settings`.
    fn regression_problems(settings: &str) -> String {
        let text = format!(
            "{HEAD}{KAFKA}\n\
             [[operators]]\nid = \"requests\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"service_name\", \"service_version\", \"duration_ns\", \
             \"CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error\", \"kafka_offset\", \"kafka_item\"]\n\
             [[operators]]\nid = \"by_service\"\nkind = \"exchange\"\ninput = \"requests\"\nkey = [\"service_name\"]\n\
             [[operators]]\nid = \"deploys\"\nkind = \"regression\"\ninput = \"by_service\"\n{settings}"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_regression_operator_is_checked_with_its_place() {
        assert_eq!(regression_problems(""), "");
        assert_eq!(
            regression_problems(
                "regression = { after = \"5m\", min_requests = 50, latency_effect = 1.5 }\n"
            ),
            ""
        );
        let minutes = regression_problems("regression = { after = \"90s\" }\n");
        assert!(
            minutes.contains(":21:24") && minutes.contains("whole number of minutes"),
            "{minutes}"
        );
        let effect = regression_problems("regression = { latency_effect = 0.9 }\n");
        assert!(effect.contains("ratio above 1"), "{effect}");
        let alpha = regression_problems("regression = { alpha = 1.5 }\n");
        assert!(alpha.contains("`alpha` is between 0 and 1"), "{alpha}");
        let unknown = regression_problems("regression = { alfa = 0.01 }\n");
        assert!(unknown.contains("alfa"), "{unknown}");
        let misplaced = regression_problems("endpoint_column = \"x\"\n");
        assert!(
            misplaced.contains("not a setting of a regression operator"),
            "{misplaced}"
        );
        let wrong_key = regression_problems("service_column = \"service_version\"\n");
        assert!(
            wrong_key.contains("exchanged by service_name"),
            "{wrong_key}"
        );
    }

    /// A job with a select, an exchange keyed by `key` and an edges operator with `settings`.
    fn edges_problems(key: &str, settings: &str) -> String {
        let text = format!(
            "{HEAD}{KAFKA}\n\
             [[operators]]\nid = \"edge_spans\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"trace_id\", \"span_id\", \"parent_span_id\", \"service_name\", \
             \"duration_ns\", \"CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error\", \
             \"kafka_offset\", \"kafka_item\"]\n\
             [[operators]]\nid = \"by_trace\"\nkind = \"exchange\"\ninput = \"edge_spans\"\nkey = [\"{key}\"]\n\
             [[operators]]\nid = \"edges\"\nkind = \"edges\"\ninput = \"by_trace\"\n{settings}"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_edges_operator_is_checked_with_its_place() {
        assert_eq!(edges_problems("trace_id", ""), "");
        assert_eq!(
            edges_problems(
                "trace_id",
                "join_window = \"10m\"\nallowed_lateness = \"1m\"\n"
            ),
            ""
        );
        let window = edges_problems("trace_id", "join_window = \"0s\"\n");
        assert!(window.contains(":21:15"), "{window}");
        let misplaced = edges_problems("trace_id", "key = [\"service_name\"]\n");
        assert!(
            misplaced.contains("not a setting of an edges operator"),
            "{misplaced}"
        );
        let by_service = edges_problems("service_name", "");
        assert!(
            by_service.contains("exchanged by service_name")
                && by_service.contains("exchange by trace_id alone"),
            "{by_service}"
        );
        let elsewhere = regression_problems("join_window = \"5m\"\n");
        assert!(
            elsewhere.contains("`join_window` is not a setting of a regression operator"),
            "{elsewhere}"
        );
    }

    /// A job with a select, an exchange by service and an anomaly operator with `settings`.
    fn anomaly_problems(settings: &str) -> String {
        series_problems("anomaly", settings)
    }

    /// The same with a forecast operator.
    fn forecast_problems(settings: &str) -> String {
        series_problems("forecast", settings)
    }

    fn series_problems(kind: &str, settings: &str) -> String {
        let text = format!(
            "{HEAD}{KAFKA}\n\
             [[operators]]\nid = \"requests\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"service_name\", \"span_name\", \"duration_ns\", \"status_code\", \
             \"CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error\", \"kafka_offset\", \"kafka_item\"]\n\
             [[operators]]\nid = \"by_service\"\nkind = \"exchange\"\ninput = \"requests\"\nkey = [\"service_name\"]\n\
             [[operators]]\nid = \"judged\"\nkind = \"{kind}\"\ninput = \"by_service\"\n{settings}"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_anomaly_operator_is_checked_with_its_place() {
        let measures =
            "measures = { p99 = \"quantile(duration_ns, 0.99)\", errors = \"ratio(error)\" }\n";
        let good = format!("key = [\"service_name\", \"span_name\"]\n{measures}");
        assert_eq!(anomaly_problems(&good), "");
        assert_eq!(
            anomaly_problems(&format!(
                "{good}anomaly = {{ threshold = 3.5, warmup = 10, ttl = \"2h\", direction = \"up\", seasonality = \"none\" }}\n"
            )),
            ""
        );
        let no_key = anomaly_problems(measures);
        assert!(no_key.contains("needs `key`"), "{no_key}");
        let no_measures = anomaly_problems("key = [\"service_name\"]\n");
        assert!(no_measures.contains("needs `measures`"), "{no_measures}");
        let bad_measure = anomaly_problems(
            "key = [\"service_name\"]\nmeasures = { x = \"median(duration_ns)\" }\n",
        );
        assert!(
            bad_measure.contains(":22:18") && bad_measure.contains("ratio(col)"),
            "{bad_measure}"
        );
        let text_column =
            anomaly_problems("key = [\"service_name\"]\nmeasures = { x = \"avg(status_code)\" }\n");
        assert!(text_column.contains("not a number"), "{text_column}");
        let direction =
            anomaly_problems(&format!("{good}anomaly = {{ direction = \"sideways\" }}\n"));
        assert!(
            direction.contains(":23:25") && direction.contains("sideways"),
            "{direction}"
        );
        let alpha = anomaly_problems(&format!("{good}anomaly = {{ alpha = 0 }}\n"));
        assert!(alpha.contains("`alpha` is between 0 and 1"), "{alpha}");
        let ttl = anomaly_problems(&format!("{good}anomaly = {{ ttl = \"90s\" }}\n"));
        assert!(ttl.contains("whole minutes"), "{ttl}");
        let wrong_key = anomaly_problems(&format!("key = [\"span_name\"]\n{measures}"));
        assert!(
            wrong_key.contains("exchanged by service_name"),
            "{wrong_key}"
        );
        let elsewhere = regression_problems(measures);
        assert!(
            elsewhere.contains("`measures` is not a setting of a regression operator"),
            "{elsewhere}"
        );
    }

    #[test]
    fn a_forecast_operator_is_checked_with_its_place() {
        let base = "key = [\"service_name\"]\nmeasures = { d = \"max(duration_ns)\" }\n";
        let problems = |settings: &str| forecast_problems(&format!("{base}{settings}"));
        assert_eq!(problems("forecast = { threshold = 5e8 }\n"), "");
        assert_eq!(
            problems(
                "forecast = { threshold = 10, horizon = \"2h\", alpha = 0.3, beta = 0.1, warmup = 5, direction = \"down\" }\n"
            ),
            ""
        );
        let missing = problems("");
        assert!(
            missing.contains("needs `forecast = { threshold"),
            "{missing}"
        );
        let no_threshold = problems("forecast = { horizon = \"1h\" }\n");
        assert!(
            no_threshold.contains(":23:12") && no_threshold.contains("its `threshold`"),
            "{no_threshold}"
        );
        let horizon = problems("forecast = { threshold = 1, horizon = \"30s\" }\n");
        assert!(horizon.contains("`horizon` is whole minutes"), "{horizon}");
        let direction = problems("forecast = { threshold = 1, direction = \"both\" }\n");
        assert!(direction.contains("\"up\" or \"down\""), "{direction}");
        let misplaced = problems("forecast = { threshold = 1 }\nanomaly = { threshold = 4 }\n");
        assert!(
            misplaced.contains("`anomaly` is not a setting of a forecast operator"),
            "{misplaced}"
        );
    }

    /// A job with two selects of the spans and `union`.
    fn union_problems(union: &str) -> String {
        let text = format!(
            "{HEAD}{KAFKA}\n\
             [[operators]]\nid = \"failed\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"service_name\", \"kafka_offset\", \"kafka_item\"]\n\
             [[operators]]\nid = \"slow\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"service_name\", \"duration_ns\", \"kafka_offset\", \"kafka_item\"]\n\
             [[operators]]\nid = \"notable\"\nkind = \"union\"\n{union}"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_union_is_checked_with_its_place() {
        assert_eq!(union_problems("inputs = [\"failed\", \"slow\"]\n"), "");
        let one = union_problems("input = \"failed\"\n");
        assert!(one.contains("needs `inputs`: two or more"), "{one}");
        let twice = union_problems("inputs = [\"failed\", \"failed\"]\n");
        assert!(twice.contains("reads stream failed twice"), "{twice}");
        let unknown = union_problems("inputs = [\"failed\", \"nope\"]\n");
        assert!(
            unknown.contains("reads stream nope, which nothing produces"),
            "{unknown}"
        );
        let types = union_problems(
            "inputs = [\"failed\", \"renamed\"]\n\
             [[operators]]\nid = \"renamed\"\nkind = \"select\"\ninput = \"spans\"\n\
             columns = [\"ts\", \"duration_ns AS service_name\", \"kafka_offset\", \"kafka_item\"]\n",
        );
        assert!(types.contains("column service_name is"), "{types}");
        let elsewhere = regression_problems("inputs = [\"spans\", \"spans\"]\n");
        assert!(
            elsewhere.contains("both `input` and `inputs`"),
            "{elsewhere}"
        );
    }

    /// A generator job with `incidents`.
    fn incident_problems(incidents: &str) -> String {
        let text = format!(
            "{HEAD}[source.generator]\nrequests_per_second = 10\nincidents = [{incidents}]\n"
        );
        match JobConfig::from_toml::<RawSource>(None, &text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn generator_incidents_are_checked_with_their_place() {
        assert_eq!(
            incident_problems(
                "{ service = \"inventory\", kind = \"errors\", at = \"40m\", for = \"10m\", factor = 20 }, \
                 { service = \"checkout\", kind = \"slow\", endpoint = \"PlaceOrder\", at = \"1h\" }, \
                 { service = \"payments\", kind = \"saturation\", at = \"80m\", for = \"30m\" }"
            ),
            ""
        );
        let service = incident_problems("{ service = \"nope\", kind = \"errors\" }");
        assert!(
            service.contains(":7:26") && service.contains("the generator's services are"),
            "{service}"
        );
        let kind = incident_problems("{ service = \"payments\", kind = \"fire\" }");
        assert!(
            kind.contains("\"errors\", \"slow\" or \"saturation\""),
            "{kind}"
        );
        let endpoint =
            incident_problems("{ service = \"payments\", kind = \"slow\", endpoint = \"GET /\" }");
        assert!(
            endpoint.contains("the endpoints of payments are Charge, Refund"),
            "{endpoint}"
        );
        let factor =
            incident_problems("{ service = \"payments\", kind = \"errors\", factor = -1 }");
        assert!(factor.contains("a factor is a positive number"), "{factor}");
    }
}
