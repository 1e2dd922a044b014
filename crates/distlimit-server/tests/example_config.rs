//! The repository's `ratelimit-config/` (the root README's `--config ./ratelimit-config`)
//! loads, and the `curl` of the server README's "Try it" answers OK five times, then
//! OVER_LIMIT.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

async fn post(addr: SocketAddr, body: &str) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/check"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The JSON body of the README's `curl … -d '<body>'`.
fn readme_body() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme
        .find("/v1/check -H 'content-type: application/json'")
        .expect("the curl");
    let rest = &readme[start..];
    let body = &rest[rest.find("-d '").unwrap() + 4..];
    body[..body.find('\'').unwrap()].to_owned()
}

#[tokio::test]
async fn the_example_config_answers_the_readme_curl_ok_then_over_limit() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ratelimit-config");
    let config = config.to_str().unwrap();
    let server = Running::start(&["--config", config]).await;
    let body = readme_body();
    let mut codes = Vec::new();
    for _ in 0..6 {
        let (status, text) = post(server.http, &body).await;
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        codes.push((status, json["overall_code"].as_str().unwrap().to_owned()));
    }
    let expected: Vec<(u16, String)> = [200, 200, 200, 200, 200, 429]
        .into_iter()
        .zip(["OK", "OK", "OK", "OK", "OK", "OVER_LIMIT"])
        .map(|(s, c)| (s, c.to_owned()))
        .collect();
    assert_eq!(codes, expected, "for {body}");
    server.stop().await;
}
