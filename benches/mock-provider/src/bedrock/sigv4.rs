//! AWS Signature Version 4 (`AWS4-HMAC-SHA256`), written from the published
//! algorithm: the canonical request, the string to sign, the derived
//! signing key and the signature.
//!
//! The mock's Bedrock routes verify every request with it; the same
//! functions are public so tests can sign requests (see [`sign`]). They
//! follow the rules of services other than S3: the canonical URI is the
//! path as it travels, with each segment URI-encoded once more (so a model
//! id sent as `anthropic.claude-v2%3A1` is `anthropic.claude-v2%253A1` in the
//! canonical URI), and the payload is always hashed.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Method, Uri};
use ring::{digest, hmac};

/// The only algorithm SigV4 defines.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// Last element of every credential scope.
pub const TERMINATOR: &str = "aws4_request";
/// How far `x-amz-date` may be from the mock's clock, either way.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(15 * 60);

const SECONDS_PER_DAY: u64 = 86_400;

/// Lower-case hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The bytes of hex `text`; `None` if it is not hex (an odd length
/// included: the last pair is cut short).
fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Appends `bytes` URI-encoded the SigV4 way: the unreserved characters
/// `A-Z a-z 0-9 - _ . ~` stay, every other byte becomes `%XX` (upper-case
/// hex), `/` included.
fn uri_encode_into(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// `bytes` URI-encoded the SigV4 way (see [`canonical_uri`]).
pub fn uri_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    uri_encode_into(&mut out, bytes);
    out
}

/// Decodes `%XX` escapes; malformed escapes stay as they are.
pub(crate) fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let digit = |b: u8| char::from(b).to_digit(16);
            if let (Some(hi), Some(lo)) = (digit(bytes[i + 1]), digit(bytes[i + 2])) {
                // Two hex digits make at most 255.
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// The canonical URI of a request whose path, as it travels, is `path`:
/// every `/`-separated segment URI-encoded (again), `/` for an empty path.
/// Non-S3 services encode the already encoded path a second time.
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(path.len() + 16);
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        uri_encode_into(&mut out, segment.as_bytes());
    }
    out
}

/// The canonical query string of the raw query `query` (without `?`):
/// each `name=value` pair decoded and URI-encoded again, sorted by name
/// and then value, joined by `&`. A pair without `=` has an empty value.
pub fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (
                uri_encode(&percent_decode(name)),
                uri_encode(&percent_decode(value)),
            )
        })
        .collect();
    pairs.sort();
    let mut out = String::with_capacity(query.len() + 8);
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(value);
    }
    out
}

/// The canonical value of a header sent with `values` (one per occurrence):
/// each trimmed, inner runs of spaces collapsed to one, joined by `,`.
pub fn canonical_header_value<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for (i, value) in values.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, word) in value.split(' ').filter(|w| !w.is_empty()).enumerate() {
            if j > 0 {
                out.push(' ');
            }
            out.push_str(word.trim_matches(|c: char| c.is_ascii_whitespace()));
        }
    }
    out
}

/// The canonical request:
///
/// ```text
/// METHOD\nCANONICAL_URI\nCANONICAL_QUERY\nname:value\n...\n\nsigned;names\nPAYLOAD_HASH
/// ```
///
/// `headers` are the signed headers, lower-case names with their canonical
/// values ([`canonical_header_value`]), in the order of `SignedHeaders`
/// (sorted by name); `path` and `query` are as they travel.
pub fn canonical_request(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    payload_hash: &str,
) -> String {
    let mut out = String::with_capacity(256);
    out.push_str(method);
    out.push('\n');
    out.push_str(&canonical_uri(path));
    out.push('\n');
    out.push_str(&canonical_query(query));
    out.push('\n');
    for (name, value) in headers {
        out.push_str(name);
        out.push(':');
        out.push_str(value);
        out.push('\n');
    }
    out.push('\n');
    for (i, (name, _)) in headers.iter().enumerate() {
        if i > 0 {
            out.push(';');
        }
        out.push_str(name);
    }
    out.push('\n');
    out.push_str(payload_hash);
    out
}

/// `date/region/service/aws4_request`.
pub fn credential_scope(date: &str, region: &str, service: &str) -> String {
    format!("{date}/{region}/{service}/{TERMINATOR}")
}

/// `AWS4-HMAC-SHA256\nAMZ_DATE\nSCOPE\nhex(sha256(canonical_request))`.
pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    )
}

/// The signing key: HMAC-SHA256 chained over the date, region, service and
/// `aws4_request`, starting from `"AWS4" + secret`.
fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> hmac::Key {
    let mut key = Vec::with_capacity(4 + secret.len());
    key.extend_from_slice(b"AWS4");
    key.extend_from_slice(secret.as_bytes());
    let mut tag = key;
    for part in [date, region, service, TERMINATOR] {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &tag);
        tag = hmac::sign(&k, part.as_bytes()).as_ref().to_vec();
    }
    hmac::Key::new(hmac::HMAC_SHA256, &tag)
}

/// Hex signature of `string_to_sign` under the key derived from `secret`
/// for `date` (`yyyymmdd`), `region` and `service`.
pub fn signature(
    secret: &str,
    date: &str,
    region: &str,
    service: &str,
    string_to_sign: &str,
) -> String {
    let key = signing_key(secret, date, region, service);
    hex(hmac::sign(&key, string_to_sign.as_bytes()).as_ref())
}

/// `yyyymmddThhmmssZ` (ISO 8601 basic format, UTC) of `time`.
pub fn amz_date(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / SECONDS_PER_DAY).unwrap_or(i64::MAX / 2);
    let (year, month, day) = civil_from_days(days);
    let rem = secs % SECONDS_PER_DAY;
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Parses `yyyymmddThhmmssZ` into a time; `None` unless it is exactly that
/// form and a real date.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u64> {
        let part = text.get(range)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    if !(1..=12).contains(&month) || hour > 23 || minute > 59 || second > 59 || year < 1970 {
        return None;
    }
    let days = days_from_civil(year as i64, month as u32, day as u32);
    let secs = u64::try_from(days).ok()? * SECONDS_PER_DAY + hour * 3600 + minute * 60 + second;
    let time = UNIX_EPOCH + Duration::from_secs(secs);
    // Rejects days past the end of the month (Feb 30 would roll over).
    (amz_date(time) == text).then_some(time)
}

/// Year, month, day of the `days`-th day after 1970-01-01 (proleptic
/// Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both are small and positive by construction.
    (year, month as u32, day as u32)
}

/// Days from 1970-01-01 to the given date (inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Credentials for [`sign`].
#[derive(Clone, Copy, Debug)]
pub struct Credentials<'a> {
    pub access_key_id: &'a str,
    pub secret_access_key: &'a str,
    /// Sent, and signed, as `x-amz-security-token`.
    pub session_token: Option<&'a str>,
}

/// A request to [`sign`].
#[derive(Clone, Copy, Debug)]
pub struct Unsigned<'a> {
    pub method: &'a str,
    /// Path and optional `?query`, exactly as they will travel.
    pub path_and_query: &'a str,
    /// Headers to sign; must include `host` with the value that will be
    /// sent. Names in any case.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// Signs `request` for `region` and `service` at `time` and returns the
/// headers to add to it: `x-amz-date`, `x-amz-security-token` (with a
/// session token) and `authorization`. Every header of the request and
/// every added one but `authorization` is signed. Like AWS's SDKs for
/// services other than S3, it sends no `x-amz-content-sha256` (the body's
/// hash is part of the signature either way).
pub fn sign(
    request: &Unsigned<'_>,
    credentials: &Credentials<'_>,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Vec<(String, String)> {
    let amz_date = amz_date(time);
    let payload_hash = sha256_hex(request.body);
    let mut added = vec![("x-amz-date".to_owned(), amz_date.clone())];
    if let Some(token) = credentials.session_token {
        added.push(("x-amz-security-token".to_owned(), token.to_owned()));
    }
    let mut signed: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), (*value).to_owned()))
        .chain(added.iter().cloned())
        .collect();
    signed.sort_by(|a, b| a.0.cmp(&b.0));
    // Repeated names are one canonical header with the values joined.
    let mut canonical: Vec<(String, String)> = Vec::with_capacity(signed.len());
    for (name, value) in signed {
        match canonical.last_mut() {
            Some((last, values)) if *last == name => {
                values.push(',');
                values.push_str(&canonical_header_value([value.as_str()]));
            }
            _ => {
                let value = canonical_header_value([value.as_str()]);
                canonical.push((name, value));
            }
        }
    }
    let pairs: Vec<(&str, &str)> = canonical
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let (path, query) = request
        .path_and_query
        .split_once('?')
        .unwrap_or((request.path_and_query, ""));
    let creq = canonical_request(request.method, path, query, &pairs, &payload_hash);
    let date = &amz_date[..8];
    let scope = credential_scope(date, region, service);
    let sts = string_to_sign(&amz_date, &scope, &creq);
    let sig = signature(credentials.secret_access_key, date, region, service, &sts);
    let names: Vec<&str> = pairs.iter().map(|(n, _)| *n).collect();
    added.push((
        "authorization".to_owned(),
        format!(
            "{ALGORITHM} Credential={}/{scope}, SignedHeaders={}, Signature={sig}",
            credentials.access_key_id,
            names.join(";")
        ),
    ));
    added
}

/// What [`verify`] checks a request against.
pub(crate) struct Expected<'a> {
    pub(crate) access_key_id: &'a str,
    pub(crate) secret_access_key: &'a str,
    pub(crate) service: &'a str,
    /// The clock `x-amz-date` is compared with.
    pub(crate) now: SystemTime,
}

/// What a valid signature tells about the request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verified {
    pub(crate) region: String,
    pub(crate) session_token: Option<String>,
}

/// Why a request is refused, in AWS's terms.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// No `authorization` header: `MissingAuthenticationTokenException`.
    Missing,
    /// A malformed `authorization` header or missing date:
    /// `IncompleteSignatureException`.
    Incomplete(String),
    /// An access key id the mock does not know:
    /// `UnrecognizedClientException`.
    UnknownKey,
    /// Anything else, a wrong signature included:
    /// `InvalidSignatureException`.
    Invalid(String),
}

/// The parts of an `authorization: AWS4-HMAC-SHA256 ...` header.
struct Authorization<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    terminator: &'a str,
    signed_headers: &'a str,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, Rejection> {
    let value = value.trim();
    let (algorithm, params) = value.split_once(' ').unwrap_or((value, ""));
    if algorithm != ALGORITHM {
        return Err(Rejection::Incomplete(format!(
            "Unsupported Authorization Type '{algorithm}'; sign requests with {ALGORITHM} (AWS Signature Version 4)"
        )));
    }
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for param in params.split(',') {
        let param = param.trim();
        let Some((key, val)) = param.split_once('=') else {
            return Err(Rejection::Incomplete(format!(
                "Invalid key=value pair (missing equal-sign) in Authorization header: '{param}'"
            )));
        };
        match key {
            "Credential" => credential = Some(val),
            "SignedHeaders" => signed_headers = Some(val),
            "Signature" => signature = Some(val),
            _ => {}
        }
    }
    let mut missing = String::new();
    for (name, part) in [
        ("Credential", credential),
        ("Signature", signature),
        ("SignedHeaders", signed_headers),
    ] {
        if part.is_none() {
            let _ = write!(
                missing,
                "Authorization header requires '{name}' parameter. "
            );
        }
    }
    let (Some(credential), Some(signed_headers), Some(signature)) =
        (credential, signed_headers, signature)
    else {
        return Err(Rejection::Incomplete(missing.trim_end().to_owned()));
    };
    let parts: Vec<&str> = credential.split('/').collect();
    let [access_key_id, date, region, service, terminator] = parts[..] else {
        return Err(Rejection::Incomplete(format!(
            "Credential '{credential}' is not of the form <access key id>/<yyyymmdd>/<region>/<service>/{TERMINATOR}"
        )));
    };
    Ok(Authorization {
        access_key_id,
        date,
        region,
        service,
        terminator,
        signed_headers,
        signature,
    })
}

/// Checks the SigV4 signature of a request as it arrived: `path` and
/// `query` from `uri` as they traveled, the signed `headers`, the SHA-256
/// of `body`.
pub(crate) fn verify(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    expected: &Expected<'_>,
) -> Result<Verified, Rejection> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Err(Rejection::Missing);
    };
    let value = value
        .to_str()
        .map_err(|_| Rejection::Incomplete("Authorization header is not valid ASCII".to_owned()))?;
    let auth = parse_authorization(value)?;
    if auth.access_key_id != expected.access_key_id {
        return Err(Rejection::UnknownKey);
    }
    if auth.terminator != TERMINATOR {
        return Err(Rejection::Invalid(format!(
            "Credential should be scoped with a valid terminator: '{TERMINATOR}', not '{}'.",
            auth.terminator
        )));
    }
    if auth.service != expected.service {
        return Err(Rejection::Invalid(format!(
            "Credential should be scoped to correct service: '{}'. ",
            expected.service
        )));
    }
    if auth.region.is_empty() {
        return Err(Rejection::Invalid(
            "Credential should be scoped to a valid region. ".to_owned(),
        ));
    }

    let Some(amz_date) = headers.get("x-amz-date") else {
        return Err(Rejection::Incomplete(
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
                .to_owned(),
        ));
    };
    let amz_date = amz_date.to_str().unwrap_or("");
    let Some(signed_at) = parse_amz_date(amz_date) else {
        return Err(Rejection::Incomplete(format!(
            "X-Amz-Date must be in the ISO8601 basic format yyyyMMdd'T'HHmmss'Z', got '{amz_date}'"
        )));
    };
    if auth.date != &amz_date[..8] {
        return Err(Rejection::Invalid(format!(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '{}' != '{}', from '{amz_date}'.",
            auth.date,
            &amz_date[..8]
        )));
    }
    check_clock(signed_at, amz_date, expected.now)?;

    let names: Vec<&str> = auth.signed_headers.split(';').collect();
    if !names.contains(&"host") {
        return Err(Rejection::Invalid(
            "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.".to_owned(),
        ));
    }
    let session_token = match headers.get("x-amz-security-token") {
        None => None,
        Some(_) if !names.contains(&"x-amz-security-token") => return Err(Rejection::Invalid(
            "'x-amz-security-token' is sent but is not a 'SignedHeader' in the AWS Authorization."
                .to_owned(),
        )),
        Some(token) => Some(String::from_utf8_lossy(token.as_bytes()).into_owned()),
    };
    let mut canonical = Vec::with_capacity(names.len());
    for name in &names {
        let values: Vec<String> = headers
            .get_all(*name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        if values.is_empty() {
            return Err(Rejection::Invalid(format!(
                "'{name}' is a 'SignedHeader' in the AWS Authorization but is not in the request."
            )));
        }
        canonical.push((
            *name,
            canonical_header_value(values.iter().map(String::as_str)),
        ));
    }

    let payload_hash = sha256_hex(body);
    if let Some(sent) = headers.get("x-amz-content-sha256") {
        if sent.as_bytes() != payload_hash.as_bytes() {
            return Err(Rejection::Invalid(format!(
                "The provided 'x-amz-content-sha256' header does not match what was computed: '{}' != '{payload_hash}' (the SHA-256 of the body).",
                String::from_utf8_lossy(sent.as_bytes())
            )));
        }
    }

    let pairs: Vec<(&str, &str)> = canonical.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let creq = canonical_request(
        method.as_str(),
        uri.path(),
        uri.query().unwrap_or(""),
        &pairs,
        &payload_hash,
    );
    let scope = credential_scope(auth.date, auth.region, auth.service);
    let sts = string_to_sign(amz_date, &scope, &creq);
    let key = signing_key(
        expected.secret_access_key,
        auth.date,
        auth.region,
        auth.service,
    );
    let matches = auth.signature.len() == 64
        && unhex(auth.signature)
            .is_some_and(|tag| hmac::verify(&key, sts.as_bytes(), &tag).is_ok());
    if !matches {
        return Err(Rejection::Invalid(format!(
            "The request signature we calculated does not match the signature you provided. \
             Check your AWS Secret Access Key and signing method. Consult the service documentation for details.\n\n\
             The Canonical String for this request should have been\n'{creq}'\n\n\
             The String-to-Sign should have been\n'{sts}'\n"
        )));
    }
    Ok(Verified {
        region: auth.region.to_owned(),
        session_token,
    })
}

/// Refuses dates more than [`MAX_CLOCK_SKEW`] away from `now`.
fn check_clock(signed_at: SystemTime, amz_date: &str, now: SystemTime) -> Result<(), Rejection> {
    let skew = MAX_CLOCK_SKEW.as_secs() / 60;
    if signed_at + MAX_CLOCK_SKEW < now {
        return Err(Rejection::Invalid(format!(
            "Signature expired: {amz_date} is now earlier than {} ({} - {skew} min.)",
            self::amz_date(now - MAX_CLOCK_SKEW),
            self::amz_date(now)
        )));
    }
    if signed_at > now + MAX_CLOCK_SKEW {
        return Err(Rejection::Invalid(format!(
            "Signature not yet current: {amz_date} is still later than {} ({} + {skew} min.)",
            self::amz_date(now + MAX_CLOCK_SKEW),
            self::amz_date(now)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // AWS's SigV4 test suite: its credentials, clock, region and service.
    const SUITE_KEY_ID: &str = "AKIDEXAMPLE";
    const SUITE_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const SUITE_DATE: &str = "20150830T123600Z";
    const SUITE_SCOPE: &str = "AKIDEXAMPLE/20150830/us-east-1/service/aws4_request";
    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn suite_time() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_440_938_160)
    }

    fn suite_expected() -> Expected<'static> {
        Expected {
            access_key_id: SUITE_KEY_ID,
            secret_access_key: SUITE_SECRET,
            service: "service",
            now: suite_time(),
        }
    }

    /// A suite request: `host: example.amazonaws.com`, the suite's
    /// `x-amz-date`, and an authorization with `signature`.
    fn suite_request(signature: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("host", "example.amazonaws.com".parse().unwrap());
        headers.insert("x-amz-date", SUITE_DATE.parse().unwrap());
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={SUITE_SCOPE}, SignedHeaders=host;x-amz-date, Signature={signature}"
        );
        headers.insert("authorization", auth.parse().unwrap());
        headers
    }

    fn verify_suite(method: Method, uri: &str, headers: &HeaderMap) -> Result<Verified, Rejection> {
        verify(
            &method,
            &uri.parse().unwrap(),
            headers,
            b"",
            &suite_expected(),
        )
    }

    #[test]
    fn dates_round_trip() {
        assert_eq!(amz_date(suite_time()), SUITE_DATE);
        assert_eq!(parse_amz_date(SUITE_DATE), Some(suite_time()));
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
        let leap = parse_amz_date("20240229T235959Z").unwrap();
        assert_eq!(amz_date(leap + Duration::from_secs(1)), "20240301T000000Z");
        for bad in [
            "20230229T000000Z",
            "20150830T123600",
            "2015-08-30T12:36:00Z",
            "20151330T123600Z",
            "20150830T243600Z",
            "2015083aT123600Z",
        ] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    /// get-vanilla: the canonical request, the string to sign and the
    /// signature the suite publishes.
    #[test]
    fn suite_get_vanilla() {
        let creq = canonical_request(
            "GET",
            "/",
            "",
            &[
                ("host", "example.amazonaws.com"),
                ("x-amz-date", SUITE_DATE),
            ],
            EMPTY_SHA256,
        );
        assert_eq!(
            creq,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let sts = string_to_sign(SUITE_DATE, "20150830/us-east-1/service/aws4_request", &creq);
        assert_eq!(
            sts,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n\
             bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        let sig = "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
        assert_eq!(
            signature(SUITE_SECRET, "20150830", "us-east-1", "service", &sts),
            sig
        );
        let verified = verify_suite(Method::GET, "/", &suite_request(sig));
        assert_eq!(
            verified,
            Ok(Verified {
                region: "us-east-1".to_owned(),
                session_token: None
            })
        );
    }

    /// post-vanilla: same headers, POST, empty body.
    #[test]
    fn suite_post_vanilla() {
        let sig = "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b";
        assert!(verify_suite(Method::POST, "/", &suite_request(sig)).is_ok());
        // The GET signature does not fit a POST.
        let get_sig = "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
        let err = verify_suite(Method::POST, "/", &suite_request(get_sig));
        assert!(
            matches!(&err, Err(Rejection::Invalid(m)) if m.contains("does not match") && m.contains("POST\n/\n")),
            "{err:?}"
        );
    }

    /// get-vanilla-query-order-key-case and get-vanilla-empty-query-key:
    /// the query is sorted and re-encoded.
    #[test]
    fn suite_queries() {
        let sig = "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500";
        assert!(verify_suite(
            Method::GET,
            "/?Param2=value2&Param1=value1",
            &suite_request(sig)
        )
        .is_ok());
        let sig = "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb";
        assert!(verify_suite(Method::GET, "/?Param1=value1", &suite_request(sig)).is_ok());
        assert_eq!(canonical_query("b=2&a=%2f&A=0&c"), "A=0&a=%2F&b=2&c=");
    }

    /// get-utf8: the suite's raw path `/ሴ` has the canonical URI
    /// `/%E1%88%B4`.
    #[test]
    fn suite_utf8_path() {
        assert_eq!(canonical_uri("/\u{1234}"), "/%E1%88%B4");
        let creq = canonical_request(
            "GET",
            "/\u{1234}",
            "",
            &[
                ("host", "example.amazonaws.com"),
                ("x-amz-date", SUITE_DATE),
            ],
            EMPTY_SHA256,
        );
        let sts = string_to_sign(SUITE_DATE, "20150830/us-east-1/service/aws4_request", &creq);
        assert_eq!(
            signature(SUITE_SECRET, "20150830", "us-east-1", "service", &sts),
            "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"
        );
    }

    #[test]
    fn paths_are_encoded_again() {
        assert_eq!(
            canonical_uri("/model/anthropic.claude-v2%3A1/converse"),
            "/model/anthropic.claude-v2%253A1/converse"
        );
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("/a b/c~d"), "/a%20b/c~d");
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex("0aff"), Some(vec![10, 255]));
        assert_eq!(unhex(&hex(&[1, 2, 254])), Some(vec![1, 2, 254]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn header_values_are_trimmed_and_joined() {
        assert_eq!(canonical_header_value(["  a   b  "]), "a b");
        assert_eq!(canonical_header_value(["x", " y "]), "x,y");
    }

    #[test]
    fn rejections() {
        let sig = "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
        let mut headers = suite_request(sig);
        headers.remove("authorization");
        assert_eq!(
            verify_suite(Method::GET, "/", &headers),
            Err(Rejection::Missing)
        );

        let mut headers = suite_request(sig);
        let auth = headers["authorization"]
            .to_str()
            .unwrap()
            .replace("AKIDEXAMPLE", "AKIDOTHER");
        headers.insert("authorization", auth.parse().unwrap());
        assert_eq!(
            verify_suite(Method::GET, "/", &headers),
            Err(Rejection::UnknownKey)
        );

        let mut headers = suite_request(sig);
        headers.insert("authorization", "Bearer abc".parse().unwrap());
        assert!(matches!(
            verify_suite(Method::GET, "/", &headers),
            Err(Rejection::Incomplete(_))
        ));

        // A signed request whose session token rides along unsigned.
        let mut headers = suite_request(sig);
        headers.insert("x-amz-security-token", "tok".parse().unwrap());
        assert!(matches!(
            verify_suite(Method::GET, "/", &headers),
            Err(Rejection::Invalid(m)) if m.contains("x-amz-security-token")
        ));

        // A body hash that is not the body's.
        let mut headers = suite_request(sig);
        headers.insert("x-amz-content-sha256", "UNSIGNED-PAYLOAD".parse().unwrap());
        assert!(matches!(
            verify_suite(Method::GET, "/", &headers),
            Err(Rejection::Invalid(m)) if m.contains("x-amz-content-sha256")
        ));

        // Too old for the mock's clock.
        let late = Expected {
            now: suite_time() + Duration::from_secs(16 * 60),
            ..suite_expected()
        };
        let err = verify(
            &Method::GET,
            &"/".parse().unwrap(),
            &suite_request(sig),
            b"",
            &late,
        );
        assert!(
            matches!(&err, Err(Rejection::Invalid(m)) if m.starts_with("Signature expired")),
            "{err:?}"
        );
    }

    #[test]
    fn signer_output_verifies() {
        let creds = Credentials {
            access_key_id: SUITE_KEY_ID,
            secret_access_key: SUITE_SECRET,
            session_token: Some("session/token"),
        };
        let body = br#"{"messages":[]}"#;
        let path = "/model/anthropic.claude-v2%3A1/converse?b=2&a=1";
        let request = Unsigned {
            method: "POST",
            path_and_query: path,
            headers: &[
                ("Host", "127.0.0.1:9"),
                ("Content-Type", "application/json"),
            ],
            body,
        };
        let added = sign(&request, &creds, "eu-west-3", "bedrock", suite_time());
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:9".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        for (name, value) in &added {
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let expected = Expected {
            service: "bedrock",
            ..suite_expected()
        };
        let uri: Uri = path.parse().unwrap();
        assert_eq!(
            verify(&Method::POST, &uri, &headers, body, &expected),
            Ok(Verified {
                region: "eu-west-3".to_owned(),
                session_token: Some("session/token".to_owned())
            })
        );
        // Any change to the body breaks it.
        assert!(verify(&Method::POST, &uri, &headers, b"{}", &expected).is_err());
        // So does the wrong service.
        let wrong = Expected {
            service: "s3",
            ..expected
        };
        assert!(matches!(
            verify(&Method::POST, &uri, &headers, body, &wrong),
            Err(Rejection::Invalid(m)) if m.contains("correct service")
        ));
    }
}
