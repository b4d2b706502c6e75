//! A Collector of `tests/services/collector` (`FLOE_TEST_OTELCOL`) run by a test: started with
//! a config file and its environment, fed OTLP/HTTP protobuf exports, stopped with SIGTERM
//! (which flushes what it holds to its exporters).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use floe_otlp::Signal;
use floe_otlp::generate::Record;

use super::{free_port, service};

/// A running Collector.
pub(crate) struct Collector {
    child: Child,
    http: u16,
    log: PathBuf,
}

impl Collector {
    /// Starts the Collector on `config` with `env` (besides the receiver's and its own
    /// telemetry's endpoints, on free ports: `OTLP_GRPC_ENDPOINT`, `OTLP_HTTP_ENDPOINT`,
    /// `COLLECTOR_METRICS_HOST`, `COLLECTOR_METRICS_PORT`), logging to `log`.
    pub(crate) fn start(config: &Path, args: &[&str], env: &[(&str, &str)], log: &Path) -> Self {
        let http = free_port();
        let child = Command::new(service("FLOE_TEST_OTELCOL"))
            .arg("--config")
            .arg(config)
            .args(args)
            .env("OTLP_GRPC_ENDPOINT", format!("127.0.0.1:{}", free_port()))
            .env("OTLP_HTTP_ENDPOINT", format!("127.0.0.1:{http}"))
            .env("COLLECTOR_METRICS_HOST", "127.0.0.1")
            .env("COLLECTOR_METRICS_PORT", free_port().to_string())
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            http,
            log: log.to_path_buf(),
        }
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the OTLP/HTTP receiver answers an empty export.
    pub(crate) async fn ready(&mut self, http: &reqwest::Client) {
        let began = Instant::now();
        loop {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the Collector exited: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            let answer = http
                .post(format!("http://127.0.0.1:{}/v1/traces", self.http))
                .header("content-type", "application/x-protobuf")
                .body(Vec::new())
                .send()
                .await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return;
            }
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "the Collector did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends one OTLP/HTTP protobuf export (a `TracesData` is wire-compatible with an
    /// `ExportTraceServiceRequest`, and so on), which the Collector must accept.
    pub(crate) async fn send(&self, http: &reqwest::Client, record: &Record) {
        let path = match record.signal {
            Signal::Traces => "v1/traces",
            Signal::Logs => "v1/logs",
            Signal::Metrics => "v1/metrics",
            Signal::Profiles => "v1development/profiles",
        };
        let answer = http
            .post(format!("http://127.0.0.1:{}/{path}", self.http))
            .header("content-type", "application/x-protobuf")
            .body(record.bytes.clone())
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.text().await);
    }

    /// SIGTERM: the Collector flushes to its exporters and exits.
    pub(crate) fn stop(mut self) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(
            self.child.wait().unwrap().success(),
            "the Collector stops cleanly: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}
