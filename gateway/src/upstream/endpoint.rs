//! Base URLs of providers and custom hosts.

use http::Uri;

use plugin_sdk::GatewayError;

/// A parsed `http(s)://host[:port][/base/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The path prefix, without a trailing slash (`/v1`, or empty).
    pub base_path: String,
    /// The `Host` header value, computed once.
    authority: String,
}

impl Endpoint {
    /// Parses a base URL; anything but an absolute http(s) URL without query is refused.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("{url:?} must start with http:// or https://")),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{url:?} has no host"))?;
        if uri.query().is_some() {
            return Err(format!("{url:?} must not have a query"));
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Endpoint {
            authority: authority(&host, port, tls),
            tls,
            port,
            host,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// Parses a client-supplied URL; a bad one is a 400 naming the header or field.
    pub fn parse_param(url: &str, param: &str) -> Result<Endpoint, GatewayError> {
        Endpoint::parse(url).map_err(|e| GatewayError::invalid_param(param, e))
    }

    /// The `Host` header value.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The request target for a path below the base path (`/chat/completions`) and a query.
    pub fn path_and_query(&self, suffix: &str, query: Option<&str>) -> String {
        let mut out = String::with_capacity(self.base_path.len() + suffix.len() + 16);
        out.push_str(&self.base_path);
        out.push_str(suffix);
        if out.is_empty() {
            out.push('/');
        }
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            out.push('?');
            out.push_str(q);
        }
        out
    }
}

fn authority(host: &str, port: u16, tls: bool) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    if port == if tls { 443 } else { 80 } {
        host
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_base_urls() {
        let e = Endpoint::parse("https://api.groq.com/openai/v1/").unwrap();
        assert_eq!(
            (e.tls, e.host.as_str(), e.port, e.base_path.as_str()),
            (true, "api.groq.com", 443, "/openai/v1")
        );
        assert_eq!(e.authority(), "api.groq.com");
        assert_eq!(
            e.path_and_query("/chat/completions", Some("a=1")),
            "/openai/v1/chat/completions?a=1"
        );
        let e = Endpoint::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!((e.port, e.base_path.as_str()), (9000, ""));
        assert_eq!(e.authority(), "127.0.0.1:9000");
        assert_eq!(e.path_and_query("", None), "/");
        let e = Endpoint::parse("http://[::1]:8080/v1").unwrap();
        assert_eq!(e.host, "::1");
        assert_eq!(e.authority(), "[::1]:8080");
    }

    #[test]
    fn refuses_what_is_not_an_http_url() {
        for bad in [
            "",
            "localhost:80",
            "ftp://x/y",
            "http://",
            "http://h/v1?x=1",
            "not a url",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        let err = Endpoint::parse_param("nope", "x-gw-custom-host").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-custom-host"));
    }
}
