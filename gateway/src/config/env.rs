//! `${VAR}` and `${VAR:-default}` in string values of the config file.

use serde_json::Value;

use plugin_sdk::ConfigIssue;

/// Expands variables in every string of `value`; an unset variable without a default is an
/// issue at its path.
pub fn expand(value: &mut Value, path: &str, issues: &mut Vec<ConfigIssue>) {
    match value {
        Value::String(s) if s.contains("${") => match expand_str(s) {
            Ok(expanded) => *value = typed(s, expanded),
            Err(message) => issues.push(ConfigIssue::new(path, message)),
        },
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand(item, &format!("{path}[{i}]"), issues);
            }
        }
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand(v, &child, issues);
            }
        }
        _ => {}
    }
}

/// A value that is one whole `${...}` takes the type its text has (`threads: ${THREADS}` is a
/// number); anything else stays a string.
fn typed(original: &str, expanded: String) -> Value {
    let whole = original.starts_with("${") && original.find('}') == Some(original.len() - 1);
    if whole {
        if let Ok(n) = expanded.parse::<u64>() {
            return Value::from(n);
        }
        if let Ok(n) = expanded.parse::<i64>() {
            return Value::from(n);
        }
        if let Ok(b) = expanded.parse::<bool>() {
            return Value::Bool(b);
        }
    }
    Value::String(expanded)
}

fn expand_str(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
        let expr = &after[..end];
        let (name, default) = match expr.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (expr, None),
        };
        match (std::env::var(name), default) {
            (Ok(v), _) if !v.is_empty() || default.is_none() => out.push_str(&v),
            (_, Some(d)) => out.push_str(d),
            (Err(_), None) => {
                return Err(format!(
                    "environment variable {name} is not set (write ${{{name}:-}} to allow that)"
                ))
            }
            (Ok(v), None) => out.push_str(&v),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_with_defaults_and_reports_missing() {
        // PATH is set in every test environment; the other name is not.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand_str("a${PATH}b").unwrap(), format!("a{path}b"));
        assert_eq!(expand_str("${GW_SURELY_UNSET_VAR:-x}").unwrap(), "x");
        assert_eq!(expand_str("${GW_SURELY_UNSET_VAR:-}").unwrap(), "");
        assert!(expand_str("${GW_SURELY_UNSET_VAR}").is_err());
        assert!(expand_str("${oops").is_err());
        let mut v = serde_json::json!({"a": "${GW_SURELY_UNSET_VAR:-8}", "b": "x${GW_SURELY_UNSET_VAR:-8}", "c": "${GW_SURELY_UNSET_VAR:-true}"});
        let mut issues = Vec::new();
        expand(&mut v, "", &mut issues);
        assert_eq!(v, serde_json::json!({"a": 8, "b": "x8", "c": true}));
        let mut v = serde_json::json!({"providers": [{"api_key": "${GW_SURELY_UNSET_VAR}"}]});
        let mut issues = Vec::new();
        expand(&mut v, "", &mut issues);
        assert_eq!(issues[0].path, "providers[0].api_key");
    }
}
