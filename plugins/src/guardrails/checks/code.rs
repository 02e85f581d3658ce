//! `default.containsCode` `{format, not = false}`: passes when the text holds a fenced code
//! block (```` ```lang ````) of the format (with `not`, when it holds none).
//!
//! Formats, as the reference names them: SQL, Python, TypeScript, JavaScript, Java, C#, C++, C,
//! Ruby, PHP, Swift, Kotlin, Go, Rust, Scala, R, Perl, Shell, HTML, CSS, XML, JSON, YAML,
//! Markdown, Dockerfile. A block's language is read from its fence tag (`py`, `python`, `ts`,
//! `sh`, `bash`...); untagged blocks are of no format.

use serde::Deserialize;
use serde_json::{json, Value};

use plugin_sdk::ConfigIssue;

use super::{params, Outcome};

/// Each format and the fence tags that name it (lower case).
const FORMATS: &[(&str, &[&str])] = &[
    (
        "SQL",
        &[
            "sql",
            "mysql",
            "postgresql",
            "psql",
            "sqlite",
            "plsql",
            "tsql",
        ],
    ),
    ("Python", &["py", "python", "python3"]),
    ("TypeScript", &["ts", "typescript", "tsx"]),
    ("JavaScript", &["js", "javascript", "jsx", "node", "mjs"]),
    ("Java", &["java"]),
    ("C#", &["cs", "csharp", "c#"]),
    ("C++", &["cpp", "c++", "cxx", "cc", "hpp"]),
    ("C", &["c", "h"]),
    ("Ruby", &["rb", "ruby"]),
    ("PHP", &["php"]),
    ("Swift", &["swift"]),
    ("Kotlin", &["kt", "kotlin", "kts"]),
    ("Go", &["go", "golang"]),
    ("Rust", &["rs", "rust"]),
    ("Scala", &["scala", "sc"]),
    ("R", &["r"]),
    ("Perl", &["pl", "perl"]),
    (
        "Shell",
        &["sh", "shell", "bash", "zsh", "console", "shellscript"],
    ),
    ("HTML", &["html", "htm"]),
    ("CSS", &["css"]),
    ("XML", &["xml"]),
    ("JSON", &["json", "jsonc"]),
    ("YAML", &["yml", "yaml"]),
    ("Markdown", &["md", "markdown"]),
    ("Dockerfile", &["dockerfile", "docker"]),
];

#[derive(Debug)]
pub struct ContainsCode {
    format: &'static str,
    not: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeParams {
    format: String,
    #[serde(default)]
    not: bool,
}

impl ContainsCode {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: CodeParams = params(p)?;
        let format = FORMATS
            .iter()
            .map(|(name, _)| *name)
            .find(|name| name.eq_ignore_ascii_case(&p.format))
            .ok_or_else(|| {
                let names: Vec<_> = FORMATS.iter().map(|(n, _)| *n).collect();
                ConfigIssue::new(
                    "format",
                    format!("unknown format {:?}; one of {}", p.format, names.join(", ")),
                )
            })?;
        Ok(ContainsCode { format, not: p.not })
    }

    pub fn run(&self, text: &str) -> Outcome {
        let found = formats_in(text);
        let has = found.contains(&self.format);
        Outcome::of(
            has != self.not,
            json!({
                "format": self.format,
                "not": self.not,
                "formatsFound": found,
                "explanation": if has {
                    "the text holds a code block of this format"
                } else {
                    "the text holds no code block of this format"
                },
            }),
        )
    }

    /// With `not`, a complete block of the format in the beginning of a text is final.
    pub fn run_partial(&self, text: &str) -> Option<Outcome> {
        (self.not && formats_in(text).contains(&self.format)).then(|| self.run(text))
    }
}

/// The formats of the complete fenced blocks of a text, in order, without repeats.
fn formats_in(text: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(line_end) = after.find('\n') else {
            break;
        };
        let tag = after[..line_end]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_start_matches('{')
            .trim_start_matches('.')
            .to_ascii_lowercase();
        let body = &after[line_end + 1..];
        let Some(end) = body.find("```") else {
            break;
        };
        if let Some((name, _)) = FORMATS
            .iter()
            .find(|(_, tags)| tags.contains(&tag.as_str()))
        {
            if !out.contains(name) {
                out.push(*name);
            }
        }
        rest = &body[end + 3..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    const ANSWER: &str =
        "Try this:\n```sql\nSELECT * FROM users;\n```\nand\n```py\nprint(1)\n```\n";

    #[test]
    fn fenced_blocks_by_tag() {
        assert_eq!(formats_in(ANSWER), vec!["SQL", "Python"]);
        assert!(formats_in("```\nuntagged\n```").is_empty());
        assert!(formats_in("```sql\nunclosed").is_empty());
        let c = parse("default.containsCode", json!({"format": "SQL"}));
        assert!(run(&c, ANSWER).verdict);
        assert!(!run(&c, "no code at all").verdict);
        let c = parse(
            "default.containsCode",
            json!({"format": "python", "not": true}),
        );
        let out = run(&c, ANSWER);
        assert!(!out.verdict);
        assert_eq!(out.data["format"], "Python");
        assert!(
            c.run_partial("```py\nprint(1)\n").is_none(),
            "not closed yet"
        );
        assert!(c.run_partial(ANSWER).is_some());
    }

    #[test]
    fn unknown_formats_are_refused() {
        let (path, message) = issue("default.containsCode", json!({"format": "COBOL"}));
        assert_eq!(path, "format");
        assert!(message.contains("Dockerfile"), "{message}");
        assert_eq!(issue("default.containsCode", json!({})).0, "format");
    }
}
