//! Opening sessions to the server: ordinary ones (catalog reads, the snapshot's `COPY`) over
//! `tokio-postgres` with TLS per `ssl_mode` (`super::tls`), and the replication session over
//! `pgwire-replication`; every session runs with [`types::SESSION_OPTIONS`].
//!
//! Failures are [`SourceError`]s: an unreadable certificate file is the user's, a session
//! that cannot be opened the server's (external).

use std::time::Duration;

use floe_core::SourceError;
use pgwire_replication::{IdentifySystem, Lsn, ReplicationClient, ReplicationConfig, TlsConfig};
use tokio_postgres::NoTls;

use super::config::{PostgresConfig, SslMode};
use super::{err, tls};
use crate::types;

impl PostgresConfig {
    fn tokio_config(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host(&self.host)
            .port(self.port)
            .user(&self.user)
            .password(&self.password)
            .dbname(&self.database)
            .application_name("floe")
            .options(types::SESSION_OPTIONS);
        c
    }

    fn replication_config(&self) -> ReplicationConfig {
        let tls = match self.ssl_mode {
            SslMode::Disable => TlsConfig::disabled(),
            SslMode::Require => TlsConfig::require(),
            SslMode::VerifyCa => TlsConfig::verify_ca(self.ssl_root_cert.clone()),
            SslMode::VerifyFull => TlsConfig::verify_full(self.ssl_root_cert.clone()),
        };
        ReplicationConfig::new(
            self.host.clone(),
            self.user.clone(),
            self.password.clone(),
            self.database.clone(),
            self.slot.clone(),
            self.publication.clone(),
        )
        .with_port(self.port)
        .with_tls(tls)
        .with_options(types::SESSION_OPTIONS)
        .with_application_name("floe")
        .with_status_interval(Duration::from_secs(1))
    }
}

/// An ordinary session (its connection driven by a task of its own).
pub(super) async fn connect(
    config: &PostgresConfig,
) -> Result<tokio_postgres::Client, SourceError> {
    // The causes say what went wrong (a TLS handshake error names the certificate problem).
    let failed = |e: tokio_postgres::Error| {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        err(
            &format!("cannot connect to {}:{}", config.host, config.port),
            message,
        )
    };
    let tls = tls::connector(&config.ssl_mode, config.ssl_root_cert.as_deref())
        .map_err(|e| SourceError::user(format!("postgres: TLS: {e}")))?;
    let mut settings = config.tokio_config();
    let client = match tls {
        None => {
            let (client, connection) = settings.connect(NoTls).await.map_err(failed)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            client
        }
        Some(tls) => {
            settings.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, connection) = settings.connect(tls).await.map_err(failed)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            client
        }
    };
    Ok(client)
}

/// A replication session that waits before START_REPLICATION (it will start at `start`),
/// and the server's IDENTIFY_SYSTEM answer.
pub(super) async fn open_replication(
    config: &PostgresConfig,
    start: Lsn,
) -> Result<(ReplicationClient, IdentifySystem), SourceError> {
    let mut replication =
        ReplicationClient::connect_gated(config.replication_config().with_start_lsn(start))
            .await
            .map_err(|e| err("replication session", e))?;
    let system = replication
        .identify_system()
        .await
        .map_err(|e| err("IDENTIFY_SYSTEM", e))?;
    Ok((replication, system))
}
