//! AWS Signature Version 4 (`AWS4-HMAC-SHA256`), by hand over `ring`'s HMAC-SHA256 and SHA-256.
//!
//! Runs last on every Bedrock request ([`super::sign`]), after the plugins, over the final
//! method, URL, headers and body:
//! - canonical URI: every path segment URI-encoded once more over the path as sent (the rule of
//!   every service but S3), so a model id sent as `...-v1%3A0` is signed as `...-v1%253A0`;
//!   the path is not normalised (the gateway's paths have no `.`, `..` or empty segments);
//! - canonical query: parameters percent-decoded, re-encoded keeping only RFC 3986's unreserved
//!   characters, sorted by name then value;
//! - signed headers: `host` (the URL's authority, which is the Host the gateway sends) and every
//!   header of the request but `authorization`, names lower-case and sorted, values trimmed with
//!   inner runs of spaces collapsed, repeated headers joined with `,`.

use std::fmt::Write as _;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::HeaderMap;
use ring::{digest, hmac};

use plugin_sdk::plugin::UpstreamRequest;
use plugin_sdk::GatewayError;

/// The signing algorithm, first word of the string to sign and of `authorization`.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Who signs, and the scope the signature is good for.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    pub access_key_id: &'a str,
    pub secret_access_key: &'a str,
    /// Temporary credentials' token, sent (and signed) as `x-amz-security-token`.
    pub session_token: Option<&'a str>,
    pub region: &'a str,
    /// `bedrock` for Bedrock's runtime API.
    pub service: &'a str,
}

/// Every step of one signature: what AWS's test suite publishes for each case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub canonical_request: String,
    pub string_to_sign: String,
    /// Lower-case hex of the final HMAC.
    pub signature: String,
    /// The value of the `authorization` header.
    pub authorization: String,
}

/// Signs `request` as of `unix_secs`: sets `x-amz-date`, `x-amz-content-sha256`,
/// `x-amz-security-token` (when the credentials have a session token) and `authorization`.
pub fn sign_at(
    creds: &Credentials<'_>,
    request: &mut UpstreamRequest,
    unix_secs: u64,
) -> Result<(), GatewayError> {
    let date = amz_date(unix_secs);
    let payload_hash = hex(digest::digest(&digest::SHA256, &request.body).as_ref());
    let headers = &mut request.headers;
    // A stale credential (a plugin's, or an earlier attempt's) must not survive the re-sign.
    headers.remove(AUTHORIZATION);
    headers.insert(
        HeaderName::from_static("x-amz-date"),
        HeaderValue::from_str(&date).map_err(|e| GatewayError::internal(e.to_string()))?,
    );
    headers.insert(
        HeaderName::from_static("x-amz-content-sha256"),
        HeaderValue::from_str(&payload_hash).map_err(|e| GatewayError::internal(e.to_string()))?,
    );
    let token_header = HeaderName::from_static("x-amz-security-token");
    match creds.session_token {
        Some(token) => {
            let value = HeaderValue::from_str(token).map_err(|_| {
                GatewayError::invalid_param(
                    "x-gw-aws-session-token",
                    "the AWS session token has characters a header cannot carry",
                )
            })?;
            headers.insert(token_header, value);
        }
        None => {
            headers.remove(token_header);
        }
    }
    let method = request.method.as_str().to_owned();
    let signed = signature(
        &method,
        &request.url,
        &request.headers,
        &payload_hash,
        &date,
        creds,
    )
    .map_err(|why| GatewayError::internal(format!("cannot sign the bedrock request: {why}")))?;
    let value = HeaderValue::from_str(&signed.authorization).map_err(|_| {
        GatewayError::invalid_param(
            "x-gw-aws-access-key-id",
            "the AWS access key id has characters a header cannot carry",
        )
    })?;
    request.headers.insert(AUTHORIZATION, value);
    Ok(())
}

/// The signature of a request whose `headers` already hold everything to be signed
/// (`x-amz-date` included); `payload_hash` is the lower-case hex SHA-256 of the body and
/// `amz_date` the request time as `YYYYMMDDTHHMMSSZ`.
pub fn signature(
    method: &str,
    url: &str,
    headers: &HeaderMap,
    payload_hash: &str,
    amz_date: &str,
    creds: &Credentials<'_>,
) -> Result<Signature, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("the URL {url:?} does not parse: {e}"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| format!("the URL {url:?} has no host"))?;
    let host = authority
        .as_str()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_owned();

    let mut signed: Vec<(String, String)> = vec![("host".to_owned(), host)];
    for name in headers.keys() {
        if name == AUTHORIZATION || name.as_str() == "host" {
            continue;
        }
        let values: Vec<String> = headers
            .get_all(name)
            .iter()
            .map(|v| collapse_spaces(&String::from_utf8_lossy(v.as_bytes())))
            .collect();
        signed.push((name.as_str().to_owned(), values.join(",")));
    }
    signed.sort();
    let signed_headers = signed
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");

    let mut canonical_request = String::new();
    canonical_request.push_str(method);
    canonical_request.push('\n');
    canonical_request.push_str(&canonical_uri(uri.path()));
    canonical_request.push('\n');
    canonical_request.push_str(&canonical_query(uri.query().unwrap_or_default()));
    canonical_request.push('\n');
    for (name, value) in &signed {
        let _ = writeln!(canonical_request, "{name}:{value}");
    }
    canonical_request.push('\n');
    canonical_request.push_str(&signed_headers);
    canonical_request.push('\n');
    canonical_request.push_str(payload_hash);

    let day = amz_date.get(..8).ok_or("the amz date is too short")?;
    let scope = format!("{day}/{}/{}/aws4_request", creds.region, creds.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical_request.as_bytes()).as_ref())
    );

    let key = format!("AWS4{}", creds.secret_access_key);
    let k_date = hmac_sha256(key.as_bytes(), day.as_bytes());
    let k_region = hmac_sha256(&k_date, creds.region.as_bytes());
    let k_service = hmac_sha256(&k_region, creds.service.as_bytes());
    let k_signing = hmac_sha256(&k_service, b"aws4_request");
    let signature = hex(&hmac_sha256(&k_signing, string_to_sign.as_bytes()));

    let authorization = format!(
        "{ALGORITHM} Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key_id
    );
    Ok(Signature {
        canonical_request,
        string_to_sign,
        signature,
        authorization,
    })
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, data).as_ref().to_vec()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// A header value trimmed, with every run of whitespace inside it turned into one space.
fn collapse_spaces(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Appends `bytes` URI-encoded: RFC 3986's unreserved characters as they are, every other
/// byte as `%XX` (upper-case hex).
pub fn uri_encode(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// The path as sent, each segment encoded once more (`%` becomes `%25`).
fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(path.len() + 16);
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        uri_encode(segment.as_bytes(), &mut out);
    }
    out
}

/// The query's parameters decoded, re-encoded and sorted; a parameter without `=` has an
/// empty value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            let mut n = String::new();
            uri_encode(&percent_decode(name), &mut n);
            let mut v = String::new();
            uri_encode(&percent_decode(value), &mut v);
            (n, v)
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `%XX` sequences decoded; a `%` not followed by two hex digits is kept as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex_at = |j: usize| bytes.get(j).and_then(|c| char::from(*c).to_digit(16));
        match (bytes[i], hex_at(i + 1), hex_at(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                // Two hex digits make at most 0xff.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` (UTC) for seconds since the Unix epoch.
pub fn amz_date(unix_secs: u64) -> String {
    let (year, month, day) = civil_date(unix_secs / 86_400);
    let secs = unix_secs % 86_400;
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn is_leap(year: u64) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

/// The Gregorian (year, month, day) of a day counted from 1970-01-01.
fn civil_date(mut days: u64) -> (u64, u64, u64) {
    // Whole 400-year cycles (146097 days each) first, so the year loop stays short.
    let mut year = 1970 + days / 146_097 * 400;
    days %= 146_097;
    loop {
        let length = if is_leap(year) { 366 } else { 365 };
        if days < length {
            break;
        }
        days -= length;
        year += 1;
    }
    let february = if is_leap(year) { 29 } else { 28 };
    let months = [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 1;
    for length in months {
        if days < length {
            break;
        }
        days -= length;
        month += 1;
    }
    (year, month, days + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    /// The credentials and scope of AWS's published Signature Version 4 test suite.
    const SUITE: Credentials<'static> = Credentials {
        access_key_id: "AKIDEXAMPLE",
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        session_token: None,
        region: "us-east-1",
        service: "service",
    };
    const SUITE_DATE: &str = "20150830T123600Z";
    const EMPTY_HASH: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const SUITE_TOKEN: &str = "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";

    fn suite_case(method: &str, path_and_query: &str, extra: &[(&str, &str)]) -> Signature {
        let mut headers = HeaderMap::new();
        for (name, value) in extra {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers.insert("x-amz-date", HeaderValue::from_static(SUITE_DATE));
        let url = format!("https://example.amazonaws.com{path_and_query}");
        let body_hash = if method == "POST" && extra.iter().any(|(n, _)| *n == "content-type") {
            // The form-urlencoded cases' body is `Param1=value1`.
            hex(digest::digest(&digest::SHA256, b"Param1=value1").as_ref())
        } else {
            EMPTY_HASH.to_owned()
        };
        signature(method, &url, &headers, &body_hash, SUITE_DATE, &SUITE).unwrap()
    }

    fn assert_case(got: &Signature, creq: &str, sts_hash: &str, signed_headers: &str, sig: &str) {
        assert_eq!(got.canonical_request, creq);
        assert_eq!(
            got.string_to_sign,
            format!("AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n{sts_hash}")
        );
        assert_eq!(got.signature, sig);
        assert_eq!(
            got.authorization,
            format!("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders={signed_headers}, Signature={sig}")
        );
    }

    #[test]
    fn suite_get_vanilla() {
        let got = suite_case("GET", "/", &[]);
        assert_case(
            &got,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63",
            "host;x-amz-date",
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        );
    }

    #[test]
    fn suite_get_vanilla_query_order_key_case() {
        let got = suite_case("GET", "/?Param2=value2&Param1=value1", &[]);
        assert_case(
            &got,
            "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0",
            "host;x-amz-date",
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        );
    }

    #[test]
    fn suite_get_vanilla_query_order_value() {
        let got = suite_case("GET", "/?Param1=value2&Param1=value1", &[]);
        assert_case(
            &got,
            "GET\n/\nParam1=value1&Param1=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "c968629d70850097a2d8781c9bf7edcb988b04cac14cca9be4acc3595f884606",
            "host;x-amz-date",
            "5772eed61e12b33fae39ee5e7012498b51d56abc0abb7c60486157bd471c4694",
        );
    }

    #[test]
    fn suite_get_vanilla_utf8_query() {
        let got = suite_case("GET", "/%E1%88%B4", &[]);
        // A path sent percent-encoded is encoded once more (the suite's get-utf8 case encodes
        // the raw `/ሴ` once, which a URL cannot carry as it is).
        assert!(got.canonical_request.starts_with("GET\n/%25E1%2588%25B4\n"));
        let got = suite_case("GET", "/?%E1%88%B4=bar", &[]);
        assert_case(
            &got,
            "GET\n/\n%E1%88%B4=bar\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "eb30c5bed55734080471a834cc727ae56beb50e5f39d1bff6d0d38cb192a7073",
            "host;x-amz-date",
            "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04",
        );
    }

    #[test]
    fn suite_get_vanilla_query_unreserved() {
        let unreserved = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let got = suite_case("GET", &format!("/?{unreserved}={unreserved}"), &[]);
        assert_case(
            &got,
            &format!("GET\n/\n{unreserved}={unreserved}\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            "c30d4703d9f799439be92736156d47ccfb2d879ddf56f5befa6d1d6aab979177",
            "host;x-amz-date",
            "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197",
        );
    }

    #[test]
    fn suite_get_header_value_order_and_trim() {
        let got = suite_case(
            "GET",
            "/",
            &[
                ("my-header1", "value4"),
                ("my-header1", "value1"),
                ("my-header1", "value3"),
                ("my-header1", "value2"),
            ],
        );
        assert_case(
            &got,
            "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value4,value1,value3,value2\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "31ce73cd3f3d9f66977ad3dd957dc47af14df92fcd8509f59b349e9137c58b86",
            "host;my-header1;x-amz-date",
            "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01",
        );
        let got = suite_case(
            "GET",
            "/",
            &[("my-header1", " value1"), ("my-header2", " \"a   b   c\"")],
        );
        assert_case(
            &got,
            "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\nhost;my-header1;my-header2;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "a726db9b0df21c14f559d0a978e563112acb1b9e05476f0a6a1c7d68f28605c7",
            "host;my-header1;my-header2;x-amz-date",
            "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
        );
    }

    #[test]
    fn suite_post_vanilla() {
        let got = suite_case("POST", "/", &[]);
        assert_case(
            &got,
            "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "553f88c9e4d10fc9e109e2aeb65f030801b70c2f6468faca261d401ae622fc87",
            "host;x-amz-date",
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
        );
    }

    #[test]
    fn suite_post_x_www_form_urlencoded() {
        let got = suite_case(
            "POST",
            "/",
            &[("content-type", "application/x-www-form-urlencoded")],
        );
        assert_case(
            &got,
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
            "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281",
            "content-type;host;x-amz-date",
            "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a",
        );
    }

    #[test]
    fn suite_post_sts_token_signed() {
        let got = suite_case("POST", "/", &[("x-amz-security-token", SUITE_TOKEN)]);
        assert_case(
            &got,
            &format!("POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:{SUITE_TOKEN}\n\nhost;x-amz-date;x-amz-security-token\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            "c237e1b440d4c63c32ca95b5b99481081cb7b13c7e40434868e71567c1a882f6",
            "host;x-amz-date;x-amz-security-token",
            "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead",
        );
    }

    #[test]
    fn amz_dates_follow_the_calendar() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_440_938_160), "20150830T123600Z");
        assert_eq!(amz_date(951_868_799), "20000229T235959Z");
        assert_eq!(amz_date(951_868_800), "20000301T000000Z");
        assert_eq!(amz_date(1_735_689_599), "20241231T235959Z");
        assert_eq!(amz_date(1_735_689_600), "20250101T000000Z");
        // 2100 is not a leap year: February 28 is followed by March 1.
        assert_eq!(amz_date(4_107_542_400 - 1), "21000228T235959Z");
        assert_eq!(amz_date(4_107_542_400), "21000301T000000Z");
        // Past one 400-year cycle.
        assert_eq!(civil_date(146_097), (2370, 1, 1));
    }

    #[test]
    fn encoding_helpers() {
        let mut out = String::new();
        uri_encode(b"a b:c/~%", &mut out);
        assert_eq!(out, "a%20b%3Ac%2F~%25");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("/model/a%3A0/x y"), "/model/a%253A0/x%20y");
        assert_eq!(canonical_query("b=2&a&a=%7e&c=x%zz"), "a=&a=~&b=2&c=x%25zz");
        assert_eq!(hex(&[0, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    fn request(url: &str, body: &'static [u8]) -> UpstreamRequest {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("authorization", HeaderValue::from_static("Bearer stale"));
        UpstreamRequest {
            method: Method::POST,
            url: url.to_owned(),
            headers,
            body: bytes::Bytes::from_static(body),
        }
    }

    #[test]
    fn signing_sets_the_amz_headers_and_replaces_authorization() {
        let mut req = request(
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse",
            b"{}",
        );
        let creds = Credentials {
            session_token: Some("TOKEN"),
            service: "bedrock",
            ..SUITE
        };
        sign_at(&creds, &mut req, 1_440_938_160).unwrap();
        let h = &req.headers;
        assert_eq!(h["x-amz-date"], "20150830T123600Z");
        let body_hash = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
        assert_eq!(h["x-amz-content-sha256"], body_hash);
        assert_eq!(h["x-amz-security-token"], "TOKEN");
        assert_eq!(h.get_all("authorization").iter().count(), 1);
        let auth = h["authorization"].to_str().unwrap();
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature="
        ), "{auth}");

        // The same signature, step by step: the model id's `%3A` is encoded once more.
        let again = signature("POST", &req.url, h, body_hash, "20150830T123600Z", &creds).unwrap();
        assert_eq!(
            again.canonical_request,
            format!(
                "POST\n/model/anthropic.claude-3-5-sonnet-20240620-v1%253A0/converse\n\n\
                 content-type:application/json\nhost:bedrock-runtime.us-east-1.amazonaws.com\n\
                 x-amz-content-sha256:{body_hash}\nx-amz-date:20150830T123600Z\nx-amz-security-token:TOKEN\n\n\
                 content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token\n{body_hash}"
            )
        );
        assert_eq!(auth, again.authorization);

        // Without a session token no token header is sent or signed.
        let mut req = request(
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke",
            b"{}",
        );
        let creds = Credentials {
            service: "bedrock",
            ..SUITE
        };
        sign_at(&creds, &mut req, 1_440_938_160).unwrap();
        assert!(req.headers.get("x-amz-security-token").is_none());
        assert!(req.headers["authorization"]
            .to_str()
            .unwrap()
            .contains("SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date, "));
    }

    #[test]
    fn a_url_with_a_port_signs_that_authority() {
        let headers = HeaderMap::new();
        let got = signature(
            "GET",
            "http://127.0.0.1:9000/x",
            &headers,
            EMPTY_HASH,
            SUITE_DATE,
            &SUITE,
        )
        .unwrap();
        assert!(got.canonical_request.contains("\nhost:127.0.0.1:9000\n"));
        assert!(signature("GET", "not a url", &headers, EMPTY_HASH, SUITE_DATE, &SUITE).is_err());
    }
}
