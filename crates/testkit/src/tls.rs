//! TLS for tests: a self-signed certificate made on the spot (rcgen) and written as PEM files, a
//! client configuration that trusts it, and a TLS front that passes the bytes on to a plain server.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A self-signed certificate for `localhost` and `127.0.0.1`, and its key, as PEM.
pub struct Cert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Cert {
    pub fn new() -> Cert {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let key = rcgen::generate_simple_self_signed(names).expect("a certificate");
        Cert {
            cert_pem: key.cert.pem(),
            key_pem: key.signing_key.serialize_pem(),
        }
    }

    /// Writes `dir/NAME.crt` and `dir/NAME.key`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&cert, &self.cert_pem).expect("write the certificate");
        std::fs::write(&key, &self.key_pem).expect("write the key");
        (cert, key)
    }

    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).expect("PEM")
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A server configuration presenting this certificate, offering `alpn`.
    pub fn server_config(&self, alpn: &[&[u8]]) -> rustls::ServerConfig {
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("PEM key");
        let mut config = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![self.der()], key)
            .expect("a usable pair");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    /// A client configuration trusting only this certificate, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der()).expect("a root");
        let mut config = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

impl Default for Cert {
    fn default() -> Self {
        Cert::new()
    }
}

/// A TLS connection to `addr` (as `127.0.0.1`) trusting only `cert`, offering `alpn`.
pub async fn connect(
    addr: SocketAddr,
    cert: &Cert,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cert.client_config(alpn)));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").expect("a name");
    connector.connect(name, tcp).await
}

/// Terminates TLS with `cert` on a new port and passes each connection's bytes on to `upstream`
/// (an `https://` replica made of a plain one); returns the port's address.
pub async fn front(upstream: SocketAddr, cert: &Cert) -> SocketAddr {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cert.server_config(&[b"http/1.1"])));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

/// `GET /health` on an open connection, kept open for what the test does next: the answer's
/// status line.
pub async fn health<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(conn: &mut S) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}
