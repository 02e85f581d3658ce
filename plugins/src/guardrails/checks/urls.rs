//! `default.validUrls` `{onlyDNS = false}`: passes when every `http(s)://` URL in the text is
//! valid. A text without URLs passes.
//!
//! A URL is valid when it parses and its host answers: with `onlyDNS`, when the host name
//! resolves; otherwise when a `HEAD` request to it gets an answer below 400 (or 405, a server
//! that exists but refuses `HEAD`), redirects not followed. Each lookup or request has 3 s; at
//! most 20 distinct URLs of a text are checked (all at once), the rest reported unchecked.
//! This check calls the network, so it does not run on streamed answers.

use std::time::Duration;

use futures_util::future::join_all;
use regex::Regex;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::OnceLock;

use plugin_sdk::ConfigIssue;

use super::{params, Outcome};
use crate::guardrails::net::Net;

/// The most URLs checked in one text.
const MAX_URLS: usize = 20;
/// How long one URL may take.
const URL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug)]
pub struct ValidUrls {
    only_dns: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlParams {
    #[serde(default, rename = "onlyDNS")]
    only_dns: bool,
}

/// The distinct URLs of a text, trailing punctuation removed.
pub fn urls_in(text: &str) -> Vec<String> {
    static URL: OnceLock<Regex> = OnceLock::new();
    let regex = URL.get_or_init(|| {
        Regex::new(r#"(?i)\bhttps?://[^\s<>"'`]+"#).unwrap_or_else(|e| panic!("{e}"))
    });
    let mut out: Vec<String> = Vec::new();
    for m in regex.find_iter(text) {
        let mut url = m.as_str();
        // A sentence's punctuation and a closing bracket around the URL are not part of it.
        loop {
            let trimmed = url.trim_end_matches(['.', ',', ';', ':', '!', '?', '*']);
            let unbalanced = (trimmed.ends_with(')') && !trimmed.contains('('))
                || (trimmed.ends_with(']') && !trimmed.contains('['));
            let trimmed = if unbalanced {
                &trimmed[..trimmed.len() - 1]
            } else {
                trimmed
            };
            if trimmed.len() == url.len() {
                break;
            }
            url = trimmed;
        }
        if !out.iter().any(|u| u == url) {
            out.push(url.to_owned());
        }
    }
    out
}

impl ValidUrls {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: UrlParams = params(p)?;
        Ok(ValidUrls {
            only_dns: p.only_dns,
        })
    }

    pub async fn run(&self, text: &str, net: &Net) -> Outcome {
        let mut urls = urls_in(text);
        let unchecked = urls.split_off(urls.len().min(MAX_URLS));
        let checks = urls.iter().map(|u| self.check_one(u, net));
        let results = join_all(checks).await;
        let (mut valid, mut invalid) = (Vec::new(), Vec::new());
        for (url, ok) in urls.into_iter().zip(results) {
            if ok {
                valid.push(url);
            } else {
                invalid.push(url);
            }
        }
        Outcome::of(
            invalid.is_empty(),
            json!({
                "onlyDNS": self.only_dns,
                "validUrls": valid,
                "invalidUrls": invalid,
                "uncheckedUrls": unchecked,
            }),
        )
    }

    async fn check_one(&self, url: &str, net: &Net) -> bool {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return false;
        };
        let Some(host) = parsed.host_str().map(str::to_owned) else {
            return false;
        };
        if self.only_dns {
            let port = parsed.port_or_known_default().unwrap_or(80);
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let lookup = tokio::net::lookup_host((host, port));
            return match tokio::time::timeout(URL_TIMEOUT, lookup).await {
                Ok(Ok(mut addrs)) => addrs.next().is_some(),
                _ => false,
            };
        }
        // A URL the egress policy refuses is not probed, and counts as invalid.
        if net.allows(&parsed).is_err() {
            return false;
        }
        match net.http.head(parsed).timeout(URL_TIMEOUT).send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                status < 400 || status == 405
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_found_without_their_punctuation() {
        assert_eq!(
            urls_in(
                "See https://a.example/x?y=1. Or (http://b.example/path), [https://c.example]!"
            ),
            vec![
                "https://a.example/x?y=1",
                "http://b.example/path",
                "https://c.example"
            ]
        );
        assert_eq!(
            urls_in("https://en.wikipedia.org/wiki/Rust_(language) twice https://en.wikipedia.org/wiki/Rust_(language)"),
            vec!["https://en.wikipedia.org/wiki/Rust_(language)"]
        );
        assert!(urls_in("no links, ftp://x.example").is_empty());
    }

    #[tokio::test]
    async fn hosts_that_answer_are_valid() {
        // The test's server is on loopback: trusted here, as an operator would trust it.
        let trusted = plugin_sdk::egress::parse_list("127.0.0.1").unwrap();
        let http = Net::new(plugin_sdk::egress::EgressPolicy::new(trusted)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 4096];
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let status = if head.starts_with("HEAD /missing") {
                        "404 Not Found"
                    } else {
                        "200 OK"
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let check = ValidUrls { only_dns: false };
        let text = format!("ok http://{addr}/page and http://{addr}/page.");
        let out = check.run(&text, &http).await;
        assert!(out.verdict, "{}", out.data);
        let text = format!("bad http://{addr}/missing and http://127.0.0.1:1/closed");
        let out = check.run(&text, &http).await;
        assert!(!out.verdict);
        assert_eq!(out.data["invalidUrls"].as_array().unwrap().len(), 2);
        assert!(check.run("no urls", &http).await.verdict);

        let dns = ValidUrls { only_dns: true };
        assert!(dns.run("http://localhost:1/x", &http).await.verdict);
        // Without trust, a loopback URL is not probed: it is invalid.
        let untrusted = Net::new(plugin_sdk::egress::EgressPolicy::default()).unwrap();
        let out = check.run(&format!("http://{addr}/page"), &untrusted).await;
        assert!(!out.verdict, "{}", out.data);
        assert!(
            !dns.run("http://no-such-host.invalid/x", &http)
                .await
                .verdict
        );
    }
}
