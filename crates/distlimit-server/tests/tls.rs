//! TLS and mutual TLS on both ports, over loopback with certificates made at test time: answers
//! as over plaintext, client certificates checked, failed and stalled handshakes closing only
//! their connection, certificates rotated without a restart, bad files refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use distlimit_server::{Args, Server, StartError, TlsError, TlsReload};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use pem::{certs, key};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::ServerName;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5 }
";

/// PEM to DER for the raw rustls clients, through rustls' own PEM reader.
mod pem {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    pub(crate) fn certs(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    pub(crate) fn key(pem: &str) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap()
    }
}

/// A certificate authority made for one test.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn server(&self) -> Leaf {
        self.leaf(ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self) -> Leaf {
        self.leaf(ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// Writes `leaf` as `cert.pem` and `key.pem` in `dir`.
fn write_leaf(dir: &Path, leaf: &Leaf) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, &leaf.cert).unwrap();
    std::fs::write(&key, &leaf.key).unwrap();
    (cert, key)
}

/// A server on `CONFIG` with TLS from `cert` and `key` (and `flags`).
async fn tls_server(config: &Path, cert: &Path, key: &Path, flags: &[&str]) -> Running {
    let mut all = vec![
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    all.extend_from_slice(flags);
    Running::with_config(config, &all).await
}

/// A gRPC client over TLS trusting `ca`, presenting `identity`.
async fn grpc_client(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Leaf>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

/// One `ShouldRateLimit` for `user` over TLS: the answer or the error (a refused handshake
/// shows either at connect or at the first call).
async fn grpc_check(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Leaf>,
    user: &str,
) -> Result<RateLimitResponse, String> {
    let mut client = grpc_client(addr, ca, identity)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let call = client.should_rate_limit(request("api", vec![descriptor(&[("user", user)])]));
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(format!("call: {status:?}")),
        Err(_) => Err("call: timed out".to_owned()),
    }
}

/// A rustls client trusting `ca`, presenting `identity`, offering `alpn`.
fn client_config(ca: &str, identity: Option<&Leaf>, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(ca) {
        roots.add(cert).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(certs(&leaf.cert), key(&leaf.key))
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `addr` as `localhost`.
async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(config);
    tokio::time::timeout(
        Duration::from_secs(5),
        connector.connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await
    .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// One HTTP/1.1 request over TLS: the status and the body.
async fn https(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Leaf>,
    method: &str,
    path: &str,
    body: String,
) -> Result<(u16, String), String> {
    let tls = tls_connect(addr, client_config(ca, identity, &[b"http/1.1"]))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http handshake: {e}"))?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
        .await
        .map_err(|_| "request timed out".to_owned())?
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Ok((status, String::from_utf8(body.to_vec()).unwrap()))
}

/// `POST /v1/check` for `user` over TLS: the status and the JSON answer.
async fn http_check(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Leaf>,
    user: &str,
) -> Result<(u16, serde_json::Value), String> {
    let body = format!(r#"{{"domain":"api","descriptors":[[{{"key":"user","value":"{user}"}}]]}}"#);
    let (status, text) = https(addr, ca, identity, "POST", "/v1/check", body).await?;
    Ok((status, serde_json::from_str(&text).unwrap()))
}

/// The value of the `distlimit_server_tls_handshake_failures_total` series of `protocol`.
async fn handshake_failures(addr: SocketAddr, ca: &str, protocol: &str) -> u64 {
    let (status, text) = https(addr, ca, None, "GET", "/metrics", String::new())
        .await
        .unwrap();
    assert_eq!(status, 200);
    let series =
        format!("distlimit_server_tls_handshake_failures_total{{protocol=\"{protocol}\"}} ");
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in {text}"));
    line.trim().parse().unwrap()
}

/// The parts of an answer that do not depend on the time.
fn essentials(answer: &RateLimitResponse) -> Vec<(i32, Option<u32>, u32)> {
    answer
        .statuses
        .iter()
        .map(|s| {
            (
                s.code,
                s.current_limit.as_ref().map(|l| l.requests_per_unit),
                s.limit_remaining,
            )
        })
        .collect()
}

#[tokio::test]
async fn grpc_and_http_over_tls_answer_as_over_plaintext() {
    let config = config_dir(CONFIG);
    let certs_dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let (cert, key) = write_leaf(certs_dir.path(), &ca.server());
    let tls = tls_server(config.path(), &cert, &key, &[]).await;
    let plain = Running::with_config(config.path(), &[]).await;

    let mut plain_client = plain.client().await;
    for round in 0..7 {
        let secure = grpc_check(tls.grpc, &ca.pem(), None, "alice")
            .await
            .unwrap();
        let clear = call(
            &mut plain_client,
            request("api", vec![descriptor(&[("user", "alice")])]),
        )
        .await;
        assert_eq!(secure.overall_code, clear.overall_code, "round {round}");
        assert_eq!(essentials(&secure), essentials(&clear), "round {round}");
    }
    // The seventh of a limit of five was over the limit on both.
    assert_eq!(
        grpc_check(tls.grpc, &ca.pem(), None, "alice")
            .await
            .unwrap()
            .overall_code,
        OVER_LIMIT
    );

    let (status, json) = http_check(tls.http, &ca.pem(), None, "bob").await.unwrap();
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["overall_code"], "OK");
    assert_eq!(json["statuses"][0]["limit_remaining"], 4);
    assert_eq!(json["statuses"][0]["current_limit"]["requests_per_unit"], 5);

    // ALPN: h2 on the gRPC port, http/1.1 on the HTTP port, whatever else the client offers.
    let both: &[&[u8]] = &[b"h2", b"http/1.1"];
    let grpc = tls_connect(tls.grpc, client_config(&ca.pem(), None, both))
        .await
        .unwrap();
    assert_eq!(grpc.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let http = tls_connect(tls.http, client_config(&ca.pem(), None, both))
        .await
        .unwrap();
    assert_eq!(http.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));

    tls.stop().await;
    plain.stop().await;
}

#[tokio::test]
async fn mutual_tls_serves_only_clients_with_a_certificate_of_the_client_ca() {
    let config = config_dir(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("server ca");
    let client_ca = Ca::new("client ca");
    let other_ca = Ca::new("other ca");
    let (cert, key) = write_leaf(dir.path(), &server_ca.server());
    let client_ca_file = dir.path().join("client-ca.pem");
    std::fs::write(&client_ca_file, client_ca.pem()).unwrap();
    let server = tls_server(
        config.path(),
        &cert,
        &key,
        &["--tls-client-ca", client_ca_file.to_str().unwrap()],
    )
    .await;
    let good = client_ca.client();
    let foreign = other_ca.client();
    let ca = server_ca.pem();

    let refused = grpc_check(server.grpc, &ca, None, "alice").await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    let refused = grpc_check(server.grpc, &ca, Some(&foreign), "alice").await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");
    let served = grpc_check(server.grpc, &ca, Some(&good), "alice")
        .await
        .unwrap();
    assert_eq!(served.overall_code, OK);
    // The refused clients spent nothing.
    assert_eq!(essentials(&served), vec![(OK, Some(5), 4)]);

    assert!(http_check(server.http, &ca, None, "bob").await.is_err());
    assert!(
        http_check(server.http, &ca, Some(&foreign), "bob")
            .await
            .is_err()
    );
    let (status, json) = http_check(server.http, &ca, Some(&good), "bob")
        .await
        .unwrap();
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["statuses"][0]["limit_remaining"], 4);
    server.stop().await;
}

#[tokio::test]
async fn a_plaintext_client_fails_cleanly_and_the_next_tls_client_is_served() {
    let config = config_dir(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let (cert, key) = write_leaf(dir.path(), &ca.server());
    let server = tls_server(config.path(), &cert, &key, &["--max-connections", "1"]).await;

    // A plaintext gRPC client: refused, the port keeps serving.
    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await;
    if let Ok(mut client) = plain {
        let answer = client
            .should_rate_limit(request("api", vec![descriptor(&[("user", "alice")])]))
            .await;
        assert!(answer.is_err(), "plaintext gRPC answered over a TLS port");
    }
    // Plaintext HTTP and garbage are closed at once, not left hanging.
    for (port, bytes) in [
        (server.http, &b"GET /ready HTTP/1.1\r\nhost: x\r\n\r\n"[..]),
        (server.grpc, &b"\x00\x01garbage\xff\xfe\r\n\r\n"[..]),
    ] {
        let mut socket = TcpStream::connect(port).await.unwrap();
        socket.write_all(bytes).await.unwrap();
        closed_within(&mut socket, Duration::from_secs(5)).await;
    }
    // With one slot per port, the next TLS clients are served: the failures freed theirs.
    let answer = grpc_check(server.grpc, &ca.pem(), None, "alice")
        .await
        .unwrap();
    assert_eq!(essentials(&answer), vec![(OK, Some(5), 4)]);
    let (status, _) = http_check(server.http, &ca.pem(), None, "alice")
        .await
        .unwrap();
    assert_eq!(status, 200);
    // Each failure counted on its port (tonic may retry its plaintext connection).
    assert!(handshake_failures(server.http, &ca.pem(), "grpc").await >= 2);
    assert_eq!(handshake_failures(server.http, &ca.pem(), "http").await, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_handshake_holds_its_slot_only_until_the_header_read_timeout() {
    const HEADER_MS: u64 = 400;
    let config = config_dir(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let (cert, key) = write_leaf(dir.path(), &ca.server());
    let header = HEADER_MS.to_string();
    let server = tls_server(
        config.path(),
        &cert,
        &key,
        &[
            "--max-connections",
            "1",
            "--header-read-timeout-ms",
            &header,
            "--idle-timeout-ms",
            "60000",
        ],
    )
    .await;
    for grpc in [true, false] {
        let port = if grpc { server.grpc } else { server.http };
        // A client that connects and never starts its handshake takes the only slot.
        let mut stalled = TcpStream::connect(port).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let ca_pem = ca.pem();
        let waiting = tokio::spawn(async move {
            if grpc {
                grpc_check(port, &ca_pem, None, "alice").await.map(|_| ())
            } else {
                match http_check(port, &ca_pem, None, "alice").await? {
                    (200, _) => Ok(()),
                    (status, json) => Err(format!("{status}: {json}")),
                }
            }
        });
        closed_within(&mut stalled, Duration::from_secs(5)).await;
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("served once the stalled handshake timed out")
            .unwrap()
            .unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(HEADER_MS * 3 / 4),
            "served after {waited:?}, before the stalled client's slot was free (grpc: {grpc})"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn stalled_handshakes_never_delay_other_clients() {
    let config = config_dir(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let (cert, key) = write_leaf(dir.path(), &ca.server());
    // Stalled handshakes would hold an accept loop for a minute.
    let server = tls_server(
        config.path(),
        &cert,
        &key,
        &[
            "--header-read-timeout-ms",
            "60000",
            "--idle-timeout-ms",
            "60000",
        ],
    )
    .await;
    let mut stalled = Vec::new();
    for port in [server.grpc, server.http] {
        for _ in 0..3 {
            stalled.push(TcpStream::connect(port).await.unwrap());
        }
    }
    // Half a handshake: a ClientHello's first bytes, never the rest.
    for socket in &mut stalled {
        socket
            .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let within = Duration::from_secs(5);
    let answer = tokio::time::timeout(within, grpc_check(server.grpc, &ca.pem(), None, "alice"))
        .await
        .expect("served while others stall")
        .unwrap();
    assert_eq!(essentials(&answer), vec![(OK, Some(5), 4)]);
    let (status, _) = tokio::time::timeout(within, http_check(server.http, &ca.pem(), None, "bob"))
        .await
        .expect("served while others stall")
        .unwrap();
    assert_eq!(status, 200);
    drop(stalled);
    server.stop().await;
}

/// Points the symbolic link `link` at `target` atomically, as the kubelet swaps `..data`.
fn swap_symlink(link: &Path, target: &Path) {
    let next = link.with_file_name("..data_tmp");
    std::os::unix::fs::symlink(target, &next).unwrap();
    std::fs::rename(&next, link).unwrap();
}

#[tokio::test]
async fn rotated_certificates_serve_new_connections_and_bad_ones_are_refused() {
    let config = config_dir(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    // Kubernetes' layout: cert.pem -> ..data/cert.pem, ..data -> a timestamped directory.
    let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
    std::fs::create_dir(&v1).unwrap();
    std::fs::create_dir(&v2).unwrap();
    let (old_ca, new_ca) = (Ca::new("old ca"), Ca::new("new ca"));
    write_leaf(&v1, &old_ca.server());
    write_leaf(&v2, &new_ca.server());
    let data = dir.path().join("..data");
    std::os::unix::fs::symlink(&v1, &data).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::os::unix::fs::symlink("..data/cert.pem", &cert).unwrap();
    std::os::unix::fs::symlink("..data/key.pem", &key).unwrap();
    let mut server = tls_server(config.path(), &cert, &key, &[]).await;

    let mut open = grpc_client(server.grpc, &old_ca.pem(), None).await.unwrap();
    call(
        &mut open,
        request("api", vec![descriptor(&[("user", "a")])]),
    )
    .await;
    assert!(
        grpc_check(server.grpc, &new_ca.pem(), None, "a")
            .await
            .is_err()
    );

    swap_symlink(&data, &v2);
    assert_eq!(
        server.next_tls_reload().await,
        TlsReload::Applied { generation: 1 }
    );
    grpc_check(server.grpc, &new_ca.pem(), None, "a")
        .await
        .unwrap();
    let (status, _) = http_check(server.http, &new_ca.pem(), None, "a")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        grpc_check(server.grpc, &old_ca.pem(), None, "a")
            .await
            .is_err()
    );
    // The connection opened before keeps its certificate and is served.
    call(
        &mut open,
        request("api", vec![descriptor(&[("user", "a")])]),
    )
    .await;

    // A certificate that is not PEM: refused by name, the new certificate keeps serving.
    replace_file(&v2.join("cert.pem"), "not a certificate").unwrap();
    match server.next_tls_reload().await {
        TlsReload::Rejected { error } => {
            assert!(error.contains("cert.pem"), "{error}");
            assert!(error.contains("no PEM certificate"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    grpc_check(server.grpc, &new_ca.pem(), None, "a")
        .await
        .unwrap();

    // A certificate whose key is another's: refused naming the key file.
    replace_file(&v2.join("cert.pem"), &old_ca.server().cert).unwrap();
    match server.next_tls_reload().await {
        TlsReload::Rejected { error } => {
            assert!(error.contains("key.pem"), "{error}");
            assert!(error.contains("does not match"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    grpc_check(server.grpc, &new_ca.pem(), None, "a")
        .await
        .unwrap();

    // A new version in a new directory: applied.
    let v3 = dir.path().join("v3");
    std::fs::create_dir(&v3).unwrap();
    write_leaf(&v3, &new_ca.server());
    swap_symlink(&data, &v3);
    assert_eq!(
        server.next_tls_reload().await,
        TlsReload::Applied { generation: 2 }
    );
    grpc_check(server.grpc, &new_ca.pem(), None, "a")
        .await
        .unwrap();
    server.stop().await;
}

fn start_error(flags: &[&str]) -> TlsError {
    let args = args(flags);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match runtime.block_on(Server::build(&args)) {
        Err(StartError::Tls(error)) => error,
        Err(other) => panic!("{flags:?}: {other}"),
        Ok(_) => panic!("{flags:?}: started"),
    }
}

#[test]
fn bad_startup_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let (cert, key) = write_leaf(dir.path(), &ca.server());
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (_, other_key) = write_leaf(&other, &ca.server());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello, not PEM\n").unwrap();
    let broken = dir.path().join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.pem");
    // Past the size a certificate file may have (a path to a device that never ends, say).
    let huge = dir.path().join("huge.pem");
    std::fs::write(
        &huge,
        vec![b'-'; usize::try_from(distlimit_serve::MAX_TLS_FILE_BYTES).unwrap() + 1],
    )
    .unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let (cert_s, key_s) = (s(&cert), s(&key));

    let cases: Vec<(Vec<String>, &Path, &str)> = vec![
        (vec![s(&missing), key_s.clone()], &missing, "cannot read"),
        (
            vec![s(&huge), key_s.clone()],
            &huge,
            "larger than 1048576 bytes",
        ),
        (vec![cert_s.clone(), s(&missing)], &missing, "cannot read"),
        (
            vec![s(&garbage), key_s.clone()],
            &garbage,
            "no PEM certificate",
        ),
        (vec![s(&broken), key_s.clone()], &broken, "not a valid PEM"),
        (
            vec![cert_s.clone(), s(&garbage)],
            &garbage,
            "no PEM private key",
        ),
        // A certificate where the key should be.
        (
            vec![cert_s.clone(), cert_s.clone()],
            &cert,
            "no PEM private key",
        ),
        (
            vec![cert_s.clone(), s(&other_key)],
            &other_key,
            "does not match",
        ),
    ];
    for (files, path, expected) in cases {
        let error = start_error(&["--tls-cert", &files[0], "--tls-key", &files[1]]);
        assert_eq!(error.path(), Some(path), "{error}");
        let message = error.to_string();
        assert!(message.contains(path.to_str().unwrap()), "{message}");
        assert!(message.contains(expected), "{message}");
    }
    // A client CA file without a certificate (a key only).
    let error = start_error(&[
        "--tls-cert",
        &cert_s,
        "--tls-key",
        &key_s,
        "--tls-client-ca",
        &key_s,
    ]);
    assert_eq!(error.path(), Some(key.as_path()));
    assert!(error.to_string().contains("no PEM certificate"), "{error}");

    // The flags go together.
    assert!(Args::try_parse_from(["distlimit-server", "--tls-cert", &cert_s]).is_err());
    assert!(Args::try_parse_from(["distlimit-server", "--tls-key", &key_s]).is_err());
    assert!(Args::try_parse_from(["distlimit-server", "--tls-client-ca", &cert_s]).is_err());

    // The binary exits with 1 and says which file.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--tls-cert", &cert_s, "--tls-key", &s(&other_key)])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(other_key.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("does not match"), "{stderr}");
}
