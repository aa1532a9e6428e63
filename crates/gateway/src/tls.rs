//! TLS, with rustls on ring: the public listener's certificate (read from PEM files, replaced in
//! place on a reload while open connections keep the one they began with) and the trust that
//! `https://` replicas are checked against.

use crate::config::{Config, ConfigError, RouteConfig, TlsConfig, err};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::{Arc, RwLock};

/// What the public listener offers by ALPN, h2 first: clients that speak it get one connection
/// for many streams.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The public listener's TLS: the configuration each new connection is accepted with.
pub struct ServerTls {
    files: TlsConfig,
    current: RwLock<Arc<rustls::ServerConfig>>,
    /// Why the files were last refused, until a reload reads them whole.
    refused: std::sync::Mutex<Option<String>>,
}

impl ServerTls {
    /// Reads and checks the certificate chain and its key; every error names the field.
    pub fn load(files: &TlsConfig) -> Result<ServerTls, ConfigError> {
        Ok(ServerTls {
            current: RwLock::new(Arc::new(server_config(files)?)),
            files: files.clone(),
            refused: std::sync::Mutex::new(None),
        })
    }

    /// The files, as configured.
    pub fn files(&self) -> &TlsConfig {
        &self.files
    }

    /// An acceptor with the certificate in force now.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self.current.read().unwrap_or_else(|e| e.into_inner()).clone();
        tokio_rustls::TlsAcceptor::from(config)
    }

    /// Reads the files again: new connections get the new pair, open ones keep theirs. A file
    /// that cannot be used leaves the pair in force, and the error says why.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let config = server_config(&self.files);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) =
            config.as_ref().err().map(ToString::to_string);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config?);
        Ok(())
    }

    /// Why the files were refused by the last reload, while the pair before them is in force.
    pub fn refused(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn server_config(files: &TlsConfig) -> Result<rustls::ServerConfig, ConfigError> {
    let mut config = server_config_at(files, "server.tls")?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A server configuration for the pair in `files`, errors naming the fields under `at`.
fn server_config_at(files: &TlsConfig, at: &str) -> Result<rustls::ServerConfig, ConfigError> {
    let chain = certificates(&files.cert, &format!("{at}.cert"))?;
    let key = private_key(&files.key, &format!("{at}.key"))?;
    with_pair(chain, key, at).map_err(|e| {
        err(
            format!("{at}.key"),
            format!(
                "{} cannot serve the certificate in {}: {}",
                files.key.display(),
                files.cert.display(),
                e.message
            ),
        )
    })
}

fn with_pair(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    at: &str,
) -> Result<rustls::ServerConfig, ConfigError> {
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(at, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| err(at, e.to_string()))
}

/// The endpoint picker's TLS, HTTP/2 only (gRPC): the pair in the files, or one made at start —
/// the Gateways that speak TLS to a picker do not check its certificate (the protocol's own
/// reference picker makes one the same way). Read once: a new pair takes a restart.
pub(crate) fn picker_config(
    tls: &crate::config::PickerTls,
) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let at = "endpoint_picker.tls";
    let mut config = match tls {
        crate::config::PickerTls::Files(files) => server_config_at(files, at)?,
        crate::config::PickerTls::Made(_) => {
            let made = rcgen::generate_simple_self_signed(vec!["spillway-endpoint-picker".to_owned()])
                .map_err(|e| err(at, format!("cannot make a certificate: {e}")))?;
            let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
                .map_err(|e| err(at, format!("cannot use the key made: {e}")))?;
            with_pair(vec![made.cert.der().clone()], key, at)?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn read(path: &Path, field: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| err(field, format!("cannot read {}: {e}", path.display())))
}

/// The certificates of a PEM file, in order; at least one.
fn certificates(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    parse_certificates(path, &read(path, field)?, field)
}

fn parse_certificates(
    path: &Path,
    pem: &[u8],
    field: &str,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(field, format!("{} is not valid PEM: {e}", path.display())))?;
    if chain.is_empty() {
        return Err(err(
            field,
            format!(
                "{} holds no certificate (a PEM block `-----BEGIN CERTIFICATE-----`)",
                path.display()
            ),
        ));
    }
    Ok(chain)
}

fn private_key(path: &Path, field: &str) -> Result<PrivateKeyDer<'static>, ConfigError> {
    let pem = read(path, field)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "holds no private key (a PEM block `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`)"
                    .to_owned()
            }
            e => format!("is not a valid PEM private key: {e}"),
        };
        err(field, format!("{} {why}", path.display()))
    })
}

/// How a route's `https://` replicas are trusted: the rustls configuration, and the CA bundle it
/// was made from (a reload that reads the same bundle keeps the replicas' open connections).
pub(crate) struct ReplicaTrust {
    pub(crate) client: Arc<rustls::ClientConfig>,
    ca: Option<Vec<u8>>,
}

impl ReplicaTrust {
    pub(crate) fn same_as(&self, other: &ReplicaTrust) -> bool {
        self.ca == other.ca
    }
}

/// The trust of route `i`'s `https://` replicas, `None` when it has neither such a replica nor a
/// `ca_file`.
pub(crate) fn route_trust(route: &RouteConfig, i: usize) -> Result<Option<ReplicaTrust>, ConfigError> {
    let https = route
        .replicas
        .iter()
        .chain(route.classes.iter().flat_map(|c| c.replicas.iter().flatten()))
        .any(|url| url.starts_with("https://"));
    if !https && route.ca_file.is_none() {
        return Ok(None);
    }
    let field = format!("routes[{i}].ca_file");
    let ca = match &route.ca_file {
        Some(path) => Some(read(path, &field)?),
        None => None,
    };
    let client = replica_trust(route.ca_file.as_deref().zip(ca.as_deref()), &field)?;
    Ok(Some(ReplicaTrust { client, ca }))
}

/// For a route without `https://` replicas: the health checks' connector still wants a TLS
/// configuration, and this one trusts nothing.
pub(crate) fn no_trust() -> Result<rustls::ClientConfig, ConfigError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err("tls", e.to_string()))?;
    Ok(builder
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// Every route's `ca_file` read and checked, as the gateway does at start (`spillway check`).
pub fn check_ca_files(config: &Config) -> Result<(), ConfigError> {
    for (i, route) in config.routes.iter().enumerate() {
        route_trust(route, i)?;
    }
    Ok(())
}

/// Trust in the CA bundle `ca` (its path and PEM; `field` names it in errors), or in the Mozilla
/// roots without one. No ALPN: the replicas are spoken to in HTTP/1.1.
fn replica_trust(ca: Option<(&Path, &[u8])>, field: &str) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some((path, pem)) => {
            for (i, cert) in parse_certificates(path, pem, field)?.into_iter().enumerate() {
                roots.add(cert).map_err(|e| {
                    err(
                        field,
                        format!("certificate {} of {} cannot be a CA: {e}", i + 1, path.display()),
                    )
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(field, e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn pair(dir: &Path, name: &str) -> TlsConfig {
        let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let files = TlsConfig {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, key.cert.pem()).unwrap();
        std::fs::write(&files.key, key.signing_key.serialize_pem()).unwrap();
        files
    }

    fn error(files: &TlsConfig) -> String {
        match ServerTls::load(files) {
            Ok(_) => panic!("{files:?} loaded"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_pair_that_cannot_serve_is_refused_naming_the_field() {
        let d = dir();
        let good = pair(d.path(), "a");
        assert!(ServerTls::load(&good).is_ok());
        let missing = TlsConfig {
            cert: d.path().join("none.crt"),
            ..good.clone()
        };
        let e = error(&missing);
        assert!(
            e.starts_with("server.tls.cert: cannot read ") && e.contains("none.crt"),
            "{e}"
        );
        let text = d.path().join("text");
        std::fs::write(&text, "not a certificate\n").unwrap();
        let e = error(&TlsConfig {
            cert: text.clone(),
            ..good.clone()
        });
        assert!(
            e.starts_with("server.tls.cert: ") && e.contains("holds no certificate"),
            "{e}"
        );
        let e = error(&TlsConfig {
            key: text,
            ..good.clone()
        });
        assert!(
            e.starts_with("server.tls.key: ") && e.contains("holds no private key"),
            "{e}"
        );
        // A key that is not the certificate's.
        let other = pair(d.path(), "b");
        let e = error(&TlsConfig {
            key: other.key,
            ..good
        });
        assert!(
            e.starts_with("server.tls.key: ") && e.contains("cannot serve"),
            "{e}"
        );
    }

    #[test]
    fn a_reload_that_fails_keeps_the_pair_in_force() {
        let d = dir();
        let files = pair(d.path(), "a");
        let tls = ServerTls::load(&files).unwrap();
        let before = tls.acceptor().config().clone();
        std::fs::write(&files.key, "gone").unwrap();
        assert!(
            tls.reload()
                .unwrap_err()
                .to_string()
                .starts_with("server.tls.key: ")
        );
        assert!(Arc::ptr_eq(&before, tls.acceptor().config()));
        assert!(tls.refused().is_some_and(|e| e.starts_with("server.tls.key: ")));
        pair(d.path(), "a");
        tls.reload().unwrap();
        assert_eq!(tls.refused(), None);
        assert!(!Arc::ptr_eq(&before, tls.acceptor().config()));
        assert_eq!(
            tls.acceptor().config().alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn a_ca_file_must_hold_certificates() {
        let d = dir();
        let files = pair(d.path(), "a");
        let config = |replica: &str, ca: &Path| {
            let yaml = format!(
                "listen: 127.0.0.1:0\nroutes:\n  - model: a\n    replicas: [http://127.0.0.1:1]\n  - model: b\n    replicas: [{replica}]\n    ca_file: {}\n",
                ca.display()
            );
            Config::from_yaml(&yaml).unwrap()
        };
        check_ca_files(&config("https://127.0.0.1:1", &files.cert)).unwrap();
        let e = check_ca_files(&config("https://127.0.0.1:1", &files.key))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("routes[1].ca_file: ") && e.contains("holds no certificate"),
            "{e}"
        );
        let e = check_ca_files(&config("http://127.0.0.1:1", &d.path().join("none")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("routes[1].ca_file: cannot read "), "{e}");
        let plain = Config::from_yaml(
            "listen: 127.0.0.1:0\nroutes:\n  - model: a\n    replicas: [http://127.0.0.1:1]\n",
        )
        .unwrap();
        assert!(route_trust(&plain.routes[0], 0).unwrap().is_none());
    }
}
