//! Query-string lookups for routes that take parameters in the URL
//! (`?alt=sse`, `?key=`, `?api-version=`).

use std::borrow::Cow;

use http::Uri;

/// The value of the first `name` parameter of `uri`'s query, with `+` and
/// `%XX` escapes decoded; `Some("")` for a bare `name` or `name=`.
pub(crate) fn param<'a>(uri: &'a Uri, name: &str) -> Option<Cow<'a, str>> {
    let query = uri.query()?;
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| decode(key) == name)
        .map(|(_, value)| decode(value))
}

/// Decodes `+` as a space and `%XX` escapes; malformed escapes are kept.
fn decode(s: &str) -> Cow<'_, str> {
    if !s.contains(['%', '+']) {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(hi), Some(lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap_or_else(|_| Uri::from_static("/"))
    }

    #[test]
    fn finds_and_decodes_parameters() {
        let u = uri("/x?alt=sse&key=a%2Bb+c&flag&api-version=2024-10-21");
        assert_eq!(param(&u, "alt").as_deref(), Some("sse"));
        assert_eq!(param(&u, "key").as_deref(), Some("a+b c"));
        assert_eq!(param(&u, "flag").as_deref(), Some(""));
        assert_eq!(param(&u, "api-version").as_deref(), Some("2024-10-21"));
        assert_eq!(param(&u, "missing"), None);
        assert_eq!(param(&uri("/x"), "alt"), None);
        assert_eq!(param(&uri("/x?k=%zz%4"), "k").as_deref(), Some("%zz%4"));
    }
}
