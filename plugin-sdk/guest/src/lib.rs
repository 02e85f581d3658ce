//! Write a guardrail for the gateway in Rust.
//!
//! Implement [`Guardrail`] for a type (every method has a default that allows), export it with
//! [`export_guardrail!`], and build the crate as a `cdylib` for `wasm32-wasip2`:
//!
//! ```ignore
//! use gateway_guardrail::{export_guardrail, ChatRequest, Guardrail, Verdict};
//!
//! #[derive(Default)]
//! struct NoShouting;
//!
//! impl Guardrail for NoShouting {
//!     fn check_request(&self, request: &ChatRequest) -> Verdict {
//!         let shouting = request.messages.iter().any(|m| {
//!             m.content.len() > 8 && !m.content.chars().any(|c| c.is_lowercase())
//!         });
//!         if shouting {
//!             Verdict::Deny("no shouting".into())
//!         } else {
//!             Verdict::Allow
//!         }
//!     }
//! }
//!
//! export_guardrail!(NoShouting);
//! ```
//!
//! The host makes a fresh instance for each check: [`Guardrail::init`] runs first with the
//! operator's config, then one check. A stream keeps its instance (and a [`Stream`]) until it
//! ends. A panic traps the instance; its message reaches the gateway's log.
//!
//! The world is `gateway:guardrail/guardrail-plugin@0.2.0`
//! (`plugin-sdk/wit/guardrail/v0.2.0/world.wit`): a request's messages come with their tool
//! calls and the API it came in by (chat completions or Anthropic's Messages), an answer with its
//! tool calls, and a stream with the pieces of its tool calls' arguments.

extern crate self as gateway_guardrail;

/// The bindings generated from the WIT world.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/guardrail/v0.2.0",
        world: "guardrail-plugin",
        pub_export_macro: true,
        export_macro_name: "__export_guardrail_world",
        default_bindings_module: "::gateway_guardrail::bindings",
        runtime_path: "::gateway_guardrail::__private::wit_bindgen::rt",
    });
}

use std::cell::RefCell;

pub use bindings::exports::gateway::guardrail::guardrail::{
    Answer, Api, ChatRequest, Message, ToolCall, Verdict,
};
pub use bindings::gateway::guardrail::host::Level;

/// A guardrail. Every check defaults to [`Verdict::Allow`].
///
/// - `check_request` may return `Deny` or `RewriteMessages` (every message of the request, in
///   order and with the same roles, with new content).
/// - `check_answer` (by default `check_response` on the answer's text) may return `Deny` or
///   `RewriteText` (the answer's new text).
/// - `check_stream_tool_arguments` may return `Deny` (arguments are not rewritten).
/// - `check_stream_delta` may return `Deny` or `RewriteText` (what to send instead of the
///   delta: an empty text holds it back); `check_stream_end` may return `Deny` or
///   `RewriteText` (text to send before the stream ends).
pub trait Guardrail: Default + 'static {
    /// Reads the operator's `config` (JSON text, `{}` when none is set). Called once per
    /// instance, before any check. An error refuses the config. Default: accept anything.
    fn init(&mut self, config: &str) -> Result<(), String> {
        let _ = config;
        Ok(())
    }

    /// Checks a request before it goes to the provider. Default: allow.
    fn check_request(&self, request: &ChatRequest) -> Verdict {
        let _ = request;
        Verdict::Allow
    }

    /// Checks the text of one choice of a complete answer. Default: allow.
    fn check_response(&self, request: &ChatRequest, text: &str) -> Verdict {
        let _ = (request, text);
        Verdict::Allow
    }

    /// Checks one choice of a complete answer, its tool calls included. Default:
    /// [`Guardrail::check_response`] on its text.
    fn check_answer(&self, request: &ChatRequest, answer: &Answer) -> Verdict {
        self.check_response(request, &answer.text)
    }

    /// Checks a piece of a streamed answer; `stream.text` already ends with `delta`.
    /// Default: allow.
    fn check_stream_delta(&self, stream: &mut Stream, delta: &str) -> Verdict {
        let _ = (stream, delta);
        Verdict::Allow
    }

    /// Checks a piece of a streamed tool call's arguments; `stream.tool_calls[index]` already
    /// ends with `delta`. Default: allow.
    fn check_stream_tool_arguments(
        &self,
        stream: &mut Stream,
        index: usize,
        delta: &str,
    ) -> Verdict {
        let _ = (stream, index, delta);
        Verdict::Allow
    }

    /// Called once when the stream ends. Default: [`Guardrail::check_answer`] on the whole
    /// answer, keeping only a `Deny` (the text has already been sent, so a rewrite cannot apply).
    fn check_stream_end(&self, stream: &mut Stream) -> Verdict {
        let answer = Answer {
            text: stream.text.clone(),
            tool_calls: stream.tool_calls.clone(),
        };
        match self.check_answer(&stream.request, &answer) {
            Verdict::Deny(reason) => Verdict::Deny(reason),
            _ => Verdict::Allow,
        }
    }
}

/// One choice of a streamed answer, as seen so far.
#[derive(Debug, Clone)]
pub struct Stream {
    /// The request that asked for the answer.
    pub request: ChatRequest,
    /// All the text pushed so far.
    pub text: String,
    /// The tool calls streamed so far, by their index: name and arguments as pushed (ids are
    /// not streamed: empty).
    pub tool_calls: Vec<ToolCall>,
    /// Free for the guardrail: how far into `text` it has dealt with (starts at 0).
    pub cursor: usize,
}

/// Writes a line to the gateway's log (tagged with the guardrail's id; cut at 1 KiB).
pub fn log(level: Level, message: &str) {
    bindings::gateway::guardrail::host::log(level, message);
}

/// Adds to a counter the gateway exports at `/metrics` (at most 32 names per guardrail).
pub fn counter_add(name: &str, delta: u64) {
    bindings::gateway::guardrail::host::counter_add(name, delta);
}

/// What [`export_guardrail!`] expands to; not for direct use.
#[doc(hidden)]
pub mod __private {
    use super::*;

    pub use crate::bindings::exports::gateway::guardrail::guardrail::{Guest, GuestStreamChecker};
    pub use wit_bindgen;

    thread_local! {
        static INSTANCE: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
    }

    /// Reports a panic's message through the log before the instance traps.
    fn report_panics() {
        std::panic::set_hook(Box::new(|info| {
            log(Level::Error, &format!("panic: {info}"));
        }));
    }

    pub fn init<G: Guardrail>(config: &str) -> Result<(), String> {
        report_panics();
        let mut guardrail = G::default();
        guardrail.init(config)?;
        INSTANCE.with(|i| *i.borrow_mut() = Some(Box::new(guardrail)));
        Ok(())
    }

    /// Runs `f` with the instance's guardrail (a default one if `init` was not called).
    pub fn with<G: Guardrail, R>(f: impl FnOnce(&G) -> R) -> R {
        INSTANCE.with(|i| {
            let mut slot = i.borrow_mut();
            if !slot.as_ref().is_some_and(|g| g.is::<G>()) {
                *slot = Some(Box::new(G::default()));
            }
            let guardrail = slot
                .as_ref()
                .and_then(|g| g.downcast_ref::<G>())
                .expect("the guardrail was just set");
            f(guardrail)
        })
    }

    /// The `stream-checker` resource of a guardrail type.
    pub struct Checker<G> {
        stream: RefCell<Stream>,
        _guardrail: std::marker::PhantomData<fn() -> G>,
    }

    impl<G: Guardrail> GuestStreamChecker for Checker<G> {
        fn new(request: ChatRequest) -> Self {
            Checker {
                stream: RefCell::new(Stream {
                    request,
                    text: String::new(),
                    tool_calls: Vec::new(),
                    cursor: 0,
                }),
                _guardrail: std::marker::PhantomData,
            }
        }

        fn push(&self, delta: String) -> Verdict {
            let mut stream = self.stream.borrow_mut();
            stream.text.push_str(&delta);
            with::<G, _>(|g| g.check_stream_delta(&mut stream, &delta))
        }

        fn push_tool_arguments(&self, index: u32, name: Option<String>, delta: String) -> Verdict {
            let mut stream = self.stream.borrow_mut();
            let index = index as usize;
            while stream.tool_calls.len() <= index {
                stream.tool_calls.push(ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
            }
            if let Some(name) = name {
                stream.tool_calls[index].name = name;
            }
            stream.tool_calls[index].arguments.push_str(&delta);
            with::<G, _>(|g| g.check_stream_tool_arguments(&mut stream, index, &delta))
        }

        fn finish(&self) -> Verdict {
            let mut stream = self.stream.borrow_mut();
            with::<G, _>(|g| g.check_stream_end(&mut stream))
        }
    }
}

/// Exports a [`Guardrail`] type as the component's implementation of the world. Use once, at
/// the crate's root.
#[macro_export]
macro_rules! export_guardrail {
    ($guardrail:ty) => {
        #[doc(hidden)]
        struct __GatewayGuardrailExport;

        impl $crate::__private::Guest for __GatewayGuardrailExport {
            type StreamChecker = $crate::__private::Checker<$guardrail>;

            fn init(config: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                $crate::__private::init::<$guardrail>(&config)
            }

            fn check_request(request: $crate::ChatRequest) -> $crate::Verdict {
                $crate::__private::with::<$guardrail, _>(|g| {
                    $crate::Guardrail::check_request(g, &request)
                })
            }

            fn check_response(
                request: $crate::ChatRequest,
                response: $crate::Answer,
            ) -> $crate::Verdict {
                $crate::__private::with::<$guardrail, _>(|g| {
                    $crate::Guardrail::check_answer(g, &request, &response)
                })
            }
        }

        $crate::bindings::__export_guardrail_world!(__GatewayGuardrailExport with_types_in $crate::bindings);
    };
}
