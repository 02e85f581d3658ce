//! `banned-topics`: refuses requests and answers that mention any of a list of words or
//! phrases (whole words, any case), in their text or in the arguments of their tool calls.
//!
//! Config:
//! ```json
//! {"words": ["project falcon", "layoffs"]}
//! ```
//!
//! In a stream, the answer is refused as soon as a banned word is complete (followed by a
//! character that is not a letter or digit), or at the end of the stream.
//!
//! Counter: `denied`.

use gateway_guardrail::{
    counter_add, export_guardrail, Answer, ChatRequest, Guardrail, Stream, Verdict,
};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Words or phrases; each is matched as a sequence of whole words.
    words: Vec<String>,
}

#[derive(Default)]
struct BannedTopics {
    /// Each banned entry as lowercase words, with its text as configured.
    banned: Vec<(Vec<String>, String)>,
}

impl Guardrail for BannedTopics {
    fn init(&mut self, config: &str) -> Result<(), String> {
        let config: Config = serde_json::from_str(config).map_err(|e| e.to_string())?;
        for word in config.words {
            let tokens: Vec<String> = words(&word).map(|(_, w)| w).collect();
            if tokens.is_empty() {
                return Err(format!("words: {word:?} has no letters or digits"));
            }
            self.banned.push((tokens, word));
        }
        Ok(())
    }

    fn check_request(&self, request: &ChatRequest) -> Verdict {
        for m in &request.messages {
            let arguments = m.tool_calls.iter().map(|c| c.arguments.as_str());
            for text in std::iter::once(m.content.as_str()).chain(arguments) {
                if let Some(found) = self.find(text, false) {
                    return deny("the request", found);
                }
            }
        }
        Verdict::Allow
    }

    fn check_answer(&self, _request: &ChatRequest, answer: &Answer) -> Verdict {
        let arguments = answer.tool_calls.iter().map(|c| c.arguments.as_str());
        for text in std::iter::once(answer.text.as_str()).chain(arguments) {
            if let Some(found) = self.find(text, false) {
                return deny("the answer", found);
            }
        }
        Verdict::Allow
    }

    fn check_stream_tool_arguments(
        &self,
        stream: &mut Stream,
        index: usize,
        _delta: &str,
    ) -> Verdict {
        match self.find(&stream.tool_calls[index].arguments, true) {
            Some(found) => deny("the answer", found),
            None => Verdict::Allow,
        }
    }

    fn check_stream_delta(&self, stream: &mut Stream, _delta: &str) -> Verdict {
        match self.find(&stream.text, true) {
            Some(found) => deny("the answer", found),
            None => Verdict::Allow,
        }
    }

    fn check_stream_end(&self, stream: &mut Stream) -> Verdict {
        let answer = Answer {
            text: stream.text.clone(),
            tool_calls: stream.tool_calls.clone(),
        };
        self.check_answer(&stream.request, &answer)
    }
}

export_guardrail!(BannedTopics);

fn deny(what: &str, found: &str) -> Verdict {
    counter_add("denied", 1);
    Verdict::Deny(format!("{what} mentions a banned topic: {found}"))
}

impl BannedTopics {
    /// The first banned entry `text` contains. With `complete_only`, a word still running at
    /// the end of the text does not count yet (more of it may follow).
    fn find(&self, text: &str, complete_only: bool) -> Option<&str> {
        let mut tokens: Vec<String> = Vec::new();
        for (end, word) in words(text) {
            if complete_only && end == text.len() {
                break;
            }
            tokens.push(word);
        }
        self.banned
            .iter()
            .find(|(phrase, _)| tokens.windows(phrase.len()).any(|w| w == phrase.as_slice()))
            .map(|(_, word)| word.as_str())
    }
}

/// The lowercase words of a text (runs of letters and digits), each with where it ends.
fn words(text: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        while chars.peek().is_some_and(|(_, c)| !c.is_alphanumeric()) {
            chars.next();
        }
        let mut word = String::new();
        let mut end = 0;
        while let Some((i, c)) = chars.peek().copied() {
            if !c.is_alphanumeric() {
                break;
            }
            word.extend(c.to_lowercase());
            end = i + c.len_utf8();
            chars.next();
        }
        (!word.is_empty()).then_some((end, word))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_words_and_phrases_match() {
        let mut g = BannedTopics::default();
        g.init(r#"{"words": ["Project Falcon", "layoffs"]}"#)
            .unwrap();
        assert_eq!(
            g.find("about PROJECT   falcon!", false),
            Some("Project Falcon")
        );
        assert_eq!(g.find("no layoffsies here", false), None);
        assert_eq!(g.find("the layoffs", true), None);
        assert_eq!(g.find("the layoffs.", true), Some("layoffs"));
        assert!(g.init(r#"{"words": ["--"]}"#).is_err());
    }
}
