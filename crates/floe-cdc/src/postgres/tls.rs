//! TLS for the ordinary Postgres sessions (catalog reads, the snapshot's `COPY`), with libpq's
//! `sslmode` meanings — the replication session gets the same through `pgwire-replication`:
//!
//! * `require` — encrypted; the server's certificate is not checked (the handshake's
//!   signatures still are);
//! * `verify-ca` — the certificate chains to `ssl_root_cert` (or the webpki roots); any name;
//! * `verify-full` — and it names the host.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

use super::config::SslMode;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(root_cert: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("cannot read ssl_root_cert {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("ssl_root_cert {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("ssl_root_cert {}: {e}", path.display()))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(roots)
}

/// Checks the handshake's signatures; what else is checked depends on the mode.
#[derive(Debug)]
struct Verifier {
    /// `None`: accept any certificate (`require`).
    chain: Option<Arc<WebPkiServerVerifier>>,
    /// Accept a certificate for another name (`verify-ca`).
    any_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.any_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The connector for `mode`; `None` for `disable`.
pub(crate) fn connector(
    mode: &SslMode,
    root_cert: Option<&Path>,
) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, String> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match mode {
        SslMode::Disable => return Ok(None),
        SslMode::VerifyFull => builder
            .with_root_certificates(roots(root_cert)?)
            .with_no_client_auth(),
        SslMode::Require | SslMode::VerifyCa => {
            let chain = match mode {
                SslMode::VerifyCa => Some(
                    WebPkiServerVerifier::builder_with_provider(
                        Arc::new(roots(root_cert)?),
                        provider.clone(),
                    )
                    .build()
                    .map_err(|e| e.to_string())?,
                ),
                _ => None,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Verifier {
                    chain,
                    any_name: true,
                    algorithms: provider.signature_verification_algorithms,
                }))
                .with_no_client_auth()
        }
    };
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}
