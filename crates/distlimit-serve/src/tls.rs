//! TLS and mutual TLS on [`serve_tls`](crate::serve_tls) and the [`Acceptor`](crate::Acceptor)'s
//! connections, from PEM files that are read again when they change (feature `tls`).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

use crate::Connection;

/// The PEM files of a TLS server.
///
/// Each is read through its path every time (at start and at each reload), so a path through
/// a symbolic link that is swapped (Kubernetes' `..data` in a mounted secret) reads the new
/// target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain: its own certificate first, then the intermediates.
    pub cert_chain: PathBuf,
    /// The private key of the first certificate (PKCS#8, PKCS#1 or SEC1).
    pub private_key: PathBuf,
    /// With it, mutual TLS: clients must present a certificate issued by one of the
    /// certificates in this file; without it, no client certificate is asked for.
    pub client_ca: Option<PathBuf>,
}

/// The protocol negotiated by ALPN on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Alpn {
    /// `http/1.1`: [`serve_tls`](crate::serve_tls)'s port.
    Http1 = 0,
    /// `h2`: a gRPC port.
    H2 = 1,
}

impl Alpn {
    fn protocol(self) -> &'static [u8] {
        match self {
            Alpn::Http1 => b"http/1.1",
            Alpn::H2 => b"h2",
        }
    }
}

/// Why TLS files were refused, naming the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not valid PEM.
    #[error("{}: not a valid PEM file: {message}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        message: String,
    },
    /// The file holds no certificate (`-----BEGIN CERTIFICATE-----`).
    #[error("{}: no PEM certificate in the file", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The file holds no private key (`-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE KEY` or `EC
    /// PRIVATE KEY`).
    #[error("{}: no PEM private key in the file", path.display())]
    NoPrivateKey {
        /// The file.
        path: PathBuf,
    },
    /// The private key is of a kind that cannot sign, or is malformed.
    #[error("{}: unusable private key: {source}", path.display())]
    BadPrivateKey {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// The private key is not the key of the first certificate of the chain.
    #[error(
        "{}: the private key does not match the certificate in {}: {source}",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// A certificate of the client CA file was refused as a trust anchor, or the client
    /// verifier could not be built from them.
    #[error("{}: unusable client CA: {message}", path.display())]
    BadClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// rustls refused the configuration (the protocol versions of the provider).
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

impl TlsError {
    /// The file the error is about (the key file for a mismatch), if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            TlsError::Read { path, .. }
            | TlsError::Pem { path, .. }
            | TlsError::NoCertificate { path }
            | TlsError::NoPrivateKey { path }
            | TlsError::BadPrivateKey { path, .. }
            | TlsError::BadClientCa { path, .. } => Some(path),
            TlsError::KeyMismatch { key, .. } => Some(key),
            TlsError::Config(_) => None,
        }
    }
}

/// The bytes of the files, compared at each reload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Contents {
    cert_chain: Vec<u8>,
    private_key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// The largest certificate, key or CA file read: a chain or a CA bundle is a few to a few
/// hundred KiB.
pub const MAX_TLS_FILE_BYTES: u64 = 1 << 20;

impl Contents {
    fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            crate::read_at_most(path, MAX_TLS_FILE_BYTES).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok(Self {
            cert_chain: read(&files.cert_chain)?,
            private_key: read(&files.private_key)?,
            client_ca: files.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

/// The configurations built from one version of the files, one per ALPN protocol (indexed by
/// the [`Alpn`]).
struct Loaded {
    contents: Contents,
    configs: [Arc<ServerConfig>; 2],
}

/// What the last reload of a [`Tls`] did: the poller's [`Reload`](crate::Reload), whose
/// `Rejected` error names the file; the running certificate keeps serving meanwhile.
pub type TlsReload = crate::Reload<String>;

struct Inner {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<Loaded>,
    /// Failed handshakes on `http/1.1` ports, then on `h2` ports.
    handshake_failures: [AtomicU64; 2],
}

/// A TLS server's certificate, key and client CA, read from [`TlsFiles`] and replaced for new
/// connections by the task of [`watch`](Self::watch) when the files change; connections
/// already open keep the certificate they started with. Cheap to clone: clones share the
/// certificate. Uses rustls with the *ring* provider, TLS 1.2 and 1.3.
#[derive(Clone)]
pub struct Tls {
    inner: Arc<Inner>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.inner.files)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads and checks `files`: the chain's certificates, the key (which must be the first
    /// certificate's), and the client CA's certificates.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or is not PEM, a missing certificate or key, a key that does
    /// not match the certificate, a client CA file without a usable certificate.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let contents = Contents::read(&files)?;
        let loaded = build(&files, &provider, contents)?;
        Ok(Self {
            inner: Arc::new(Inner {
                files,
                provider,
                current: ArcSwap::from_pointee(loaded),
                handshake_failures: [AtomicU64::new(0), AtomicU64::new(0)],
            }),
        })
    }

    /// The files.
    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// Starts the file poller ([`poll_files`](crate::poll_files)) on the files every
    /// `interval`, and at once when `hangup` changes: it logs what it applies and, once per
    /// distinct change, what it refuses (with the file's path). Dropping the returned
    /// [`TlsWatcher`] stops it. Needs a Tokio runtime.
    pub fn watch(&self, interval: Duration, hangup: Option<watch::Receiver<u64>>) -> TlsWatcher {
        crate::poll_files(
            &tokio::runtime::Handle::current(),
            "TLS files",
            Watched(self.clone()),
            interval,
            hangup,
        )
    }

    /// Runs the TLS handshake of `connection` with the current certificate, within `timeout`.
    /// A failure (a plaintext client, an untrusted or missing client certificate, a timeout)
    /// is counted in [`handshake_failures`](Self::handshake_failures) and returned; the caller
    /// drops the connection. The certificate is chosen when the handshake starts: a reload
    /// never changes the certificate of a connection already open.
    ///
    /// # Errors
    ///
    /// The handshake failed or did not finish in time.
    pub async fn accept(
        &self,
        connection: Connection,
        alpn: Alpn,
        timeout: Duration,
    ) -> io::Result<TlsStream<Connection>> {
        let config = self.inner.current.load().configs[alpn as usize].clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let result = match tokio::time::timeout(timeout, acceptor.accept(connection)).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("TLS handshake not finished within {timeout:?}"),
            )),
        };
        if result.is_err() {
            self.inner.handshake_failures[alpn as usize].fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// How many handshakes failed since the start on the ports speaking `alpn`.
    pub fn handshake_failures(&self, alpn: Alpn) -> u64 {
        self.inner.handshake_failures[alpn as usize].load(Ordering::Relaxed)
    }
}

/// A running TLS reload task (from [`Tls::watch`]); dropping it stops the task.
pub type TlsWatcher = crate::FileWatcher<String>;

/// The files of a [`Tls`] as the poller sees them: read, compared with the last read, applied
/// when changed (and not the running ones).
struct Watched(Tls);

impl crate::Reloadable for Watched {
    type Contents = Contents;
    type Error = String;

    fn read(&self) -> Result<Contents, String> {
        Contents::read(&self.0.inner.files).map_err(|error| error.to_string())
    }

    /// Builds and serves `contents` unless they are the running ones; on an error (as
    /// [`Tls::load`]'s) the running certificate is kept.
    fn apply(&self, contents: &Contents) -> Result<bool, String> {
        let inner = &self.0.inner;
        if *contents == inner.current.load().contents {
            return Ok(false);
        }
        let loaded = build(&inner.files, &inner.provider, contents.clone());
        let loaded = loaded.map_err(|error| error.to_string())?;
        inner.current.store(Arc::new(loaded));
        Ok(true)
    }

    fn running(&self) -> Option<Contents> {
        Some(self.0.inner.current.load().contents.clone())
    }
}

fn pem_error(path: &Path, error: rustls_pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.to_owned(),
        message: error.to_string(),
    }
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(path, error))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certificates)
}

fn build(
    files: &TlsFiles,
    provider: &Arc<CryptoProvider>,
    contents: Contents,
) -> Result<Loaded, TlsError> {
    let chain = certificates(&files.cert_chain, &contents.cert_chain)?;
    let key =
        PrivateKeyDer::from_pem_slice(&contents.private_key).map_err(|error| match error {
            rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey {
                path: files.private_key.clone(),
            },
            error => pem_error(&files.private_key, error),
        })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::BadPrivateKey {
            path: files.private_key.clone(),
            source,
        })?;
    let certified = rustls::sign::CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // A key whose public half rustls cannot derive is not refused here (nor by rustls).
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(source) => {
            return Err(TlsError::KeyMismatch {
                cert: files.cert_chain.clone(),
                key: files.private_key.clone(),
                source,
            });
        }
    }
    let certified = Arc::new(certified);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let bad_ca = |error: &dyn fmt::Display| TlsError::BadClientCa {
                path: path.clone(),
                message: error.to_string(),
            };
            let mut roots = RootCertStore::empty();
            for certificate in certificates(path, pem)? {
                roots.add(certificate).map_err(|e| bad_ca(&e))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| bad_ca(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let resolver = Arc::new(rustls::sign::SingleCertAndKey::from(certified));
    let config = builder.with_cert_resolver(resolver);
    let with_alpn = |alpn: Alpn| {
        let mut config = config.clone();
        config.alpn_protocols = vec![alpn.protocol().to_vec()];
        Arc::new(config)
    };
    Ok(Loaded {
        configs: [with_alpn(Alpn::Http1), with_alpn(Alpn::H2)],
        contents,
    })
}
